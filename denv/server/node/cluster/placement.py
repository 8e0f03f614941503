"""Which member takes an env, and how much room the members have: a strategy the cluster node
is given (``Placement``), and the one it uses unless told otherwise (``LeastLoaded``).

A strategy is handed the cluster's ``Members`` at each call (their loads, what each holds)
and decides; it keeps no map of its own, so another one (sampling a few members, weighing
other loads) is a class beside this one, passed to ``ClusterNode(placement=...)``.

``LeastLoaded`` weighs what the members already carry (envs placed there, memory their envs
last used) against each member's cap, so that a create past every cap is refused (429)
before anything starts, and a fork lands where its layers are instead of copying them.

Every env on a member counts as one against ``max_envs``, however it runs: a container of
its own, a live child or a zygote's copy in its group's container, a zygote, a warm spare.
Memory is what the member's containers use, measured (live children are in their group's
container's cgroup), so a live child weighs against ``max_memory_mb`` only what it uses.

A live root (a ``live`` boot: an env created live, a zygote, a child that spilled from a
full member) has children to come, and they can only run on its member: it goes to a member
with room for itself and ``live_reserve`` more, ordered as any env; when no member has that
much room, to the one with the most. Nothing is held back for them: a fork that finds its
member full spills (docs/cluster.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from denv.server.node.seam import BootFailed, BootSpec, NodeLost
from denv.server.volumes.overlay import EMPTY_LAYER

from .membership import Load, Members

# A live root goes where its member has room for it and this many children (a fork(8)).
DEFAULT_LIVE_RESERVE = 8
MANY = 1 << 20  # the room of a member under a memory cap only: not counted in envs


@dataclass(frozen=True)
class NodeCaps:
    """What one member accepts: envs at once and memory its envs use (0: no cap)."""

    max_envs: int = 0
    max_memory_mb: int = 0
    live_reserve: int = DEFAULT_LIVE_RESERVE  # room a live root is placed with for its children


class Placement(Protocol):
    """How a cluster chooses the member for an env and counts its members' room. Each call
    is given the cluster's members; none keeps a map of its own."""

    def place(self, members: Members, spec: BootSpec, skip: frozenset[str] = frozenset()) -> str:
        """The member for ``spec``, never one of ``skip`` (whose engine did not answer);
        ``BootFailed`` (``start_failed``) when no member has room."""
        ...

    def least_loaded(self, members: Members) -> str:
        """The member for something that is not an env (a seed, a layer handed to the
        cluster); NodeLost when there is none."""
        ...

    def room(self, members: Members) -> int | None:
        """How many more envs the members accept; None: no cap."""
        ...

    def room_beside(self, members: Members, env_id: str) -> int | None:
        """How many more envs the member running ``env_id`` takes (its live children go
        there): 0 when it is lost or unknown; None with no cap."""
        ...

    def refusal(self, members: Members, name: str, count: int) -> str | None:
        """Why member ``name`` cannot take ``count`` more envs (a live fork's children, which
        only it can run); None when it can. Called holding ``members.lock``, so that the
        children are counted there in the same step."""
        ...


class LeastLoaded:
    """The members' layers first, then the fewest envs, then the least memory, under each
    member's ``NodeCaps``; a live root where its children will have room."""

    def __init__(self, caps: NodeCaps | None = None) -> None:
        self.caps = caps or NodeCaps()

    def _capped(self) -> bool:
        return bool(self.caps.max_envs or self.caps.max_memory_mb)

    def _room_of(self, load: Load) -> int:
        """How many more envs a member with this load takes (``MANY``: no cap on envs)."""
        caps = self.caps
        if caps.max_memory_mb and load.memory >= caps.max_memory_mb * 2**20:
            return 0
        return max(caps.max_envs - load.envs, 0) if caps.max_envs else MANY

    def _caps_text(self) -> str:
        caps = self.caps
        return f"{caps.max_envs or 'no'} envs, {caps.max_memory_mb or 'no'} MiB per node"

    def room(self, members: Members) -> int | None:
        members.refresh()
        if not self._capped():
            return None if members.loads() else 0
        return sum(self._room_of(load) for load in members.loads().values())

    def room_beside(self, members: Members, env_id: str) -> int | None:
        if not self._capped():
            return None
        members.refresh()
        load = members.loads().get(members.member_of(env_id) or "")
        return 0 if load is None else self._room_of(load)

    def refusal(self, members: Members, name: str, count: int) -> str | None:
        load = members.loads().get(name)
        room = 0 if load is None else self._room_of(load)
        if self._capped() and room < count:
            return (
                f"node {name} has room for {room} more env(s) under its cap "
                f"({self._caps_text()}) and {count} live children were asked for"
            )
        return None

    def least_loaded(self, members: Members) -> str:
        loads = members.loads()
        if not loads:
            raise NodeLost("(none)", "the cluster has no live node")
        return min(loads, key=lambda n: (loads[n].envs, n))

    def place(self, members: Members, spec: BootSpec, skip: frozenset[str] = frozenset()) -> str:
        members.refresh()
        loads = {
            n: ld for n, ld in members.loads().items() if self._room_of(ld) > 0 and n not in skip
        }
        if not loads:
            raise BootFailed(
                "start_failed",
                "no node of the cluster has room for another env "
                f"(caps: {self._caps_text()}); delete envs or add nodes",
            )
        wanted = {x for v in spec.volumes for x in v.layers if x != EMPTY_LAYER}
        has = members.layer_counts(wanted, loads)
        if spec.live and self.caps.max_envs:
            # A live root: its children come to its member. Where there is room for it and
            # its reserve, as any env; else the member with the most room.
            want = 1 + self.caps.live_reserve
            roomy = {n: ld for n, ld in loads.items() if self._room_of(ld) >= want}
            if not roomy:
                return min(loads, key=lambda n: (loads[n].envs, -has[n], loads[n].memory, n))
            loads = roomy
        # the most of the version's layers first, then the fewest envs, then the least memory
        return min(loads, key=lambda n: (-has[n], loads[n].envs, loads[n].memory, n))
