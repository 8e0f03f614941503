"""Which member takes an env: the one holding most of its layers, then the least loaded.

Placement weighs what the members already carry (envs placed there, memory their envs last
used) against each member's cap, so that a create past every cap is refused (429) before
anything starts, and a fork lands where its layers are instead of copying them.

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

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from denv.server.node.seam import BootFailed, BootSpec, Node, NodeLost
from denv.server.volumes.overlay import EMPTY_LAYER

from .membership import Membership

# A live root goes where its member has room for it and this many children (a fork(8)).
DEFAULT_LIVE_RESERVE = 8
MANY = 1 << 20  # the room of a member under a memory cap only: not counted in envs


@dataclass(frozen=True)
class NodeCaps:
    """What one member accepts: envs at once and memory its envs use (0: no cap)."""

    max_envs: int = 0
    max_memory_mb: int = 0
    live_reserve: int = DEFAULT_LIVE_RESERVE  # room a live root is placed with for its children


class Placement(Membership):
    """Membership plus each member's load and cap."""

    def __init__(
        self, members: Callable[[], Mapping[str, Node]], caps: NodeCaps | None = None
    ) -> None:
        super().__init__(members)
        self._caps = caps or NodeCaps()
        self._memory: dict[str, int] = {}  # member -> bytes its envs used, last measured

    def _load(self) -> dict[str, tuple[int, int]]:
        """Member -> (envs placed there, bytes its envs use) of the live members."""
        with self._lock:
            envs = Counter(self._env.values())
            return {
                n: (envs[n], self._memory.get(n, 0)) for n in self._members if n not in self._dead
            }

    def _has_room(self, name: str, load: tuple[int, int]) -> bool:
        return self._room_of(load) > 0

    def _room_of(self, load: tuple[int, int]) -> int:
        """How many more envs a member with this load takes (``MANY``: no cap on envs)."""
        envs, memory = load
        caps = self._caps
        if caps.max_memory_mb and memory >= caps.max_memory_mb * 2**20:
            return 0
        return max(caps.max_envs - envs, 0) if caps.max_envs else MANY

    def room(self) -> int | None:
        self._refresh()
        if not self._caps.max_envs and not self._caps.max_memory_mb:
            return None if self._load() else 0
        return sum(self._room_of(load) for load in self._load().values())

    def room_beside(self, env_id: str) -> int | None:
        """How many more envs the member running ``env_id`` takes (its live children go
        there): 0 when it is lost or unknown; None with no cap."""
        if not self._caps.max_envs and not self._caps.max_memory_mb:
            return None
        self._refresh()
        load = self._load().get(self._env_member(env_id) or "")
        return 0 if load is None else self._room_of(load)

    def _caps_text(self) -> str:
        caps = self._caps
        return f"{caps.max_envs or 'no'} envs, {caps.max_memory_mb or 'no'} MiB per node"

    def _least_loaded(self) -> str:
        """The live member with the fewest envs (a seed, a layer handed to the cluster)."""
        loads = self._load()
        if not loads:
            raise NodeLost("(none)", "the cluster has no live node")
        return min(loads, key=lambda n: (loads[n][0], n))

    def _place(self, spec: BootSpec, skip: frozenset[str] = frozenset()) -> str:
        """The member for ``spec``, never one of ``skip`` (whose engine did not answer)."""
        self._refresh()
        loads = {n: ld for n, ld in self._load().items() if self._has_room(n, ld) and n not in skip}
        if not loads:
            raise BootFailed(
                "start_failed",
                "no node of the cluster has room for another env "
                f"(caps: {self._caps_text()}); delete envs or add nodes",
            )
        wanted = {x for v in spec.volumes for x in v.layers if x != EMPTY_LAYER}
        with self._lock:
            held = {n: sum(1 for x in wanted if n in self._layers.get(x, ())) for n in loads}
        if spec.live and self._caps.max_envs:
            # A live root: its children come to its member. Where there is room for it and
            # its reserve, as any env; else the member with the most room.
            want = 1 + self._caps.live_reserve
            roomy = {n: ld for n, ld in loads.items() if self._room_of(ld) >= want}
            if not roomy:
                return min(loads, key=lambda n: (loads[n][0], -held[n], loads[n][1], n))
            loads = roomy
        # the most of the version's layers first, then the fewest envs, then the least memory
        return min(loads, key=lambda n: (-held[n], loads[n][0], loads[n][1], n))

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
