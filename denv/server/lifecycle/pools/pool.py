"""One warm pool (``warm``): its record, its answer as the contract's WarmPool, its back-off
after failed boots, which of its spares a fork takes first, and the room the warm limits and
the host's free memory leave for one more spare (zygotes count against the same room).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Collection, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field

from denv.server.config import (
    MIB,
    WARM_MAX_FAILURES,
    WARM_MEMORY_GUESS,
    WARM_RETRY_BASE_S,
    WARM_RETRY_MAX_S,
    ServerConfig,
)
from denv.server.lifecycle.pools.spares import Spare
from denv.server.node.seam import BootSpec


@dataclass
class Pool:
    key: str
    blueprint: BootSpec
    owners: dict[str, int] = field(default_factory=dict)  # env id -> spares it asked for
    keys: dict[str, str] = field(default_factory=dict)  # env id -> its API key (owner id)
    idle: deque[Spare] = field(default_factory=deque)
    booting: dict[str, float] = field(default_factory=dict)  # env id -> start, oldest first
    claims: dict[str, Future[Spare | None]] = field(default_factory=dict)  # booting, promised
    last_used: float = field(default_factory=time.monotonic)
    failures: int = 0
    error: str | None = None  # why the last boot failed
    memory: int = 0  # the largest measured spare of this pool
    refill_after: float = 0.0  # no refill before (monotonic): the children just taken boot first
    retry_at: float = 0.0  # after WARM_MAX_FAILURES failures in a row: next try (monotonic)

    @property
    def target(self) -> int:
        return max(self.owners.values(), default=0)

    def unclaimed(self) -> list[str]:
        return [x for x in self.booting if x not in self.claims]


def retry_delay(failures: int) -> float:
    """Seconds before the next boot of a pool whose last ``failures`` boots failed: doubling
    from WARM_RETRY_BASE_S, at most WARM_RETRY_MAX_S. A pool is never given up for good:
    what failed (a loaded host, a full disk) may pass."""
    return float(min(WARM_RETRY_MAX_S, WARM_RETRY_BASE_S * 2 ** (failures - WARM_MAX_FAILURES)))


def mem_available() -> int:
    """``MemAvailable`` of /proc/meminfo in bytes (0 when unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def spare_memory(pools: Iterable[Pool]) -> int:
    """The bytes of every pool's spares, booting ones at their pool's largest (or a guess)."""
    return sum(
        sum(s.memory for s in p.idle) + len(p.unclaimed()) * (p.memory or WARM_MEMORY_GUESS)
        for p in pools
    )


def fits(pools: Collection[Pool], pool: Pool, cfg: ServerConfig) -> bool:
    """Whether one more spare of ``pool`` stays within the warm limits (count, memory) and
    leaves the host its free memory, counting the spares still booting."""
    count = sum(len(p.idle) + len(p.unclaimed()) for p in pools)
    if count >= cfg.warm_max_spares:
        return False
    need = pool.memory or WARM_MEMORY_GUESS
    if cfg.warm_max_memory_mb and spare_memory(pools) + need > cfg.warm_max_memory_mb * MIB:
        return False
    pending = sum(len(p.booting) * (p.memory or WARM_MEMORY_GUESS) for p in pools)
    return mem_available() - pending - need >= cfg.warm_min_free_mb * MIB


def pop_nearest(idle: deque[Spare], near: set[str]) -> Spare:
    """The first idle spare on one of the ``near`` nodes, else the first one."""
    for i, spare in enumerate(idle):
        if spare.booted.node in near:
            del idle[i]
            return spare
    return idle.popleft()
