"""A deleted live env's cgroup that is still busy when its release gives up (its process had
not left within a second: a loaded machine) is removed by a later release, not left in its
group's container for as long as the container runs.

Found by the long soak (bench/soak_long.py): at load 30 on 2 cores, a zygote's container
held the empty cgroups of 24 deleted copies, one more with each slow exit. A real cgroup of
this machine, made busy by a real process (no Docker needed).
"""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

import pytest

from denv.server.docker import live_apart


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
        live_apart._rmdir(group, deadline=time.monotonic() + 0.05)
        assert group.exists() and group in live_apart._busy  # busy: kept for later
        sleeper.kill()
        sleeper.wait()
        deadline = time.monotonic() + 10
        while group.exists() and time.monotonic() < deadline:
            live_apart._retry_busy()  # what each later release does
            time.sleep(0.05)
        assert not group.exists()
        assert group not in live_apart._busy
    finally:
        sleeper.kill()
        sleeper.wait()
        if group.exists():
            group.rmdir()
