"""End to end: examples/trl_grpo.py trains 2 GRPO steps with TRL on real denv envs.

It runs in .cache/trl-venv (torch on the CPU, TRL, transformers; built by `make trl-venv`,
which `make test` runs first) against the session's server, and must print one line per
step with its reward and timing, fork once per group, and leave no env behind.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import LocalDenv, docker_engine

from denv import Denv

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".cache" / "trl-venv" / "bin" / "python"
STEP = re.compile(
    r"^step (\d+): reward (-?[\d.]+) \(std [\d.]+\), ([\d.]+)s \((\d+) forks in ([\d.]+)s\)"
)


@pytest.mark.timeout(1200)
def test_two_grpo_steps_on_forked_echo_envs(denv_server: LocalDenv) -> None:
    if not PYTHON.exists():
        pytest.fail(f"{PYTHON} is missing: build the TRL venv with `make trl-venv`")
    docker_engine("denv-echo-env:latest")
    groups, prompts = 2, 2
    env = {
        **os.environ,
        "DENV_SERVER": denv_server.url,
        "DENV_API_KEY": denv_server.key,
        "PYTHONUNBUFFERED": "1",
    }
    run = subprocess.run(
        [
            str(PYTHON),
            "examples/trl_grpo.py",
            "--steps",
            "2",
            "--group",
            str(groups),
            "--prompts",
            str(prompts),
            "--prefix",
            "4",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1100,
    )
    out = run.stdout
    assert run.returncode == 0, f"{out[-3000:]}\n{run.stderr[-5000:]}"
    steps = [m for line in out.splitlines() if (m := STEP.match(line))]
    assert [int(m[1]) for m in steps] == [1, 2], out
    for m in steps:
        assert math.isfinite(float(m[2])) and float(m[2]) > 0  # the echo env pays per character
        assert int(m[4]) == prompts  # one fork per group: its prompt's G rollouts share it
    assert "every env it started is deleted" in out
    with Denv(denv_server.url, denv_server.key) as denv:
        left = [e.id for e in denv.list_envs() if e.labels.get("example") == "trl-grpo"]
    assert left == [], f"envs the example left: {left}"
