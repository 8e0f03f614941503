"""`python -m bench --smoke`: every benchmark still runs and makes a row (issue 44).

The benchmarks run in no other test, so a rename they depend on went unnoticed until the
next full run (`make bench-quick` failed on a private method of the adapter). This runs
the smoke profile (bench/__main__.py: one row of each benchmark, a few minutes) as
`make bench` would, on a server and a state dir of its own under tmp_path, and checks that
each benchmark in `BENCHMARKS` wrote a result file with numbers and no error in it. Its
numbers mean nothing and nothing here asserts on time; the wall time is printed.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import docker_engine

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ("denv-echo-env:latest", "denv-shapes-env:latest")
# It takes 5 to 10 minutes on 2 cores busy with other tests (one boot of the echo env is
# 5-10 s there, and the smoke boots dozens of envs and 6 servers of its own).
SMOKE_TIMEOUT_S = 1500.0
# On its timeout, SIGTERM: the bench then deletes what it started before it exits.
CLEANUP_TIMEOUT_S = 180.0
# What every result file carries besides the benchmark's own numbers.
RUN_FIELDS = {
    "benchmark", "runner", "profile", "profile_params", "image", "run_id", "machine",
    "conditions", "elapsed_s",
}  # fmt: skip


def benchmarks() -> list[str]:
    """The names in bench.__main__.BENCHMARKS (asked of the bench, run from the checkout)."""
    code = "from bench.__main__ import BENCHMARKS; print(' '.join(BENCHMARKS))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return done.stdout.split()


def errors(value: Any, path: str = "") -> Iterator[str]:
    """Where `value` holds an `error` (a benchmark, or one of its parts or runs, that failed)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "error":
                yield f"{path}: {item}"
            else:
                yield from errors(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from errors(item, f"{path}[{i}]")


def numbers(value: Any) -> Iterator[float]:
    """The finite numbers in `value` (booleans are not numbers here)."""
    if isinstance(value, dict):
        for item in value.values():
            yield from numbers(item)
    elif isinstance(value, list):
        for item in value:
            yield from numbers(item)
    elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        yield float(value)


def run_smoke(out: Path, state: Path) -> tuple[int, str]:
    """`python -m bench --smoke` to its end, or SIGTERMed after SMOKE_TIMEOUT_S; (exit, log)."""
    command = [
        *(sys.executable, "-m", "bench", "--smoke"),
        *("--out", str(out), "--state-dir", str(state)),
    ]
    proc = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        output, _ = proc.communicate(timeout=SMOKE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.terminate()
        output, _ = proc.communicate(timeout=CLEANUP_TIMEOUT_S)
        output += f"\n(test: stopped after {SMOKE_TIMEOUT_S:.0f}s)"
    return proc.returncode, output


@pytest.mark.timeout(SMOKE_TIMEOUT_S + CLEANUP_TIMEOUT_S + 60)
def test_every_benchmark_makes_a_row(tmp_path: Path) -> None:
    docker_engine(*IMAGES)
    out, state = tmp_path / "out", tmp_path / "state"
    started = time.monotonic()
    code, output = run_smoke(out, state)
    wall = time.monotonic() - started
    print(f"python -m bench --smoke took {wall:.0f}s (exit {code})")
    (tmp_path / "bench.log").write_text(output)  # the whole log, for a failure in CI
    failed = [line for line in output.splitlines() if " failed" in line]
    log = "\n".join(failed) + "\n...\n" + output[-4000:]
    assert code == 0, f"python -m bench --smoke exited {code}:\n{log}"

    results = {path.stem: json.loads(path.read_text()) for path in out.glob("*.json")}
    by_runner: dict[str, list[str]] = {}
    for name, result in results.items():
        assert result["profile"] == "smoke", name
        by_runner.setdefault(result["runner"], []).append(name)
    for bench in benchmarks():
        written = by_runner.get(bench)
        assert written, f"benchmark {bench} wrote no result file in {out}:\n{log}"
        for name in written:
            own = {k: v for k, v in results[name].items() if k not in RUN_FIELDS}
            failed = list(errors(own))
            assert not failed, f"{name}.json (benchmark {bench}) has errors: {failed}"
            assert any(True for _ in numbers(own)), f"{name}.json has no number: {own}"
    assert (out / "SUMMARY.md").is_file()
    # Its state dir and those of the servers of its own beside it (state-zygote ...) are gone.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.log", "out"]
