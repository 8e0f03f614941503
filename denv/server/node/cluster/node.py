"""``ClusterNode``: the seam's calls on many nodes, made of parts that each own one concern.

    members    Members      who is in, how each is doing, the map of what each holds, the
                            lock (``membership``)
    placement  Placement    which member takes an env, how much room there is: a strategy,
                            ``LeastLoaded`` unless another is given (``placement``)
    layers     Layers       where layers are, copies, fetches, uploads, durability (``layers``)
    images     Images       where an image comes from: a registry, a member, the store
                            (``images``)
    merged     Merged       the calls about every env, each member's answers merged
                            (``routing``)
    uploads    Uploads      the background pool layers and images are stored through

No part is another's subclass; each is given the parts it uses. The seam's calls are
answered by the part that knows (``Forward``), sent as they are to the member an env or a
live group is on (``Route``), or, where the cluster adds a step of its own (placing a boot,
counting live children, forgetting an env), written out here.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping

from denv.server.config import ObjectStoreConfig
from denv.server.node import live
from denv.server.node.errors import Unavailable
from denv.server.node.seam import (
    Booted,
    BootFailed,
    BootSpec,
    Cancelled,
    LiveForked,
    Node,
    NodeLost,
    Owned,
)
from denv.server.records import LiveProc, VolumeSlot

from .images import Images
from .layers import Layers
from .membership import Members
from .placement import LeastLoaded, NodeCaps, Placement
from .routing import Forward, Merged, Route
from .uploads import Uploads

log = logging.getLogger(__name__)


class ClusterNode:
    """A ``Node`` made of members; thread-safe. ``caps`` are the default placement's
    (``LeastLoaded``); ``placement`` is another strategy instead.

        ClusterNode(ray_cluster.members_fn("auto", cfg), store, NodeCaps(max_envs=64))
    """

    def __init__(
        self,
        members: Callable[[], Mapping[str, Node]],
        store: ObjectStoreConfig | None = None,
        caps: NodeCaps | None = None,
        *,
        placement: Placement | None = None,
    ) -> None:
        if caps is not None and placement is not None:
            raise ValueError("ClusterNode: caps are LeastLoaded's; give caps or a placement")
        self.members = Members(members)
        self.placement: Placement = LeastLoaded(caps) if placement is None else placement
        self.uploads = Uploads(self.members.lock)
        self.layers = Layers(self.members, self.placement, store, self.uploads)
        self.images = Images(self.members, store, self.uploads)
        self.merged = Merged(self.members)
        self._booting: set[str] = set()
        self._cancelled: set[str] = set()
        self._stopped = False  # set by stop(): no boot starts after it
        self.members.refresh(force=True)

    # Answered by a part, as they are.
    engine_version = Forward("images")
    inspect_image = Forward("images")
    has_layer = Forward("layers")
    layer_ids = Forward("layers")
    layer_sizes = Forward("layers")
    free_disk_bytes = Forward("layers")
    delete_layers = Forward("layers")
    drop_partial_layers = Forward("layers")
    diff_layers = Forward("layers")
    layer_nodes = Forward("layers")
    layer_storage = Forward("layers")
    layer_digest = Forward("layers")
    offer_layer = Forward("layers")
    copy_layer = Forward("layers")
    upload_layer = Forward("layers")
    fetch_layer = Forward("layers")
    states = Forward("merged")
    memory_bytes = Forward("merged")
    usage = Forward("merged")
    owned = Forward("merged")
    lost = Forward("members")
    lost_reason = Forward("members")

    # Sent as they are to the member the env is on (a live process: its group's member).
    prioritize = Route()
    changed_bytes = Route()
    checkpoint = Route()  # its children restore where a placement puts them beside it, else boot
    drop_checkpoint = Route()
    live_root = Route()
    logs = Route(lost=lambda exc: [f"({exc}: no log)"])
    logs_after = Route(lost=lambda exc: ([f"({exc}: no more log)"], None))
    live_modules = Route(by="proc")
    live_preload = Route(by="proc")
    live_alive = Route(by="proc", lost=lambda exc: False)
    live_exit_reason = Route(by="proc", lost=lambda exc: None)

    # room (the placement's count)
    def room(self) -> int | None:
        return self.placement.room(self.members)

    def room_beside(self, env_id: str) -> int | None:
        return self.placement.room_beside(self.members, env_id)

    # one env
    def bring_up(self, spec: BootSpec) -> Booted:
        members = self.members
        with members.lock:
            if self._stopped or spec.env_id in self._cancelled:
                raise Cancelled()
        tried: set[str] = set()
        failed: Unavailable | None = None
        while True:
            name = self._place_past_engines(spec, tried, failed)
            with members.lock:
                members.env[spec.env_id] = name
                self._booting.add(spec.env_id)
            try:
                self.images.ensure(name, spec.services)
                if not spec.late_mount:
                    self.layers.ensure(name, [x for v in spec.volumes for x in v.layers])
                booted = members.call(name, lambda n: n.bring_up(spec))
                break
            except NodeLost as exc:
                raise BootFailed("lost", f"{exc} (while the env started)") from exc
            except Unavailable as exc:
                # Its engine does not answer, so it started nothing: another member may.
                log.warning("cluster: %s; placing env %s elsewhere", exc.message, spec.env_id)
                members.engine_failed(name)
                tried.add(name)
                failed = exc
            finally:
                with members.lock:
                    self._booting.discard(spec.env_id)
        with members.lock:
            for cid in booted.containers.values():
                members.cid[cid] = name
            members.net[booted.network] = name
        return booted.model_copy(update={"node": name})

    def _place_past_engines(
        self, spec: BootSpec, tried: set[str], failed: Unavailable | None
    ) -> str:
        """A member for ``spec`` whose engine answered lately, else (none with room) any
        not ``tried`` yet; ``failed`` (the last engine's error) once every one was tried."""
        try:
            return self.placement.place(self.members, spec, self.members.engines_down() | tried)
        except BootFailed:
            if failed is not None:
                raise failed from None
            return self.placement.place(self.members, spec, frozenset(tried))

    def wait_healthy(self, spec: BootSpec, booted: Booted, timeout_s: float) -> None:
        try:
            self.members.on_env(spec.env_id, lambda n: n.wait_healthy(spec, booted, timeout_s))
        except NodeLost as exc:
            raise BootFailed("lost", f"{exc} (while the env started)") from exc

    def mount_volumes(self, env_id: str, volumes: list[VolumeSlot]) -> None:
        name = self._member(env_id)
        self.layers.ensure(name, [x for v in volumes for x in v.layers])
        self.members.call(name, lambda n: n.mount_volumes(env_id, volumes))

    def snapshot(
        self, env_id: str, containers: list[str], volumes: list[VolumeSlot]
    ) -> list[list[str]]:
        name = self._member(env_id)
        stacks = self.members.call(name, lambda n: n.snapshot(env_id, containers, volumes))
        self.layers.made(name, _new_layers(stacks, volumes))
        return stacks

    def seed_layer(self, image_id: str, path: str) -> str | None:
        """What the image has at ``path``, as a layer made on the least loaded member (the
        image brought there first)."""
        name = self.placement.least_loaded(self.members)
        self.images.ensure_image(name, "", image_id)
        layer = self.members.call(name, lambda n: n.seed_layer(image_id, path))
        if layer:
            self.layers.made(name, [layer])
        return layer

    def cancel(self, env_id: str) -> None:
        with self.members.lock:
            self._cancelled.add(env_id)
            name = self.members.env.get(env_id)
        if name is not None:
            with contextlib.suppress(NodeLost):
                self.members.call(name, lambda n: n.cancel(env_id))

    def teardown(self, env_id: str, containers: list[str]) -> None:
        name = self.members.member_of(env_id)
        if name is not None:
            try:
                self.members.call(name, lambda n: n.teardown(env_id, containers))
            except NodeLost:
                log.info("cluster: env %s's node %s is lost; nothing to tear down", env_id, name)
        self._forget(env_id, containers)

    def _forget(self, env_id: str, containers: list[str]) -> None:
        with self.members.lock:
            self.members.forget(env_id, containers)
            self._cancelled.discard(env_id)

    def _member(self, env_id: str) -> str:
        name = self.members.member_of(env_id)
        if name is None:
            raise NodeLost("(none)", f"no node holds {env_id}")
        return name

    def stop(self) -> None:
        with self.members.lock:
            self._stopped = True
            self.uploads.stop()
            booting = [(e, self.members.env.get(e)) for e in self._booting]
        for env_id, name in booting:
            if name is not None:
                with contextlib.suppress(NodeLost):
                    self.members.call(name, lambda n, e=env_id: n.cancel(e))  # type: ignore[misc]
        self.uploads.shutdown()

    def exit_reason(self, env_id: str, service: str) -> str | None:
        name = self.members.member_of(env_id)
        with self.members.lock:
            why = self.members.dead.get(name or "")
        if why:
            return why
        try:
            return self.members.on_env(env_id, lambda n: n.exit_reason(env_id, service))
        except NodeLost:
            return None

    # live forks (a live group stays on its member)
    def live_fork(
        self,
        parent_env: str,
        parent: LiveProc,
        volumes: list[VolumeSlot],
        children: list[tuple[str, int]],
        reseed: bool = True,
    ) -> LiveForked:
        members = self.members
        name = self._member(parent.group)
        members.refresh()
        with members.lock:  # room, then the children counted there: one step
            why = self.placement.refusal(members, name, len(children))
            if why is not None:
                raise live.LiveError("node_full", why)
            for child, _ in children:
                members.env[child] = name
        try:
            result = members.call(
                name, lambda n: n.live_fork(parent_env, parent, volumes, children, reseed)
            )
        except BaseException:
            with members.lock:
                for child, _ in children:
                    members.env.pop(child, None)
            raise
        self.layers.made(name, _new_layers(result.stacks, volumes))
        return result

    def live_teardown(self, env_id: str, proc: LiveProc, last: bool) -> None:
        with contextlib.suppress(NodeLost):
            self.members.on_env(proc.group, lambda n: n.live_teardown(env_id, proc, last))
        if env_id != proc.group:
            self._forget(env_id, [])
        if last:  # the group's container is gone: its root no longer counts on its member
            self._forget(proc.group, [])

    def live_adopt(self, env_id: str, proc: LiveProc) -> None:
        """A live env that outlived a control-plane restart counts on its group's member
        again (``owned`` found the group's container there)."""
        name = self.members.member_of(proc.group)
        if name is not None:
            with self.members.lock:
                self.members.env.setdefault(env_id, name)

    # reconcile
    def remove_owned(self, owned: Owned) -> None:
        for name, part in self.merged.split(owned).items():
            try:
                self.members.call(name, lambda n, o=part: n.remove_owned(o))  # type: ignore[misc]
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
        name = self.members.member_of(env_id)
        if name is None:
            return "no node of the cluster holds its containers"
        with self.members.lock:
            why = self.members.dead.get(name)
        if why:
            return why
        try:
            return self.members.call(name, lambda n: n.recover(env_id, containers, volumes, states))
        except NodeLost:
            return f"node {name} stopped answering"


def _new_layers(stacks: list[list[str]], volumes: list[VolumeSlot]) -> list[str]:
    """The layers of ``stacks`` that the volumes did not have before (captured, merged)."""
    old = {x for v in volumes for x in v.layers}
    return [x for stack in stacks for x in stack if x not in old]
