"""Probe 5: where one live fork(8) spends its time, phase by phase, on a server of its own.

Run from the repository root (as root, with the images built):

    .venv/bin/python bench/live_fork_probe/p5_fork8_phases.py [--rounds 20] [--sustain-s 20]

It starts a denv server (a temporary state dir), a live echo env stepped 5 times, then:

- ``rounds`` times `fork_clients(root, 8)` and `state()` on each child (8 threads), timing
  the fork call and the 8 states; the server's own phases (gate, capture, clones, set-up)
  come from its log line for each live fork. (The client-side readiness waits inside the
  fork call were timed apart once, by patching the adapter's private `_waits`: 0.003 ms, as
  live children come back healthy; the probe uses the public API only, so no longer.)
- for ``sustain_s`` seconds, fork(8) after fork(8) through the API with the batches
  deleted behind (as ``bench_live.sustained``), with the CPU each party used per child
  (the env's container from its cgroup, the server and this process from schedstat).

Prints medians and writes ``p5_fork8_phases.json`` next to itself. Used to measure each
change of the live-fork path before and after (docs/live-forks.md, "Measured (built)").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from conftest import start_server  # noqa: E402  (the tests' own server runner)
from denv.openenv import DenvProvider, fork_clients  # noqa: E402
from openenv.core import GenericEnvClient  # noqa: E402

from bench.bench_live import cpu_ns, deleter  # noqa: E402
from denv import Denv  # noqa: E402

PHASES = ("gate_ms", "snapshot_ms", "fork_ms", "plumb_ms", "total")


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def fork8_rounds(root: Any, rounds: int) -> dict[str, float]:
    pool = ThreadPoolExecutor(8)
    total, forks, states = [], [], []
    try:
        for _ in range(rounds):
            t0 = time.perf_counter()
            kids = fork_clients(root, 8)
            t1 = time.perf_counter()
            got = list(pool.map(lambda k: k.state(), kids))
            t2 = time.perf_counter()
            assert all(s["step_count"] == 5 for s in got), got
            list(pool.map(lambda k: k.close(), kids))
            total.append((t2 - t0) * 1e3)
            forks.append((t1 - t0) * 1e3)
            states.append((t2 - t1) * 1e3)
            time.sleep(0.3)
    finally:
        pool.shutdown()
    return {
        "fork8_to_8_states_ms": median(total),
        "fork_clients_ms": median(forks),
        "states_ms": median(states),
    }


def sustain(url: str, key: str, env_id: str, server_pid: int, seconds: float) -> dict[str, float]:
    api = Denv(url, key)
    cid = subprocess.run(
        ["docker", "ps", "-q", "--no-trunc", "--filter", f"label=denv.env={env_id}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[0]
    acct = next(Path("/sys/fs/cgroup/cpuacct").glob(f"*/{cid}/cpuacct.usage"))
    deletes, outstanding = ThreadPoolExecutor(4), threading.BoundedSemaphore(6)
    made = 0

    delete = deleter(api, outstanding)
    c0, s0, m0 = int(acct.read_text()), cpu_ns(server_pid), cpu_ns(os.getpid())
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        outstanding.acquire()
        fork = api.fork(env_id, 8, kind="live")
        made += sum(str(e.status) == "healthy" for e in fork.envs)
        deletes.submit(delete, [e.id for e in fork.envs])
    elapsed = time.perf_counter() - t0
    deletes.shutdown(wait=True)
    c1, s1, m1 = int(acct.read_text()), cpu_ns(server_pid), cpu_ns(os.getpid())
    api.close()
    per = max(made, 1) * 1e6
    return {
        "children_per_s": made / elapsed,
        "cpu_ms_per_child_container": (c1 - c0) / per,
        "cpu_ms_per_child_server": (s1 - s0) / per,
        "cpu_ms_per_child_client": (m1 - m0) / per,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--sustain-s", type=float, default=20.0)
    args = ap.parse_args()
    state = Path(tempfile.mkdtemp(prefix="lfp-p5-"))
    out: dict[str, Any] = {}
    with start_server(state) as srv:
        provider = DenvProvider(server=srv.url, api_key=srv.key, fork="live", ttl_s=3600)
        url = provider.start_container("denv-echo-env:latest")
        provider.wait_for_ready(url)
        env_id = provider.env_id or ""
        root = GenericEnvClient(base_url=url, provider=provider).sync()
        root.reset()
        for i in range(5):
            root.step({"message": f"prefix {i}"})
        out["fork8"] = fork8_rounds(root, args.rounds)
        assert srv.proc is not None
        out["sustained"] = sustain(srv.url, srv.key, env_id, srv.proc.pid, args.sustain_s)
        log = (state / "server.out").read_text()
        out["server_phases_ms"] = {
            k: median([float(x) for x in re.findall(rf"{k} ([\d.]+)", log)]) for k in PHASES
        }
        provider.stop_container()
    print(json.dumps(out, indent=2))
    (HERE / "p5_fork8_phases.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
