"""Many nodes behind the one ``Node`` seam: placement, routing, layer movement, durability.

``denv serve --cluster`` gives the server's lifecycle code a ``ClusterNode`` where one machine
gives it a ``DockerNode``; nothing above the seam knows the difference. The members are
``Node`` objects by name: on a Ray cluster each is a ``RemoteNode`` talking to the node agent
pinned to its machine (``denv.cluster``); in tests they may be ``DockerNode`` objects, each
with a state dir and instance label of its own, on this machine's engine.

What it adds to the nodes it holds:

* Placement. An env without layers goes to the member with the fewest envs (then the least
  memory in use) that has room; an env whose version has layers goes first to a member that
  already holds them all, then to the least loaded one, which fetches them before the env's
  volumes are mounted. ``room()`` is what the members still accept, under each member's cap
  (``NodeCaps``): the server refuses a create past it with 429.
* Routing. Every call about an env goes to the member it was placed on (``_env``); calls
  about a live process go to its group's member; calls about everything (``owned``,
  ``states``, ``layer_ids``) merge every live member's answer.
* Layers. A member that lacks a layer gets it from a live member that has it (its packed
  bytes, digest checked on arrival), else from object storage (digest checked); a layer that
  is in neither fails the boot (``start_failed``, naming the layer). Each new layer (a
  snapshot's, a seed) is uploaded in the background when there is a store; a version is
  ``durable`` once all its layers are stored.
* Loss. A member that the membership callback no longer lists is lost (a ``NodeLost`` from
  a member asks the callback at once; a member still listed had a passing failure): its
  envs are reported by ``lost()`` (the reaper fails them with code ``lost`` and the node's
  name), calls for them stop going out, and a version whose layers only it held is
  ``lost``. When a member of that name comes back, whatever it still holds that no live env
  owns is removed before it takes new envs.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from denv.server.config import StoreConfig
from denv.server.errors import ApiError
from denv.server.node.seam import Booted, BootFailed, BootSpec, Cancelled, Node, NodeLost, Owned
from denv.server.records import LiveProc, VolumeSlot
from denv.server.volumes.object_store import LayerStore
from denv.server.volumes.overlay import EMPTY_LAYER

log = logging.getLogger(__name__)

T = TypeVar("T")
UPLOAD_WORKERS = 4
MEMBERS_REFRESH_S = 2.0  # how often the membership callback is asked (node joins and deaths)


@dataclass(frozen=True)
class NodeCaps:
    """What one member accepts: envs at once and memory its envs use (0: no cap)."""

    max_envs: int = 0
    max_memory_mb: int = 0


class ClusterNode:
    """A ``Node`` made of members; thread-safe."""

    def __init__(
        self,
        members: Callable[[], Mapping[str, Node]],
        store: StoreConfig | None = None,
        caps: NodeCaps | None = None,
    ) -> None:
        self._members_fn = members
        self._store_cfg = store
        self._store = LayerStore(store) if store is not None else None
        self._caps = caps or NodeCaps()
        self._lock = threading.RLock()
        self._members: dict[str, Node] = {}
        self._members_at = 0.0
        self._dead: dict[str, str] = {}  # member name -> why it was found dead
        self._env: dict[str, str] = {}  # env id -> member
        self._cid: dict[str, str] = {}  # container id -> member
        self._net: dict[str, str] = {}  # network name -> member
        self._layers: defaultdict[str, set[str]] = defaultdict(set)  # layer -> members
        self._memory: dict[str, int] = {}  # member -> bytes its envs used, last measured
        self._booting: set[str] = set()
        self._fresh: set[str] = set()  # layers seen made here (their holders all known)
        self._moving: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
        self._cancelled: set[str] = set()
        self._lost_envs: dict[str, str] = {}  # env id -> reason, until lost() hands it out
        self._stored: dict[str, str] = {}  # layer -> digest in object storage
        self._uploads: dict[str, Future[None]] = {}
        self._pool = ThreadPoolExecutor(UPLOAD_WORKERS, thread_name_prefix="denv-upload")
        self._stopped = False
        self._refresh(force=True)

    # membership
    def _refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            if not force and now - self._members_at < MEMBERS_REFRESH_S:
                return
            self._members_at = now
        try:
            found = dict(self._members_fn())
        except Exception:
            log.exception("cluster: listing the nodes failed; keeping the last list")
            return
        returned = []
        with self._lock:
            for name in list(self._members):
                if name not in found and name not in self._dead:
                    self._mark_dead(name, f"node {name} left the cluster")
            for name, node in found.items():
                self._members[name] = node
                if name in self._dead:
                    self._dead.pop(name)
                    returned.append(name)
                    log.info("cluster: node %s is back", name)
        for name in returned:
            self._clean_returned(name)

    def _mark_dead(self, name: str, why: str) -> None:
        with self._lock:
            if name in self._dead:
                return
            self._dead[name] = why
            gone = [e for e, m in self._env.items() if m == name]
            for env_id in gone:
                self._lost_envs[env_id] = why
            for holders in self._layers.values():
                holders.discard(name)
            log.warning("cluster: %s; %d env(s) on it are lost", why, len(gone))

    def _clean_returned(self, name: str) -> None:
        """A member back from the dead keeps nothing of the envs it had (they were failed)."""
        node = self._members.get(name)
        if node is None:
            return
        try:
            owned = node.owned()
        except (NodeLost, Exception):
            return
        with self._lock:
            mine = {e for e, m in self._env.items() if m == name}
        stale = Owned(
            containers={c: e for c, e in owned.containers.items() if e not in mine},
            networks={n: e for n, e in owned.networks.items() if e not in mine},
            volume_envs=[e for e in owned.volume_envs if e not in mine],
        )
        if stale.containers or stale.networks or stale.volume_envs:
            log.info("cluster: removing what node %s kept from before it was lost", name)
            try:
                node.remove_owned(stale)
            except Exception:
                log.exception("cluster: cleaning node %s failed", name)

    def live_members(self) -> dict[str, Node]:
        self._refresh()
        with self._lock:
            return {n: m for n, m in self._members.items() if n not in self._dead}

    def member_of(self, env_id: str) -> str | None:
        with self._lock:
            return self._env.get(env_id)

    def _call(self, name: str, fn: Callable[[Node], T]) -> T:
        with self._lock:
            node = self._members.get(name)
            dead = self._dead.get(name)
        if node is None or dead is not None:
            raise NodeLost(name)
        try:
            return fn(node)
        except NodeLost:
            # The membership decides: a member still listed had a passing failure (its
            # agent restarting); one no longer listed is dead, and its envs are lost.
            self._refresh(force=True)
            raise

    def _env_member(self, env_id: str) -> str | None:
        with self._lock:
            return self._env.get(env_id)

    # placement
    def _load(self) -> dict[str, tuple[int, int]]:
        """Member -> (envs placed there, bytes its envs use) of the live members."""
        with self._lock:
            envs = Counter(self._env.values())
            return {
                n: (envs[n], self._memory.get(n, 0)) for n in self._members if n not in self._dead
            }

    def _has_room(self, name: str, load: tuple[int, int]) -> bool:
        envs, memory = load
        caps = self._caps
        if caps.max_envs and envs >= caps.max_envs:
            return False
        return not (caps.max_memory_mb and memory >= caps.max_memory_mb * 2**20)

    def room(self) -> int | None:
        self._refresh()
        if not self._caps.max_envs and not self._caps.max_memory_mb:
            return None if self._load() else 0
        total = 0
        for name, load in self._load().items():
            if not self._has_room(name, load):
                continue
            total += (self._caps.max_envs - load[0]) if self._caps.max_envs else 1 << 20
        return total

    def _least_loaded(self) -> str:
        """The live member with the fewest envs (a seed, a layer handed to the cluster)."""
        loads = self._load()
        if not loads:
            raise NodeLost("(none)", "the cluster has no live node")
        return min(loads, key=lambda n: (loads[n][0], n))

    def _place(self, spec: BootSpec) -> str:
        self._refresh()
        loads = {n: ld for n, ld in self._load().items() if self._has_room(n, ld)}
        if not loads:
            raise BootFailed(
                "start_failed",
                "no node of the cluster has room for another env "
                f"(caps per node: {self._caps.max_envs or 'no'} envs, "
                f"{self._caps.max_memory_mb or 'no'} MiB); delete envs or add nodes",
            )
        wanted = {x for v in spec.volumes for x in v.layers if x != EMPTY_LAYER}
        with self._lock:
            held = {n: sum(1 for x in wanted if n in self._layers.get(x, ())) for n in loads}
        # the most of the version's layers first, then the fewest envs, then the least memory
        return min(loads, key=lambda n: (-held[n], loads[n][0], loads[n][1], n))

    # layers
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
                digest, data = self._call(origin, lambda n: n.read_layer(layer))
            except NodeLost:
                continue
            self._call(name, lambda n, d=digest, b=data: n.write_layer(layer, d, b))  # type: ignore[misc]
            log.info(
                "cluster: layer %s copied from %s to %s (%d bytes, %.0f ms)",
                layer,
                origin,
                name,
                len(data),
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

    def wait_uploads(self, timeout_s: float) -> bool:
        """Until every upload in flight ended (tests, shutdown); whether they all did."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                pending = list(self._uploads.values())
            if not pending:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with contextlib.suppress(Exception):
                pending[0].result(timeout=left)

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

    # Node: images and layers
    def _first(self, fn: Callable[[Node], T]) -> T:
        last: Exception | None = None
        for name in self.live_members():
            try:
                return self._call(name, fn)
            except NodeLost as exc:
                last = exc
        raise ApiError(
            503,
            "engine_unavailable",
            "no node of the cluster answers"
            + (f" (last: {last})" if last else "")
            + ": check `denv cluster status` and the Ray cluster",
        )

    def engine_version(self) -> str:
        return self._first(lambda n: n.engine_version())

    def resolve_image(self, image: str, pull: bool) -> str:
        return self._first(lambda n: n.resolve_image(image, pull))

    def image_labels(self, image_id: str) -> dict[str, str]:
        return self._first(lambda n: n.image_labels(image_id))

    def image_command(self, image_id: str) -> list[str]:
        return self._first(lambda n: n.image_command(image_id))

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

    def read_layer(self, layer_id: str) -> tuple[str, bytes]:
        return self._call(self._holder(layer_id), lambda n: n.read_layer(layer_id))

    def write_layer(self, layer_id: str, digest: str, data: bytes) -> None:
        name = self._least_loaded()
        self._call(name, lambda n: n.write_layer(layer_id, digest, data))
        self._remember_layers(name, [layer_id])

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

    # Node: one env
    def bring_up(self, spec: BootSpec) -> Booted:
        with self._lock:
            if self._stopped or spec.env_id in self._cancelled:
                raise Cancelled()
        name = self._place(spec)
        with self._lock:
            self._env[spec.env_id] = name
            self._booting.add(spec.env_id)
        try:
            if not spec.late_mount:
                self._ensure_layers(name, [x for v in spec.volumes for x in v.layers])
            booted = self._call(name, lambda n: n.bring_up(spec))
        except NodeLost as exc:
            raise BootFailed("lost", f"{exc} (while the env started)") from exc
        finally:
            with self._lock:
                self._booting.discard(spec.env_id)
        with self._lock:
            for cid in booted.containers.values():
                self._cid[cid] = name
            self._net[booted.network] = name
        return booted.model_copy(update={"node": name})

    def _routed(self, env_id: str, fn: Callable[[Node], T]) -> T:
        name = self._env_member(env_id)
        if name is None:
            raise NodeLost("(none)", f"no node holds {env_id}")
        return self._call(name, fn)

    def wait_healthy(self, spec: BootSpec, booted: Booted, timeout_s: float) -> None:
        try:
            self._routed(spec.env_id, lambda n: n.wait_healthy(spec, booted, timeout_s))
        except NodeLost as exc:
            raise BootFailed("lost", f"{exc} (while the env started)") from exc

    def mount_volumes(self, env_id: str, volumes: list[VolumeSlot]) -> None:
        name = self._env_member(env_id)
        if name is None:
            raise NodeLost("(none)", f"no node holds {env_id}")
        self._ensure_layers(name, [x for v in volumes for x in v.layers])
        self._call(name, lambda n: n.mount_volumes(env_id, volumes))

    def prioritize(self, env_id: str, containers: list[str]) -> None:
        self._routed(env_id, lambda n: n.prioritize(env_id, containers))

    def snapshot(
        self, env_id: str, containers: list[str], volumes: list[VolumeSlot]
    ) -> list[list[str]]:
        name = self._env_member(env_id)
        if name is None:
            raise NodeLost("(none)", f"no node holds {env_id}")
        stacks = self._call(name, lambda n: n.snapshot(env_id, containers, volumes))
        self._made(name, _new_layers(stacks, volumes))
        return stacks

    def changed_bytes(self, env_id: str, volumes: list[VolumeSlot], stop_after: int) -> list[int]:
        return self._routed(env_id, lambda n: n.changed_bytes(env_id, volumes, stop_after))

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

    def cancel(self, env_id: str) -> None:
        with self._lock:
            self._cancelled.add(env_id)
            name = self._env.get(env_id)
        if name is not None:
            with contextlib.suppress(NodeLost):
                self._call(name, lambda n: n.cancel(env_id))

    def teardown(self, env_id: str, containers: list[str]) -> None:
        name = self._env_member(env_id)
        if name is not None:
            try:
                self._call(name, lambda n: n.teardown(env_id, containers))
            except NodeLost:
                log.info("cluster: env %s's node %s is lost; nothing to tear down", env_id, name)
        self._forget(env_id, containers)

    def _forget(self, env_id: str, containers: list[str]) -> None:
        with self._lock:
            self._env.pop(env_id, None)
            self._cancelled.discard(env_id)
            self._lost_envs.pop(env_id, None)
            for cid in containers:
                self._cid.pop(cid, None)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            booting = [(e, self._env.get(e)) for e in self._booting]
        for env_id, name in booting:
            if name is not None:
                with contextlib.suppress(NodeLost):
                    self._call(name, lambda n, e=env_id: n.cancel(e))  # type: ignore[misc]
        self._pool.shutdown(wait=False, cancel_futures=True)

    # Node: what runs
    def states(self, env_id: str | None = None) -> dict[str, str]:
        if env_id is not None:
            try:
                return self._routed(env_id, lambda n: n.states(env_id))
            except NodeLost:
                return {}
        out: dict[str, str] = {}
        for name in self.live_members():
            try:
                found = self._call(name, lambda n: n.states())
            except NodeLost:
                continue
            with self._lock:
                for cid in found:
                    self._cid.setdefault(cid, name)
            out.update(found)
        self._measure_memory()
        return out

    def _measure_memory(self) -> None:
        with self._lock:
            by_member: defaultdict[str, list[str]] = defaultdict(list)
            for cid, name in self._cid.items():
                by_member[name].append(cid)
        for name, cids in by_member.items():
            try:
                used = self._call(name, lambda n, c=cids: n.memory_bytes(c))  # type: ignore[misc]
            except Exception:
                continue
            with self._lock:
                self._memory[name] = used

    def logs(self, env_id: str, service: str, tail: int) -> list[str]:
        try:
            return self._routed(env_id, lambda n: n.logs(env_id, service, tail))
        except NodeLost as exc:
            return [f"({exc}: no log)"]

    def memory_bytes(self, containers: list[str]) -> int:
        with self._lock:
            by_member: defaultdict[str, list[str]] = defaultdict(list)
            for cid in containers:
                name = self._cid.get(cid)
                if name is not None:
                    by_member[name].append(cid)
        total = 0
        for name, cids in by_member.items():
            try:
                total += self._call(name, lambda n, c=cids: n.memory_bytes(c))  # type: ignore[misc]
            except NodeLost:
                continue
        return total

    def lost_reason(self, env_id: str) -> str | None:
        name = self._env_member(env_id)
        with self._lock:
            return self._dead.get(name) if name is not None else None

    def exit_reason(self, env_id: str, service: str) -> str | None:
        name = self._env_member(env_id)
        with self._lock:
            why = self._dead.get(name or "")
        if why:
            return why
        try:
            return self._routed(env_id, lambda n: n.exit_reason(env_id, service))
        except NodeLost:
            return None

    # Node: live forks (a live group stays on its member)
    def live_root(self, env_id: str, container: str, port: int) -> LiveProc:
        return self._routed(env_id, lambda n: n.live_root(env_id, container, port))

    def live_fork(
        self,
        parent_env: str,
        parent: LiveProc,
        volumes: list[VolumeSlot],
        children: list[tuple[str, int]],
    ) -> tuple[list[list[str]], list[LiveProc | str], dict[str, float]]:
        name = self._env_member(parent.group)
        if name is None:
            raise NodeLost("(none)", f"no node holds {parent.group}")
        with self._lock:
            for child, _ in children:
                self._env[child] = name
        result = self._call(name, lambda n: n.live_fork(parent_env, parent, volumes, children))
        self._made(name, _new_layers(result[0], volumes))
        return result

    def live_alive(self, proc: LiveProc) -> bool:
        try:
            return self._routed(proc.group, lambda n: n.live_alive(proc))
        except NodeLost:
            return False

    def live_teardown(self, env_id: str, proc: LiveProc, last: bool) -> None:
        with contextlib.suppress(NodeLost):
            self._routed(proc.group, lambda n: n.live_teardown(env_id, proc, last))
        if env_id != proc.group:
            self._forget(env_id, [])

    def live_private_bytes(self, proc: LiveProc) -> int:
        return self._routed(proc.group, lambda n: n.live_private_bytes(proc))

    # loss
    def lost(self) -> dict[str, str]:
        self._refresh()
        for name in list(self.live_members()):
            try:  # a cheap call: a member whose agent died raises NodeLost here
                self._call(name, lambda n: n.room())
            except NodeLost:
                continue
            except Exception:
                continue
        with self._lock:
            out, self._lost_envs = self._lost_envs, {}
        return out

    # reconcile
    def owned(self) -> Owned:
        containers: dict[str, str] = {}
        networks: dict[str, str] = {}
        volume_envs: list[str] = []
        for name in self.live_members():
            try:
                o = self._call(name, lambda n: n.owned())
            except NodeLost:
                continue
            with self._lock:
                for cid, env_id in o.containers.items():
                    self._cid[cid] = name
                    if env_id:
                        self._env.setdefault(env_id, name)
                for net, env_id in o.networks.items():
                    self._net[net] = name
                    if env_id:
                        self._env.setdefault(env_id, name)
                for env_id in o.volume_envs:
                    self._env.setdefault(env_id, name)
            containers.update(o.containers)
            networks.update(o.networks)
            volume_envs += o.volume_envs
        return Owned(containers=containers, networks=networks, volume_envs=volume_envs)

    def remove_owned(self, owned: Owned) -> None:
        parts: defaultdict[str, Owned] = defaultdict(Owned)
        with self._lock:
            for cid, env_id in owned.containers.items():
                name = self._cid.get(cid)
                if name:
                    p = parts[name]
                    parts[name] = p.model_copy(update={"containers": {**p.containers, cid: env_id}})
            for net, env_id in owned.networks.items():
                name = self._net.get(net)
                if name:
                    p = parts[name]
                    parts[name] = p.model_copy(update={"networks": {**p.networks, net: env_id}})
            for env_id in owned.volume_envs:
                name = self._env.get(env_id)
                if name:
                    p = parts[name]
                    parts[name] = p.model_copy(update={"volume_envs": [*p.volume_envs, env_id]})
        for name, part in parts.items():
            try:
                self._call(name, lambda n, o=part: n.remove_owned(o))  # type: ignore[misc]
            except NodeLost:
                continue
        for env_id in {*owned.containers.values(), *owned.networks.values(), *owned.volume_envs}:
            self._forget(env_id, [c for c, e in owned.containers.items() if e == env_id])

    def recover(
        self,
        env_id: str,
        containers: dict[str, str],
        volumes: list[VolumeSlot],
        states: dict[str, str],
    ) -> str | None:
        name = self._env_member(env_id)
        if name is None:
            return "no node of the cluster holds its containers"
        with self._lock:
            why = self._dead.get(name)
        if why:
            return why
        try:
            return self._call(name, lambda n: n.recover(env_id, containers, volumes, states))
        except NodeLost:
            return f"node {name} stopped answering"


def _new_layers(stacks: list[list[str]], volumes: list[VolumeSlot]) -> list[str]:
    """The layers of ``stacks`` that the volumes did not have before (captured, merged)."""
    old = {x for v in volumes for x in v.layers}
    return [x for stack in stacks for x in stack if x not in old]
