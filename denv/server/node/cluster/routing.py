"""How a seam call reaches the members: to the one an env is on, or to every one, merged.

The lifecycle above the seam names envs, containers and live processes, never members: this
is where those names are turned into the member to ask (the members' map: env, container,
network -> member; a live process's group), where a lost member's answer becomes what the
call answers instead, and where ``owned`` rebuilds the map after a control-plane restart.

Most calls about one env need nothing of the cluster but its member: ``ClusterNode`` lists
them as ``Route`` (sent as they are, by the argument that names the env) and the calls a
part answers as ``Forward``; neither restates a call's signature, which is the seam's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any, Protocol, overload

from denv.server.node.errors import Unavailable
from denv.server.node.seam import Metered, NodeLost, Owned, Usage, seam_signatures
from denv.server.records import LiveProc

from .membership import Members

_SIGNATURES = seam_signatures()


class HasMembers(Protocol):
    members: Members


class Route:
    """A seam call sent as it is to the member holding what its argument ``by`` names: an
    env id, or a live process (``by="proc"``: its group's member). NodeLost when the env is
    on no member or its member is lost; ``lost(exc)`` answers instead when given.

        logs = Route(lost=lambda exc: [f"({exc}: no log)"])
    """

    def __init__(self, by: str = "env_id", lost: Callable[[NodeLost], Any] | None = None) -> None:
        self.by, self.lost, self.call = by, lost, ""

    def __set_name__(self, owner: type, name: str) -> None:
        if self.by not in _SIGNATURES[name].parameters:  # KeyError: not a call of the seam
            raise TypeError(f"{name} of the node seam has no argument {self.by!r} to route by")
        self.call = name

    @overload
    def __get__(self, node: None, owner: type | None = None) -> Route: ...

    @overload
    def __get__(self, node: HasMembers, owner: type | None = None) -> Callable[..., Any]: ...

    def __get__(
        self, node: HasMembers | None, owner: type | None = None
    ) -> Route | Callable[..., Any]:
        if node is None:
            return self
        members, call, by, lost = node.members, self.call, self.by, self.lost

        def routed(*args: Any, **kwargs: Any) -> Any:
            named = _SIGNATURES[call].bind(None, *args, **kwargs).arguments[by]
            env_id = named.group if isinstance(named, LiveProc) else named
            try:
                return members.on_env(env_id, lambda n: getattr(n, call)(*args, **kwargs))
            except NodeLost as exc:
                if lost is None:
                    raise
                return lost(exc)

        routed.__name__ = call
        return routed


class Forward:
    """A seam call answered as it is by one part of the cluster node (its attribute
    ``part``: ``layers``, ``images``...), which has the call under the same name."""

    def __init__(self, part: str) -> None:
        self.part, self.call = part, ""

    def __set_name__(self, owner: type, name: str) -> None:
        if name not in _SIGNATURES:
            raise TypeError(f"{name} is not a call of the node seam")
        self.call = name

    @overload
    def __get__(self, node: None, owner: type | None = None) -> Forward: ...

    @overload
    def __get__(self, node: object, owner: type | None = None) -> Callable[..., Any]: ...

    def __get__(self, node: object, owner: type | None = None) -> Forward | Callable[..., Any]:
        if node is None:
            return self
        answer: Callable[..., Any] = getattr(getattr(node, self.part), self.call)
        return answer


class Merged:
    """The calls about every env (or every container): each live member asked for its own,
    the answers merged."""

    def __init__(self, members: Members) -> None:
        self._members = members
        self._last_states: dict[str, dict[str, str]] = {}  # member: its containers' last answer

    def states(self, env_id: str | None = None) -> dict[str, str]:
        """The containers' states. A member that does not answer, while Ray still counts it
        alive (a node just killed, an agent restarting), says nothing about its envs: one
        env's states are then ``Unavailable`` (the API's 503, so no one reads its containers
        as gone), and in the whole list its containers keep their last known states. Whether
        the node is lost is the reaper's (``lost``), once Ray has seen it dead."""
        members = self._members
        if env_id is not None:
            try:
                return members.on_env(env_id, lambda n: n.states(env_id))
            except NodeLost as exc:
                why = f"{exc}: its env's state is unknown"
                raise Unavailable(why) from exc
        out: dict[str, str] = {}
        for name in members.live():
            try:
                found = members.call(name, lambda n: n.states())
            except (NodeLost, Unavailable):
                with members.lock:
                    out.update(self._last_states.get(name, {}))
                continue
            with members.lock:
                for cid in found:
                    members.cid.setdefault(cid, name)
                self._last_states[name] = dict(found)
            out.update(found)
        members.measure_memory()
        return out

    def memory_bytes(self, containers: list[str]) -> int:
        members = self._members
        with members.lock:
            by_member: defaultdict[str, list[str]] = defaultdict(list)
            for cid in containers:
                name = members.cid.get(cid)
                if name is not None:
                    by_member[name].append(cid)
        total = 0
        for name, cids in by_member.items():
            try:
                total += members.call(name, lambda n, c=cids: n.memory_bytes(c))  # type: ignore[misc]
            except NodeLost:
                continue
        return total

    def usage(self, envs: list[Metered]) -> list[Usage]:
        """Asked of each member for its envs (a live env is on its group's member); a lost
        member's envs are not known."""
        members = self._members
        by_member: defaultdict[str, list[Metered]] = defaultdict(list)
        for env in envs:
            name = members.member_of(env.live.group if env.live else env.env_id)
            if name is not None:
                by_member[name].append(env)
        known: dict[str, Usage] = {}
        for name, some in by_member.items():
            try:
                found = members.call(name, lambda n, s=some: n.usage(s))  # type: ignore[misc]
            except NodeLost:
                continue
            known.update((u.env_id, u) for u in found)
        return [known.get(e.env_id) or Usage(env_id=e.env_id) for e in envs]

    def owned(self) -> Owned:
        """What every live member holds, each container, network and env counted on it
        again (the map after a control-plane restart)."""
        members = self._members
        containers: dict[str, str] = {}
        networks: dict[str, str] = {}
        volume_envs: list[str] = []
        for name in members.live():
            try:
                o = members.call(name, lambda n: n.owned())
            except NodeLost:
                continue
            with members.lock:
                for cid, env_id in o.containers.items():
                    members.cid[cid] = name
                    if env_id:
                        members.env.setdefault(env_id, name)
                for net, env_id in o.networks.items():
                    members.net[net] = name
                    if env_id:
                        members.env.setdefault(env_id, name)
                for env_id in o.volume_envs:
                    members.env.setdefault(env_id, name)
            containers.update(o.containers)
            networks.update(o.networks)
            volume_envs += o.volume_envs
        return Owned(containers=containers, networks=networks, volume_envs=volume_envs)

    def split(self, owned: Owned) -> dict[str, Owned]:
        """``owned`` by the member holding each part (those on no known member left out)."""
        members = self._members
        parts: defaultdict[str, Owned] = defaultdict(Owned)
        with members.lock:
            for cid, env_id in owned.containers.items():
                name = members.cid.get(cid)
                if name:
                    p = parts[name]
                    parts[name] = p.model_copy(update={"containers": {**p.containers, cid: env_id}})
            for net, env_id in owned.networks.items():
                name = members.net.get(net)
                if name:
                    p = parts[name]
                    parts[name] = p.model_copy(update={"networks": {**p.networks, net: env_id}})
            for env_id in owned.volume_envs:
                name = members.env.get(env_id)
                if name:
                    p = parts[name]
                    parts[name] = p.model_copy(update={"volume_envs": [*p.volume_envs, env_id]})
        return dict(parts)
