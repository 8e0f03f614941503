"""Probe 7: the CPU of a live fork(8) by who spends it, two code trees side by side.

Run from the repository root (as root, with the images built):

    .venv/bin/python bench/live_fork_probe/p7_child_cpu.py [--rounds 10] \
        [--base DIR] [--new DIR]

It starts one denv server per code tree (``--base``: e.g. a ``git archive`` of the commit
before a change; ``--new``: this checkout), each with a live echo env stepped 5 times, and
alternates rounds between them. A round is one ``POST /envs/{id}/fork`` of 8 live children
(the server answers once each child serves), then 8 clients that each answer ``state()``
over a WebSocket through the ingress, then the 8 deletes. It reads:

- each child's CPU (``/proc/PID/task/*/schedstat``) when the fork has answered (clone to
  serving) and after its ``state()`` (the first session and request);
- the parent's (root's) CPU over the fork;
- the denv server's over the fork and over the deletes: its own threads (schedstat) and
  the subprocesses it waited for (``cutime``/``cstime`` of ``/proc/PID/stat``, in ticks);
- the wall time of the fork and of fork + 8 states.

Prints medians per tree and writes ``p7_child_cpu.json`` next to itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from conftest import start_server  # noqa: E402  (the tests' own server runner)
from denv.openenv import DenvProvider  # noqa: E402
from openenv.core import GenericEnvClient  # noqa: E402

from bench.bench_live import _pid_on_port, cpu_ns  # noqa: E402
from bench.measure import sh  # noqa: E402
from denv import Denv  # noqa: E402

TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


def waited_ms(pid: int) -> float:
    """CPU of the subprocesses ``pid`` has waited for (cutime + cstime)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[13]) + int(fields[14])) * TICK_MS


class Tree:
    """One server of one code tree, with a stepped live root."""

    def __init__(self, stack: ExitStack, name: str, code: Path) -> None:
        self.name = name
        # The server's code: its PYTHONPATH and its working directory (``python -m`` puts
        # the working directory first on sys.path).
        os.environ["PYTHONPATH"] = f"{code}:{code / 'generated'}"
        cwd = os.getcwd()
        os.chdir(code)
        try:
            srv = stack.enter_context(start_server(Path(tempfile.mkdtemp(prefix=f"p7-{name}-"))))
        finally:
            os.chdir(cwd)
        assert srv.proc is not None
        self.server_pid = srv.proc.pid
        self.api = Denv(srv.url, srv.key)
        stack.callback(self.api.close)
        self.provider = DenvProvider(server=srv.url, api_key=srv.key, fork="live", ttl_s=3600)
        # A launcher that knows DENV_LIVE_TRACE logs each child's CPU and faults by stage.
        url = self.provider.start_container(
            "denv-echo-env:latest", env_vars={"DENV_LIVE_TRACE": "1"}
        )
        self.provider.wait_for_ready(url)
        stack.callback(self.provider.stop_container)
        self.root: Any = GenericEnvClient(base_url=url, provider=self.provider).sync()
        stack.callback(self.root.close)
        self.root.reset()
        for i in range(5):
            self.root.step({"message": f"prefix {i}"})
        self.env_id = self.provider.env_id or ""
        self.container = sh(
            "docker", "ps", "-q", "--filter", f"label=denv.env={self.env_id}"
        ).split()[0]
        self.root_pid = _pid_on_port(self.container, 8000)
        self.rows: list[dict[str, float]] = []

    def server_ms(self) -> tuple[float, float]:
        return cpu_ns(self.server_pid) / 1e6, waited_ms(self.server_pid)

    def round(self, pool: ThreadPoolExecutor) -> None:
        s0, w0 = self.server_ms()
        r0 = cpu_ns(self.root_pid)
        t0 = time.perf_counter()
        fork = self.api.fork(self.env_id, 8, kind="live")
        t1 = time.perf_counter()
        s1, w1 = self.server_ms()
        r1 = cpu_ns(self.root_pid)
        envs = list(fork.envs)
        assert all(str(e.status) == "healthy" for e in envs), [e.status for e in envs]
        pids = [_pid_on_port(self.container, e.endpoints[0].port) for e in envs]
        served = [cpu_ns(p) / 1e6 for p in pids]
        t2 = time.perf_counter()
        clients = [GenericEnvClient(base_url=e.endpoints[0].url).sync() for e in envs]
        states = list(pool.map(lambda c: c.state(), clients))
        t3 = time.perf_counter()
        assert all(s["step_count"] == 5 for s in states), states
        answered = [cpu_ns(p) / 1e6 for p in pids]
        list(pool.map(lambda c: c.close(), clients))
        s2, w2 = self.server_ms()
        list(pool.map(lambda e: self.api.delete_env(e.id), envs))
        s3, w3 = self.server_ms()
        self.rows.append(
            {
                "fork_wall_ms": (t1 - t0) * 1e3,
                "states_wall_ms": (t3 - t2) * 1e3,
                "child_to_serving_ms": statistics.mean(served),
                "child_first_answer_ms": statistics.mean(answered),
                "child_session_ms": statistics.mean(
                    a - s for a, s in zip(answered, served, strict=True)
                ),
                "root_ms": (r1 - r0) / 1e6,
                "server_fork_ms": s1 - s0,
                "server_fork_subprocess_ms": w1 - w0,
                "server_states_ms": s2 - s1,
                "server_delete8_ms": s3 - s2,
                "server_delete8_subprocess_ms": w3 - w2,
            }
        )

    def summary(self) -> dict[str, float]:
        return {k: statistics.median(r[k] for r in self.rows) for k in self.rows[0]}

    def stages(self) -> dict[str, dict[str, float]]:
        """Median CPU (ms) and minor faults of a child per stage of its start, from the
        launcher's trace lines (none from a launcher without DENV_LIVE_TRACE)."""
        logs = subprocess.run(
            ["docker", "logs", self.container], capture_output=True, text=True, check=False
        ).stderr
        decode = json.JSONDecoder().raw_decode
        traces = [decode(part)[0] for part in logs.split("child stages ")[1:]]
        out: dict[str, dict[str, float]] = {}
        for i, (name, *_) in enumerate(traces[0] if traces else []):
            cpu = [t[i][1] - (t[i - 1][1] if i else 0.0) for t in traces]
            faults = [t[i][2] - (t[i - 1][2] if i else 0) for t in traces]
            out[name] = {
                "cpu_ms": statistics.median(cpu),
                "minflt": statistics.median(faults),
                "n": len(traces),
            }
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--new", type=Path, default=ROOT)
    args = ap.parse_args()
    out: dict[str, Any] = {"loadavg_before": os.getloadavg()}
    with ExitStack() as stack, ThreadPoolExecutor(8) as pool:
        trees = [Tree(stack, "base", args.base), Tree(stack, "new", args.new)]
        for i in range(args.rounds):
            for tree in trees[i % 2 :] + trees[: i % 2]:
                tree.round(pool)
                time.sleep(0.3)
        out["loadavg_after"] = os.getloadavg()
        for tree in trees:
            out[tree.name] = {"code": str(args.base if tree.name == "base" else args.new)}
            out[tree.name].update(tree.summary())
            out[tree.name]["child_stages"] = tree.stages()
            out[tree.name]["rows"] = tree.rows
    print(json.dumps({k: v for k, v in out.items()}, indent=1, default=str)[:6000])
    (HERE / "p7_child_cpu.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
