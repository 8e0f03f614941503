"""Layers across members and the object store: copies, fetches, uploads, durability.

A member lacks the layers of an env placed on it whenever placement could not find one that
holds them all; copying them from a live member (digest checked) is fastest, the store is the
fallback, and a layer in neither fails the boot with its name. Uploads run in the background
so a snapshot returns before its layers are stored; ``layer_storage`` says when a version is
safe from the loss of its node (``durable``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from concurrent.futures import Future

from denv.server.config import ObjectStoreConfig
from denv.server.node.seam import BootFailed, LayerOffer, NodeLost
from denv.server.volumes.object_store import LayerStore
from denv.server.volumes.overlay import EMPTY_LAYER

from .membership import Members
from .placement import Placement
from .uploads import Uploads

log = logging.getLogger(__name__)


class Layers:
    """Which layers each member holds (the members' map), moving them and storing them;
    the seam's layer calls that are about layers, not about one env."""

    def __init__(
        self,
        members: Members,
        placement: Placement,
        store: ObjectStoreConfig | None,
        uploads: Uploads,
    ) -> None:
        self._members = members
        self._placement = placement
        self._uploads = uploads
        self._store_cfg = store
        self._store = LayerStore(store) if store is not None else None
        self._fresh: set[str] = set()  # layers seen made here (their holders all known)
        self._moving: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
        self._stored: dict[str, str] = {}  # layer -> digest in object storage
        self._uploading: dict[str, Future[None]] = {}

    def made(self, name: str, layers: Iterable[str]) -> None:
        """New layers made on member ``name`` (a snapshot, a seed): held there only."""
        made = [x for x in layers if x and x != EMPTY_LAYER]
        with self._members.lock:
            self._fresh.update(made)
        self.remember(name, made)
        self._upload_soon(name, made)

    def remember(self, name: str, layers: Iterable[str]) -> None:
        with self._members.lock:
            for x in layers:
                if x and x != EMPTY_LAYER:
                    self._members.layers[x].add(name)

    def ensure(self, name: str, layers: Iterable[str]) -> None:
        """Every layer on member ``name``: from a live member holding it, else from the
        store; BootFailed naming the layer when neither has it."""
        for layer in dict.fromkeys(x for x in layers if x and x != EMPTY_LAYER):
            with self._members.lock:
                if name in self._members.layers.get(layer, ()):
                    continue
                moving = self._moving[(name, layer)]
            with moving:  # spares of one fork on one member: one copy, the others wait for it
                with self._members.lock:
                    if name in self._members.layers.get(layer, ()):
                        continue
                # A layer this process saw made is known to be only where it was made: no
                # round trip to ask the member first (write_layer is a no-op if it has it).
                fresh = layer in self._fresh
                if fresh or not self._members.call(name, lambda n, x=layer: n.has_layer(x)):  # type: ignore[misc]
                    self._fetch(name, layer)
                self.remember(name, [layer])

    def _fetch(self, name: str, layer: str) -> None:
        started = time.monotonic()
        for origin in self._holders(layer, exclude=name):
            try:
                # The member takes it from the origin itself, as a stream (node to node:
                # the control plane never holds the layer's bytes).
                size = self._members.call(name, lambda n, o=origin: n.copy_layer(layer, o))  # type: ignore[misc]
            except NodeLost as exc:
                if exc.node != origin:
                    raise  # the member itself is lost
                log.warning("cluster: copying layer %s from %s failed: %s", layer, origin, exc)
                continue
            log.info(
                "cluster: layer %s copied from %s to %s (%d bytes, %.0f ms)",
                layer,
                origin,
                name,
                size,
                (time.monotonic() - started) * 1000,
            )
            return
        stored = self._stored_digest(layer)
        if stored is not None and self._store_cfg is not None:
            cfg = self._store_cfg
            self._members.call(name, lambda n: n.fetch_layer(layer, stored, cfg))
            log.info(
                "cluster: layer %s fetched from object storage to %s (%.0f ms)",
                layer,
                name,
                (time.monotonic() - started) * 1000,
            )
            return
        raise BootFailed(
            "start_failed",
            f"layer {layer} of this version is on no live node and not in object storage "
            "(its node was lost before the upload finished); fork a durable version instead",
        )

    def _holders(self, layer: str, exclude: str) -> list[str]:
        with self._members.lock:
            known = [
                n
                for n in self._members.layers.get(layer, ())
                if n != exclude and n not in self._members.dead
            ]
        if known:
            return known
        found = []
        for n in self._members.live():
            if n == exclude:
                continue
            try:
                if self._members.call(n, lambda m: m.has_layer(layer)):
                    found.append(n)
            except NodeLost:
                continue
        with self._members.lock:
            self._members.layers[layer].update(found)
        return found

    def _stored_digest(self, layer: str) -> str | None:
        with self._members.lock:
            if layer in self._stored:
                return self._stored[layer]
        if self._store is None:
            return None
        digest = self._store.digest_of(layer)
        if digest is not None:
            with self._members.lock:
                self._stored[layer] = digest
        return digest

    def _upload_soon(self, name: str, layers: Iterable[str]) -> None:
        if self._store_cfg is None:
            return
        cfg = self._store_cfg
        for layer in layers:
            if not layer or layer == EMPTY_LAYER:
                continue
            with self._members.lock:
                if layer in self._stored or layer in self._uploading or self._uploads.stopped:
                    continue
                self._uploading[layer] = self._uploads.submit(self._upload, name, layer, cfg)

    def _upload(self, name: str, layer: str, cfg: ObjectStoreConfig) -> None:
        started = time.monotonic()
        try:
            digest = self._members.call(name, lambda n: n.upload_layer(layer, cfg))
        except Exception as exc:
            log.warning("cluster: uploading layer %s from %s failed: %s", layer, name, exc)
            with self._members.lock:
                self._uploading.pop(layer, None)
            return
        with self._members.lock:
            self._stored[layer] = digest
            self._uploading.pop(layer, None)
        log.info(
            "cluster: layer %s stored (%s, %.0f ms)",
            layer,
            digest[:19],
            (time.monotonic() - started) * 1000,
        )

    def layer_nodes(self, layer_ids: list[str]) -> list[str]:
        wanted = [x for x in layer_ids if x and x != EMPTY_LAYER]
        loads = self._members.loads()
        with self._members.lock:
            near = [n for n in loads if all(n in self._members.layers.get(x, ()) for x in wanted)]
        return sorted(near, key=lambda n: (loads[n].envs, loads[n].memory, n))

    def layer_storage(self, layer_ids: list[str]) -> str:
        layers = [x for x in layer_ids if x and x != EMPTY_LAYER]
        if self._store is None:
            on_live = all(self._holders(x, exclude="") for x in layers)
            return "node" if on_live else "lost"
        missing = [x for x in layers if self._stored_digest(x) is None]
        if not missing:
            return "durable"
        if any(not self._holders(x, exclude="") for x in missing):
            return "lost"
        self._resume_uploads(missing)
        return "uploading"

    def _resume_uploads(self, layers: list[str]) -> None:
        """Layers neither stored nor uploading (a restarted control plane): upload them."""
        for layer in layers:
            with self._members.lock:
                if layer in self._uploading:
                    continue
            holders = self._holders(layer, exclude="")
            if holders:
                self._upload_soon(holders[0], [layer])

    # the seam: layers (a snapshot and a seed are the cluster node's: they concern an env,
    # an image)
    def has_layer(self, layer_id: str) -> bool:
        return (
            bool(self._holders(layer_id, exclude="")) or self._stored_digest(layer_id) is not None
        )

    def layer_ids(self) -> set[str]:
        out: set[str] = set()
        for name in self._members.live():
            try:
                ids = self._members.call(name, lambda n: n.layer_ids())
            except NodeLost:
                continue
            self.remember(name, ids)
            out |= ids
        return out

    def layer_sizes(self, layer_ids: list[str]) -> list[int]:
        """Each layer's size on the first live node holding it (0: only in storage)."""
        out = []
        for layer in layer_ids:
            size = 0
            for name in self._holders(layer, exclude=""):
                try:
                    size = self._members.call(name, lambda n: n.layer_sizes([layer]))[0]  # noqa: B023
                    break
                except NodeLost:
                    continue
            out.append(size)
        return out

    def free_disk_bytes(self) -> int:
        free = []
        for name in self._members.live():
            try:
                free.append(self._members.call(name, lambda n: n.free_disk_bytes()))
            except NodeLost:
                continue
        return min(free, default=0)

    def delete_layers(self, layer_ids: list[str]) -> None:
        for name in self._members.live():
            try:
                self._members.call(name, lambda n: n.delete_layers(layer_ids))
            except NodeLost:
                continue
        if self._store is not None and layer_ids:
            try:
                self._store.delete(layer_ids)
            except Exception:
                log.exception(
                    "cluster: deleting %d layer(s) from object storage failed", len(layer_ids)
                )
        with self._members.lock:
            for x in layer_ids:
                self._members.layers.pop(x, None)
                self._stored.pop(x, None)
                self._fresh.discard(x)
            gone = set(layer_ids)
            for key in [k for k in self._moving if k[1] in gone]:
                del self._moving[key]

    # Node: layer transfer (a cluster's members move layers; the cluster as a whole does
    # this for a caller holding the layer's id: ``denv export`` on a cluster, tests)
    def _holder(self, layer_id: str) -> str:
        holders = self._holders(layer_id, exclude="")
        if not holders:
            raise BootFailed("start_failed", f"layer {layer_id} is on no live node")
        return holders[0]

    def layer_digest(self, layer_id: str) -> str:
        return self._members.call(self._holder(layer_id), lambda n: n.layer_digest(layer_id))

    def offer_layer(self, layer_id: str) -> LayerOffer:
        return self._members.call(self._holder(layer_id), lambda n: n.offer_layer(layer_id))

    def copy_layer(self, layer_id: str, origin: str) -> int:
        name = self._placement.least_loaded(self._members)
        size = self._members.call(name, lambda n: n.copy_layer(layer_id, origin))
        self.remember(name, [layer_id])
        return size

    def upload_layer(self, layer_id: str, store: ObjectStoreConfig) -> str:
        return self._members.call(self._holder(layer_id), lambda n: n.upload_layer(layer_id, store))

    def fetch_layer(self, layer_id: str, digest: str, store: ObjectStoreConfig) -> None:
        name = self._placement.least_loaded(self._members)
        self._members.call(name, lambda n: n.fetch_layer(layer_id, digest, store))
        self.remember(name, [layer_id])

    def drop_partial_layers(self) -> None:
        for name in self._members.live():
            try:
                self._members.call(name, lambda n: n.drop_partial_layers())
            except NodeLost:
                continue

    def diff_layers(
        self, base: list[str], layers: list[str], limit: int
    ) -> tuple[list[tuple[str, str, int]], bool]:
        wanted = [x for x in base + layers if x and x != EMPTY_LAYER]
        with self._members.lock:
            members = [n for n in self._members.nodes if n not in self._members.dead]
            best = max(
                members,
                key=lambda n: sum(1 for x in wanted if n in self._members.layers.get(x, ())),
                default=None,
            )
        if best is None:
            raise NodeLost("(none)")
        self.ensure(best, wanted)
        return self._members.call(best, lambda n: n.diff_layers(base, layers, limit))
