"""The long soak's loop (bench/soak_long.py, ``make soak-long``) for a few rounds: GRPO-shaped
groups (a live create, a live fork, WebSocket steps through ingress, a delete) from two
trainer processes, one trainer SIGKILLed mid-round, the server stopped and started again in
the middle, on a tight disk budget. Afterwards:

* no env is left that is not deleted (the killed trainer's went by its lease's expiry);
* no version a sandbox or a fork made is left once nothing needs it and the grace period
  and a collection have passed, and no layer is left that no version names;
* the instance left nothing on the machine once it stopped (containers, networks, volumes,
  cgroups, mounts, loop devices).

The full run's counts (2,000+ envs) and its measurements (p99 step, RSS trend, disk) are in
bench/results/soak-long.md; nothing here asserts on time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import clean, docker_engine, start_server
from reliability_helpers import ECHO, report

from bench.soak_long import Plan, run

pytestmark = pytest.mark.e2e

PLAN = Plan(
    rounds=4,
    trainers=2,
    group=2,
    steps=2,
    message_kb=16,
    kills=1,
    max_disk_mb=16,
    grace_s=2,
    gc_interval_s=1,
    lease_timeout_s=5,
)


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    docker_engine(ECHO)
    yield tmp_path / "state"
    clean(tmp_path / "state")


def test_grpo_rounds_with_kills_and_a_restart_leave_nothing(
    state: Path, request: pytest.FixtureRequest
) -> None:
    result = run(PLAN, state, lambda flags: start_server(state, *flags, cleanup=False))
    killed = result["killed_trainers"]
    report(
        request,
        f"soak-long: {PLAN.rounds} rounds, {result['envs_total']} envs, "
        f"{result['rounds']['done']} done, {killed['envs']} envs of a killed trainer "
        f"{killed['reasons']}, restart at round {result['restart']['at_round']}; "
        f"{len(result['leaked_envs'])} leaked, {len(result['versions_beyond_policy'])} "
        f"versions beyond policy, {len(result['unreferenced_layers'])} stray layers, "
        f"left on the machine: {result['machine_leftovers']}; server RSS (MiB) "
        + (
            ", ".join(
                f"{life}: {r['rss_start_mib']} at its start, {r['rss_end_mib']} at its end"
                for life, r in result["rss"].items()
            )
            or "not sampled"
        ),
    )
    assert result["leaked_envs"] == []
    assert result["versions_beyond_policy"] == []
    assert result["unreferenced_layers"] == []
    assert not any(result["machine_leftovers"].values()), result["machine_leftovers_named"]
    # the loop ran: every round started, one was killed with envs, the lease took them
    assert result["rounds"]["done"] + result["rounds"]["errors"] + result["rounds"]["killed"] == 4
    assert result["rounds"]["killed"] == 1 and killed["envs"] >= 1, result["killed"]
    assert killed["reasons"] == {"lease_expired": killed["envs"]}, killed
    assert result["rounds"]["done"] >= 2, result["errors"]
    assert result["step_seconds"]["n"] >= 2 * PLAN.group * PLAN.steps
