"""Density (issue 24 item 7): many live envs of the echo image at once on one server.

N live forks of one booted echo env (32 per fork request), each answering a WebSocket step
from a real OpenEnv client through ingress, each within a bound of private memory (its
processes' smaps_rollup ``Private_*``, read from the kernel), and nothing of them left once
they are deleted: no container, cgroup, mount or volume filesystem of the server, and no
iptables rule of theirs (the rules live in the container's network namespace, which goes
with it). ``make test`` runs 32 envs; ``make soak`` the issue's 1,000 (about 20 GB of
memory: run it on a machine that has it). The server is given the flags that raise its
per-key caps for the count (``bench.live_density.server_flags``); the benchmark
(``python -m bench --only live_density``) runs the same code and records the numbers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import docker_engine, start_server
from reliability_helpers import ECHO, assert_nothing_left, report, scale

from bench import live_density
from denv import Denv

pytestmark = pytest.mark.e2e

N = scale(32, 1000)
# The target is 15 MB; this image (Python 3.11, OpenEnv 0.10) measures ~17.3 MB
# per env after its step: ~6 MB written while the copy starts serving, ~10 MB of pages its
# first session writes (reference counts all over the copied heap). The bound catches a
# regression past that; the gap to 15 MB is in docs/live-forks.md.
PRIVATE_MAX_MB = 20


def test_many_live_envs_step_through_ingress_hold_little_and_leave_nothing(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    docker_engine(ECHO)
    state = tmp_path / "state"
    with start_server(state, *live_density.server_flags(N)) as srv:
        api = Denv(srv.url, srv.key, timeout_s=600)
        try:
            assert srv.proc is not None
            got = live_density.run(api, ECHO, N, srv.proc.pid, progress=lambda _: None)
        finally:
            api.close()
        assert "stopped_because" not in got, got.get("stopped_because")
        assert got["stepped"] == N, f"{got['stepped']} of {N} live envs answered a step"
        # An idle env's server sleeps (uvicorn woke ten times a second: a thousand idle envs
        # kept two cores busy), and the parent outlived its N children.
        assert got["idle_wakeups_per_s"] <= 3, got["idle_wakeups_per_s"]
        assert not got.get("root_ended"), "the parent of the live envs ended"
        private = got["private_bytes"]
        mb = private["uss_max"] / 2**20
        assert mb <= PRIVATE_MAX_MB, f"a live env holds {mb:.1f} MB (bound {PRIVATE_MAX_MB})"
        line = assert_nothing_left(
            request,
            state,
            f"density: {N} live envs stepped, private {private['uss_median'] / 2**20:.1f} MB "
            f"median, {mb:.1f} MB max; root {got['root_boot_s']:.1f}s, forks "
            f"{got['fork_all_s']:.1f}s, steps {got['step_all_s']:.1f}s, "
            f"deletes {got['delete_all_s']:.1f}s",
            quiet=True,
        )
    report(request, line)
