"""/work's size is enforced while the env writes: a disk filler gets ENOSPC, nothing else.

A server of its own with ``--max-volume-mb 64``: each volume's changes live on an ext4 of
64 MiB (``denv/server/volumes/filesystems.py``). Inside one env, ``dd`` writes to /work until the
kernel refuses; a sibling env still writes to its own /work, the host's disk lost at most the
volume's size, the full env stays healthy, snapshots and forks from it, and deleting the
envs leaves no mount and no loop device behind but the emptied filesystems the server pools
for the next volumes: the next env gets an empty /work of the full size from one, and a
stopped server leaves none.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import (
    LocalDenv,
    clean,
    docker_engine,
    leftovers,
    pooled_fs_contents,
    start_server,
)
from reliability_helpers import api, container_of, delete_all, ok, report

pytestmark = pytest.mark.e2e

PROBE = "denv-base-probe:latest"
SIZE_MB = 64
SERVE = ["python3", "-m", "http.server", "8000"]  # /health answers 404: no health path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    docker_engine(PROBE)
    with start_server(
        tmp_path_factory.mktemp("denv-volume-size"), "--max-volume-mb", str(SIZE_MB)
    ) as srv:
        yield srv


def env_of(c: httpx.Client) -> dict[str, Any]:
    body = {"image": PROBE, "command": SERVE, "health_path": "/", "wait": "healthy"}
    return ok(c.post("/v1/sandboxes", json=body))


def sh(env: dict[str, Any], script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", "exec", container_of(env), "sh", "-c", script],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def loop_devices(root: Path, *, pooled: bool = False) -> list[str]:
    """Loop devices whose backing file lies under ``root``: outside the server's pool of
    emptied volume filesystems (``volfs/pool``), or in it (``pooled``)."""
    pool = str(root / "volfs" / "pool") + "/"
    backing = {
        b.parent.parent.name: b.read_text().strip()
        for b in Path("/sys/block").glob("loop*/loop/backing_file")
    }
    return [
        dev
        for dev, path in backing.items()
        if path.startswith(str(root)) and path.startswith(pool) == pooled
    ]


def test_a_disk_filler_gets_enospc_and_nothing_else_is_touched(
    server: LocalDenv, request: pytest.FixtureRequest
) -> None:
    with api(server) as c:
        filler, sibling = env_of(c), env_of(c)
        host_free = free_bytes(server.state_dir)
        fill = sh(filler, "dd if=/dev/zero of=/work/fill bs=1M count=1000; sync")
        written = int(sh(filler, "stat -c %s /work/fill").stdout.strip() or 0)
        host_used = host_free - free_bytes(server.state_dir)
        again = sh(filler, "dd if=/dev/zero of=/work/more bs=1M count=2 && sync")
        neighbour = sh(sibling, "dd if=/dev/zero of=/work/one bs=1M count=8 && sync")
        host_write = (server.state_dir / "host-probe").write_bytes(b"x" * 1024)
        status = ok(c.get(f"/v1/envs/{filler['id']}"), 200)["status"]
        fork = ok(c.post(f"/v1/envs/{filler['id']}/fork", json={"count": 1, "wait": "healthy"}))
        child = fork["envs"][0]
        child_sees = sh(child, "stat -c %s /work/fill").stdout.strip()
        child_writes = sh(child, "dd if=/dev/zero of=/work/new bs=1M count=8 && sync")
        loops_live = len(loop_devices(server.state_dir))
        deleted = delete_all(c)
    loops_left = loop_devices(server.state_dir)
    report(
        request,
        f"volume size: a filler wrote {written / 2**20:.1f} MiB of {SIZE_MB} MiB before "
        f"'{'No space left on device' in fill.stderr and 'ENOSPC'}'; host disk used meanwhile "
        f"{host_used / 2**20:.1f} MiB; sibling wrote 8 MiB: rc {neighbour.returncode}; filler "
        f"{status}, forked (child sees {int(child_sees or 0) / 2**20:.1f} MiB, writes 8 MiB "
        f"more: rc {child_writes.returncode}); {loops_live} loop devices live, "
        f"{len(loops_left)} left after deleting {deleted} envs",
    )
    assert "No space left on device" in fill.stderr, fill.stderr
    assert 0.8 * SIZE_MB * 2**20 < written <= SIZE_MB * 2**20, written
    assert again.returncode != 0 and "No space left" in again.stderr, again
    assert host_used < (SIZE_MB + 16) * 2**20, host_used  # at most the volume (+ noise)
    assert host_write == 1024
    assert neighbour.returncode == 0, neighbour.stderr
    assert status == "healthy"
    assert child_sees == str(written)
    assert child_writes.returncode == 0, child_writes.stderr
    assert loops_live == 3  # one per env volume: filler, sibling, child
    assert loops_left == []


def test_a_deleted_volumes_filesystem_is_emptied_pooled_and_reused(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A deleted env's volume filesystem goes to the server's pool with nothing of the env
    left in it; the next env takes it (no new loop device) and sees an empty /work with
    the full size free; the server's exit unmounts the pool."""
    state = tmp_path / "state"
    with start_server(state, "--max-volume-mb", str(SIZE_MB), cleanup=False) as srv, api(srv) as c:
        first = env_of(c)
        wrote = sh(
            first,
            "mkdir -p /work/d && echo secret > /work/d/s && "
            "dd if=/dev/zero of=/work/big bs=1M count=40 && sync",
        )
        assert wrote.returncode == 0, wrote.stderr
        loops_before = loop_devices(state)
        assert len(loops_before) == 1, loops_before
        assert delete_all(c) == 1
        pooled = loop_devices(state, pooled=True)
        pool = sorted((state / "volfs" / "pool").glob("*/fs"))
        assert len(pool) == 1 and pooled == loops_before, (pool, pooled)
        assert pooled_fs_contents(str(pool[0])) == []
        assert free_bytes(pool[0]) > (SIZE_MB - 8) * 2**20, free_bytes(pool[0])

        second = env_of(c)
        seen = sh(second, "ls -A /work").stdout.split()
        assert loop_devices(state) == loops_before  # the same filesystem, taken from the pool
        assert loop_devices(state, pooled=True) == []
        full = sh(second, f"dd if=/dev/zero of=/work/fill bs=1M count={SIZE_MB - 8} && sync")
        assert seen == [], seen
        assert full.returncode == 0, full.stderr
        assert delete_all(c) == 1
        assert leftovers(state)["mounts"] == []
    left = leftovers(state, pool_ok=False)
    try:
        report(
            request,
            f"volume pool: the 2nd env took the 1st's filesystem (loop {loops_before}), saw "
            f"/work {seen or 'empty'}, wrote {SIZE_MB - 8} MiB; after exit: {left['mounts']}",
        )
        assert left["mounts"] == [] and loop_devices(state) + loop_devices(state, pooled=True) == []
    finally:
        clean(state)
