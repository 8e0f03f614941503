"""A container's cgroup files: freeze and thaw, CPU weight, memory in use.

Written directly (0.3 ms, not the 25 of a round trip through dockerd and runc); through the
``Engine`` where a file is not found (another cgroup layout).
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import suppress
from pathlib import Path

from denv.server.docker.engine import Engine

log = logging.getLogger(__name__)

FREEZE_TIMEOUT_S = 2.0


def freeze(engine: Engine, cid: str) -> str | None:
    """Stop a running container's processes for a snapshot; how, for :func:`thaw`.

    Its cgroup's freezer, as ``docker pause`` does, without the round trips through
    dockerd and runc; ``docker pause`` where there is no freezer file.
    None (no error) when the container does not run or is already paused.
    """
    path = _freezer(cid)
    if path is None:
        return "docker" if engine.try_pause(cid) else None
    v1 = path.name == "freezer.state"
    try:
        if _frozen(path):
            return None
        path.write_text("FROZEN" if v1 else "1")
        deadline = time.monotonic() + FREEZE_TIMEOUT_S
        while not _frozen(path):
            if time.monotonic() > deadline:
                path.write_text("THAWED" if v1 else "0")
                log.warning("freezing %s timed out; pausing it through docker", cid[:12])
                return "docker" if engine.try_pause(cid) else None
            time.sleep(0.0002)
    except OSError:  # the container stopped meanwhile
        return None
    return "freezer"


def thaw(engine: Engine, cid: str, how: str | None = "freezer") -> None:
    """Undo :func:`freeze` (idempotent; a no-op for a container that is not frozen)."""
    if how == "docker":
        engine.unpause(cid)
        return
    path = _freezer(cid)
    if path is not None:
        with suppress(OSError):
            path.write_text("THAWED" if path.name == "freezer.state" else "0")


def set_cpu_shares(engine: Engine, cid: str, shares: int) -> None:
    """Change a running container's CPU weight (its cgroup file: no dockerd round trip)."""
    weight = 1 + (shares - 2) * 9999 // 262142  # cgroup v2's scale, as runc maps it
    for path, value in (
        (f"/sys/fs/cgroup/cpu/docker/{cid}/cpu.shares", shares),
        (f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.weight", weight),
        (f"/sys/fs/cgroup/docker/{cid}/cpu.weight", weight),
    ):
        if os.path.exists(path):
            with suppress(OSError):
                Path(path).write_text(str(value))
                return
    engine.update_cpu_shares(cid, shares)


def memory_bytes(engine: Engine, cid: str) -> int | None:
    """Memory the container uses now (its cgroup's count), None when unknown."""
    for path in (
        f"/sys/fs/cgroup/memory/docker/{cid}/memory.usage_in_bytes",
        f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/memory.current",
        f"/sys/fs/cgroup/docker/{cid}/memory.current",
    ):
        with suppress(OSError, ValueError):
            return int(Path(path).read_text())
    return engine.stats_memory(cid)


def _freezer(cid: str) -> Path | None:
    """The freezer control file of a container's cgroup (v1 or v2), None when not found."""
    for path in (
        f"/sys/fs/cgroup/freezer/docker/{cid}/freezer.state",
        f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cgroup.freeze",
        f"/sys/fs/cgroup/docker/{cid}/cgroup.freeze",
    ):
        if os.path.exists(path):
            return Path(path)
    return None


def _frozen(path: Path) -> bool:
    if path.name == "freezer.state":
        return path.read_text().strip() == "FROZEN"
    return "frozen 1" in (path.parent / "cgroup.events").read_text()


def cpu_seconds(cid: str) -> float | None:
    """CPU time the container's processes used so far (None when unknown)."""
    v1 = Path(f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage")
    try:
        return int(v1.read_text()) / 1e9
    except (OSError, ValueError):
        pass
    for v2 in (
        Path(f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.stat"),
        Path(f"/sys/fs/cgroup/docker/{cid}/cpu.stat"),
    ):
        try:
            for line in v2.read_text().splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
        except (OSError, ValueError):
            continue
    return None
