"""Which member takes an env: the one holding most of its layers, then the least loaded.

Placement weighs what the members already carry (envs placed there, memory their envs last
used) against each member's cap, so that a create past every cap is refused (429) before
anything starts, and a fork lands where its layers are instead of copying them.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from denv.server.node.seam import BootFailed, BootSpec, Node, NodeLost
from denv.server.volumes.overlay import EMPTY_LAYER

from .membership import Membership


@dataclass(frozen=True)
class NodeCaps:
    """What one member accepts: envs at once and memory its envs use (0: no cap)."""

    max_envs: int = 0
    max_memory_mb: int = 0


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
