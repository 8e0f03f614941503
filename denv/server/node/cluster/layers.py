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
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor

from denv.server.config import StoreConfig
from denv.server.node.seam import BootFailed, LayerOffer, Node, NodeLost
from denv.server.volumes.object_store import LayerStore
from denv.server.volumes.overlay import EMPTY_LAYER

from .placement import NodeCaps, Placement

log = logging.getLogger(__name__)

UPLOAD_WORKERS = 4


class Layers(Placement):
    """Placement plus which layers each member holds, moving them and storing them."""

    def __init__(
        self,
        members: Callable[[], Mapping[str, Node]],
        caps: NodeCaps | None = None,
        store: StoreConfig | None = None,
    ) -> None:
        super().__init__(members, caps)
        self._store_cfg = store
        self._store = LayerStore(store) if store is not None else None
        self._fresh: set[str] = set()  # layers seen made here (their holders all known)
        self._moving: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
        self._stored: dict[str, str] = {}  # layer -> digest in object storage
        self._uploads: dict[str, Future[None]] = {}
        self._pool = ThreadPoolExecutor(UPLOAD_WORKERS, thread_name_prefix="denv-upload")
        self._stopped = False  # set by stop(): no upload starts after it

    def _made(self, name: str, layers: Iterable[str]) -> None:
        """New layers made on member ``name`` (a snapshot, a seed): held there only."""
        made = [x for x in layers if x and x != EMPTY_LAYER]
        with self._lock:
            self._fresh.update(made)
        self._remember_layers(name, made)
        self._upload_soon(name, made)

    def _remember_layers(self, name: str, layers: Iterable[str]) -> None:
        with self._lock:
            for x in layers:
                if x and x != EMPTY_LAYER:
                    self._layers[x].add(name)

    def _ensure_layers(self, name: str, layers: Iterable[str]) -> None:
        """Every layer on member ``name``: from a live member holding it, else from the
        store; BootFailed naming the layer when neither has it."""
        for layer in dict.fromkeys(x for x in layers if x and x != EMPTY_LAYER):
            with self._lock:
                if name in self._layers.get(layer, ()):
                    continue
                moving = self._moving[(name, layer)]
            with moving:  # spares of one fork on one member: one copy, the others wait for it
                with self._lock:
                    if name in self._layers.get(layer, ()):
                        continue
                # A layer this process saw made is known to be only where it was made: no
                # round trip to ask the member first (write_layer is a no-op if it has it).
                fresh = layer in self._fresh
                if fresh or not self._call(name, lambda n, x=layer: n.has_layer(x)):  # type: ignore[misc]
                    self._fetch(name, layer)
                self._remember_layers(name, [layer])

    def _fetch(self, name: str, layer: str) -> None:
        started = time.monotonic()
        for origin in self._holders(layer, exclude=name):
            try:
                # The member takes it from the origin itself, as a stream (node to node:
                # the control plane never holds the layer's bytes).
                size = self._call(name, lambda n, o=origin: n.copy_layer(layer, o))  # type: ignore[misc]
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
            self._call(name, lambda n: n.fetch_layer(layer, stored, cfg))
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
        with self._lock:
            known = [n for n in self._layers.get(layer, ()) if n != exclude and n not in self._dead]
        if known:
            return known
        found = []
        for n in self.live_members():
            if n == exclude:
                continue
            try:
                if self._call(n, lambda m: m.has_layer(layer)):
                    found.append(n)
            except NodeLost:
                continue
        with self._lock:
            self._layers[layer].update(found)
        return found

    def _stored_digest(self, layer: str) -> str | None:
        with self._lock:
            if layer in self._stored:
                return self._stored[layer]
        if self._store is None:
            return None
        digest = self._store.digest_of(layer)
        if digest is not None:
            with self._lock:
                self._stored[layer] = digest
        return digest

    def _upload_soon(self, name: str, layers: Iterable[str]) -> None:
        if self._store_cfg is None:
            return
        cfg = self._store_cfg
        for layer in layers:
            if not layer or layer == EMPTY_LAYER:
                continue
            with self._lock:
                if layer in self._stored or layer in self._uploads or self._stopped:
                    continue
                self._uploads[layer] = self._pool.submit(self._upload, name, layer, cfg)

    def _upload(self, name: str, layer: str, cfg: StoreConfig) -> None:
        started = time.monotonic()
        try:
            digest = self._call(name, lambda n: n.upload_layer(layer, cfg))
        except Exception as exc:
            log.warning("cluster: uploading layer %s from %s failed: %s", layer, name, exc)
            with self._lock:
                self._uploads.pop(layer, None)
            return
        with self._lock:
            self._stored[layer] = digest
            self._uploads.pop(layer, None)
        log.info(
            "cluster: layer %s stored (%s, %.0f ms)",
            layer,
            digest[:19],
            (time.monotonic() - started) * 1000,
        )

    def layer_nodes(self, layer_ids: list[str]) -> list[str]:
        wanted = [x for x in layer_ids if x and x != EMPTY_LAYER]
        loads = self._load()
        with self._lock:
            near = [n for n in loads if all(n in self._layers.get(x, ()) for x in wanted)]
        return sorted(near, key=lambda n: (loads[n][0], loads[n][1], n))

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
            with self._lock:
                if layer in self._uploads:
                    continue
            holders = self._holders(layer, exclude="")
            if holders:
                self._upload_soon(holders[0], [layer])

    # Node: layers
    def seed_layer(self, image_id: str, path: str) -> str | None:
        name = self._least_loaded()
        layer = self._call(name, lambda n: n.seed_layer(image_id, path))
        if layer:
            self._made(name, [layer])
        return layer

    def has_layer(self, layer_id: str) -> bool:
        return (
            bool(self._holders(layer_id, exclude="")) or self._stored_digest(layer_id) is not None
        )

    def layer_ids(self) -> set[str]:
        out: set[str] = set()
        for name in self.live_members():
            try:
                ids = self._call(name, lambda n: n.layer_ids())
            except NodeLost:
                continue
            self._remember_layers(name, ids)
            out |= ids
        return out

    def layer_sizes(self, layer_ids: list[str]) -> list[int]:
        """Each layer's size on the first live node holding it (0: only in storage)."""
        out = []
        for layer in layer_ids:
            size = 0
            for name in self._holders(layer, exclude=""):
                try:
                    size = self._call(name, lambda n: n.layer_sizes([layer]))[0]  # noqa: B023
                    break
                except NodeLost:
                    continue
            out.append(size)
        return out

    def free_disk_bytes(self) -> int:
        free = []
        for name in self.live_members():
            try:
                free.append(self._call(name, lambda n: n.free_disk_bytes()))
            except NodeLost:
                continue
        return min(free, default=0)

    def delete_layers(self, layer_ids: list[str]) -> None:
        for name in self.live_members():
            try:
                self._call(name, lambda n: n.delete_layers(layer_ids))
            except NodeLost:
                continue
        if self._store is not None and layer_ids:
            try:
                self._store.delete(layer_ids)
            except Exception:
                log.exception(
                    "cluster: deleting %d layer(s) from object storage failed", len(layer_ids)
                )
        with self._lock:
            for x in layer_ids:
                self._layers.pop(x, None)
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
        return self._call(self._holder(layer_id), lambda n: n.layer_digest(layer_id))

    def offer_layer(self, layer_id: str) -> LayerOffer:
        return self._call(self._holder(layer_id), lambda n: n.offer_layer(layer_id))

    def copy_layer(self, layer_id: str, origin: str) -> int:
        name = self._least_loaded()
        size = self._call(name, lambda n: n.copy_layer(layer_id, origin))
        self._remember_layers(name, [layer_id])
        return size

    def upload_layer(self, layer_id: str, store: StoreConfig) -> str:
        return self._call(self._holder(layer_id), lambda n: n.upload_layer(layer_id, store))

    def fetch_layer(self, layer_id: str, digest: str, store: StoreConfig) -> None:
        name = self._least_loaded()
        self._call(name, lambda n: n.fetch_layer(layer_id, digest, store))
        self._remember_layers(name, [layer_id])

    def drop_partial_layers(self) -> None:
        for name in self.live_members():
            try:
                self._call(name, lambda n: n.drop_partial_layers())
            except NodeLost:
                continue

    def diff_layers(
        self, base: list[str], layers: list[str], limit: int
    ) -> tuple[list[tuple[str, str, int]], bool]:
        wanted = [x for x in base + layers if x and x != EMPTY_LAYER]
        with self._lock:
            members = [n for n in self._members if n not in self._dead]
            best = max(
                members,
                key=lambda n: sum(1 for x in wanted if n in self._layers.get(x, ())),
                default=None,
            )
        if best is None:
            raise NodeLost("(none)")
        self._ensure_layers(best, wanted)
        return self._call(best, lambda n: n.diff_layers(base, layers, limit))
