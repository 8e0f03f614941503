"""Every call about an env goes to the member it is on; calls about everything merge all.

The lifecycle above the seam names envs, containers and live processes, never members: this
is where those names are turned into the member to ask (``_env``, ``_cid``, ``_net``; a live
process's group), where a lost member's answer becomes the lost env's reason, and where
``owned`` rebuilds the map after a control-plane restart.
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from denv.server.config import StoreConfig
from denv.server.node import live
from denv.server.node.errors import Refused, Unavailable
from denv.server.node.seam import (
    Booted,
    BootFailed,
    BootSpec,
    Cancelled,
    LiveForked,
    Metered,
    Node,
    NodeLost,
    Owned,
    Usage,
)
from denv.server.records import LiveProc, VolumeSlot

from .images import Images, no_member_answers
from .placement import NodeCaps

log = logging.getLogger(__name__)

T = TypeVar("T")


class Routing(Images):
    """Images and layers plus the ``Node`` calls, each sent to the member it concerns."""

    def __init__(
        self,
        members: Callable[[], Mapping[str, Node]],
        caps: NodeCaps | None = None,
        store: StoreConfig | None = None,
    ) -> None:
        super().__init__(members, caps, store)
        self._booting: set[str] = set()
        self._cancelled: set[str] = set()
        self._last_states: dict[str, dict[str, str]] = {}  # member: its containers' last answer

    # Node: images (any member answers)
    def _first(self, fn: Callable[[Node], T]) -> T:
        last: Exception | None = None
        for name in self._answering_first():
            try:
                return self._call(name, fn)
            except (NodeLost, Refused) as exc:
                if not self._unanswered(name, exc):
                    raise
                last = exc
        raise no_member_answers(last)

    def engine_version(self) -> str:
        return self._first(lambda n: n.engine_version())

    # Node: one env
    def bring_up(self, spec: BootSpec) -> Booted:
        with self._lock:
            if self._stopped or spec.env_id in self._cancelled:
                raise Cancelled()
        tried: set[str] = set()
        failed: Unavailable | None = None
        while True:
            name = self._place_past_engines(spec, tried, failed)
            with self._lock:
                self._env[spec.env_id] = name
                self._booting.add(spec.env_id)
            try:
                self._ensure_images(name, spec.services)
                if not spec.late_mount:
                    self._ensure_layers(name, [x for v in spec.volumes for x in v.layers])
                booted = self._call(name, lambda n: n.bring_up(spec))
                break
            except NodeLost as exc:
                raise BootFailed("lost", f"{exc} (while the env started)") from exc
            except Unavailable as exc:
                # Its engine does not answer, so it started nothing: another member may.
                log.warning("cluster: %s; placing env %s elsewhere", exc.message, spec.env_id)
                self._engine_failed(name)
                tried.add(name)
                failed = exc
            finally:
                with self._lock:
                    self._booting.discard(spec.env_id)
        with self._lock:
            for cid in booted.containers.values():
                self._cid[cid] = name
            self._net[booted.network] = name
        return booted.model_copy(update={"node": name})

    def _place_past_engines(
        self, spec: BootSpec, tried: set[str], failed: Unavailable | None
    ) -> str:
        """A member for ``spec`` whose engine answered lately, else (none with room) any
        not ``tried`` yet; ``failed`` (the last engine's error) once every one was tried."""
        try:
            return self._place(spec, self._engines_down() | tried)
        except BootFailed:
            if failed is not None:
                raise failed from None
            return self._place(spec, frozenset(tried))

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
        """The containers' states. A member that does not answer, while Ray still counts it
        alive (a node just killed, an agent restarting), says nothing about its envs: one
        env's states are then ``Unavailable`` (the API's 503, so no one reads its containers
        as gone), and in the whole list its containers keep their last known states. Whether
        the node is lost is the reaper's (``lost``), once Ray has seen it dead."""
        if env_id is not None:
            try:
                return self._routed(env_id, lambda n: n.states(env_id))
            except NodeLost as exc:
                why = f"{exc}: its env's state is unknown"
                raise Unavailable(why) from exc
        out: dict[str, str] = {}
        for name in self.live_members():
            try:
                found = self._call(name, lambda n: n.states())
            except (NodeLost, Unavailable):
                with self._lock:
                    out.update(self._last_states.get(name, {}))
                continue
            with self._lock:
                for cid in found:
                    self._cid.setdefault(cid, name)
                self._last_states[name] = dict(found)
            out.update(found)
        self._measure_memory()
        return out

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

    def logs_after(
        self, env_id: str, service: str, cursor: str | None, tail: int, wait_s: float
    ) -> tuple[list[str], str | None]:
        try:
            return self._routed(
                env_id, lambda n: n.logs_after(env_id, service, cursor, tail, wait_s)
            )
        except NodeLost as exc:
            return [f"({exc}: no more log)"], None

    def usage(self, envs: list[Metered]) -> list[Usage]:
        """Asked of each member for its envs (a live env is on its group's member); a lost
        member's envs are not known."""
        by_member: defaultdict[str, list[Metered]] = defaultdict(list)
        for env in envs:
            name = self._env_member(env.live.group if env.live else env.env_id)
            if name is not None:
                by_member[name].append(env)
        known: dict[str, Usage] = {}
        for name, some in by_member.items():
            try:
                found = self._call(name, lambda n, s=some: n.usage(s))  # type: ignore[misc]
            except NodeLost:
                continue
            known.update((u.env_id, u) for u in found)
        return [known.get(e.env_id) or Usage(env_id=e.env_id) for e in envs]

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
        reseed: bool = True,
    ) -> LiveForked:
        name = self._env_member(parent.group)
        if name is None:
            raise NodeLost("(none)", f"no node holds {parent.group}")
        self._refresh()
        with self._lock:  # room, then the children counted there: one step
            load = self._load().get(name)
            room = 0 if load is None else self._room_of(load)
            if (self._caps.max_envs or self._caps.max_memory_mb) and room < len(children):
                raise live.LiveError(
                    "node_full",
                    f"node {name} has room for {room} more env(s) under its cap "
                    f"({self._caps_text()}) and {len(children)} live children were asked for",
                )
            for child, _ in children:
                self._env[child] = name
        try:
            result = self._call(
                name, lambda n: n.live_fork(parent_env, parent, volumes, children, reseed)
            )
        except BaseException:
            with self._lock:
                for child, _ in children:
                    self._env.pop(child, None)
            raise
        self._made(name, _new_layers(result.stacks, volumes))
        return result

    def live_alive(self, proc: LiveProc) -> bool:
        try:
            return self._routed(proc.group, lambda n: n.live_alive(proc))
        except NodeLost:
            return False

    def live_modules(self, proc: LiveProc) -> list[str]:
        return self._routed(proc.group, lambda n: n.live_modules(proc))

    def live_preload(self, proc: LiveProc, modules: list[str]) -> dict[str, Any]:
        return self._routed(proc.group, lambda n: n.live_preload(proc, modules))

    def live_exit_reason(self, env_id: str, proc: LiveProc) -> str | None:
        try:
            return self._routed(proc.group, lambda n: n.live_exit_reason(env_id, proc))
        except NodeLost:
            return None

    def live_teardown(self, env_id: str, proc: LiveProc, last: bool) -> None:
        with contextlib.suppress(NodeLost):
            self._routed(proc.group, lambda n: n.live_teardown(env_id, proc, last))
        if env_id != proc.group:
            self._forget(env_id, [])
        if last:  # the group's container is gone: its root no longer counts on its member
            self._forget(proc.group, [])

    def live_adopt(self, env_id: str, proc: LiveProc) -> None:
        """A live env that outlived a control-plane restart counts on its group's member
        again (``owned`` found the group's container there)."""
        name = self._env_member(proc.group)
        if name is not None:
            with self._lock:
                self._env.setdefault(env_id, name)

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
