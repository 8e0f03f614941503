"""A deleted live env's cgroup that is still busy when its release gives up (its process had
not left within a second: a loaded machine) is removed by a later release, not left in its
group's container for as long as the container runs.

Found by the long soak (bench/soak_long.py): at load 30 on 2 cores, a zygote's container
held the empty cgroups of 24 deleted copies, one more with each slow exit. A real cgroup of
this machine, made busy by a real process (no Docker needed).
"""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from denv.server.docker.live import cgroups


def cgroup_root() -> Path:
    for root in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):
        if (root / "cgroup.procs").exists():
            return root
    pytest.fail("no cgroup hierarchy with cgroup.procs under /sys/fs/cgroup: run as root")


def test_a_busy_cgroup_is_removed_by_a_later_release() -> None:
    group = cgroup_root() / f"denv-test-busy-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (group / "cgroup.procs").write_text(str(sleeper.pid))
        cgroups.rmdir(group, deadline=time.monotonic() + 0.05)
        assert group.exists() and group in cgroups._busy  # busy: kept for later
        sleeper.kill()
        sleeper.wait()
        deadline = time.monotonic() + 10
        while group.exists() and time.monotonic() < deadline:
            cgroups.retry_busy()  # what each later release does
            time.sleep(0.05)
        assert not group.exists()
        assert group not in cgroups._busy
    finally:
        sleeper.kill()
        sleeper.wait()
        if group.exists():
            group.rmdir()


def test_concurrent_starts_and_deletes_keep_the_containers_limits_exact() -> None:
    """Copies of one zygote start and end at once, and each raises or lowers its container's
    memory limits by one env's share (memory+swap before memory going up, memory first going
    down). Found by the sustained zygote bench (4 clients): two unsynchronized shifts read the
    same values, one's write was lost, and the next wrote a memory limit above memory+swap
    (EINVAL): the copy failed, its zygote was dropped and the start booted instead. A real v1
    memory cgroup stands in for the container (no Docker needed)."""
    root = Path("/sys/fs/cgroup/memory")
    if not (root / "memory.memsw.limit_in_bytes").exists():
        pytest.fail("no cgroup v1 memory controller with swap accounting: run as root on v1")
    container = root / f"denv-test-shift-{uuid.uuid4().hex[:8]}"
    container.mkdir()
    mib = 1 << 20
    one: dict[str, int | None] = {
        "memory.memsw.limit_in_bytes": 300 * mib,
        "memory.limit_in_bytes": 200 * mib,
    }
    try:
        # from unlimited: memory first (it may never exceed memory+swap)
        (container / "memory.limit_in_bytes").write_text(str(2200 * mib))
        (container / "memory.memsw.limit_in_bytes").write_text(str(3300 * mib))
        errors: list[BaseException] = []

        def churn(sign: int) -> None:
            try:
                for _ in range(300):
                    cgroups._shift(container, "memory", one, sign)
                    cgroups._shift(container, "memory", one, -sign)
            except BaseException as exc:  # reported below
                errors.append(exc)

        # up-then-down and down-then-up at once: a lost write shows as a drift or EINVAL
        threads = [threading.Thread(target=churn, args=(s,)) for s in (1, -1, 1, -1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        assert cgroups._values(container, "memory") == {
            "memory.memsw.limit_in_bytes": 3300 * mib,
            "memory.limit_in_bytes": 2200 * mib,
        }
    finally:
        container.rmdir()
