"""Zygote starts of two denv checkouts side by side, alternating, under the same load.

Starts one server from each checkout (``--a`` and ``--b``: a source tree's root; each
server imports denv, and mounts the live launcher, from its own tree), boots the echo env
once on each (which leaves its zygote), waits for both zygotes, then alternates N starts
between them: `start_container` to a client whose `reset()` answered (the bench's zygote
measure), each env deleted outside the timing. Prints medians, p90 and the ratio.
Run from a checkout as root: `.venv/bin/python bench/live_fork_probe/p8_zygote_ab.py
--a /work/main --b . -n 20`.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from denv.openenv import DenvProvider  # noqa: E402
from openenv.core import GenericEnvClient  # noqa: E402

from bench.harness import Server, remove_leftovers, start_server, stop_process  # noqa: E402

IMAGE = "denv-echo-env:latest"


def _zygote_ready(state: Path) -> bool:
    with sqlite3.connect(state / "denv.db") as con:
        q = "SELECT COUNT(*) FROM envs WHERE owner LIKE 'zygote:%' AND status='healthy'"
        return bool(con.execute(q).fetchone()[0])


def _start(server: Server) -> tuple[float, str]:
    p = DenvProvider(server=server.url, api_key=server.api_key, ttl_s=600, timeout_s=300)
    t0 = time.perf_counter()
    url = p.start_container(IMAGE)
    p.wait_for_ready(url)
    client: Any = GenericEnvClient(base_url=url, provider=p).sync()
    client.reset()
    elapsed = time.perf_counter() - t0
    start = str(p.start)
    client.close()
    return elapsed, start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--a", type=Path, required=True)
    parser.add_argument("--b", type=Path, required=True)
    parser.add_argument("-n", type=int, default=20)
    args = parser.parse_args()
    servers: dict[str, Server] = {}
    saved = os.environ.get("PYTHONPATH")
    try:
        for name, tree in (("a", args.a), ("b", args.b)):
            os.environ["PYTHONPATH"] = f"{tree.resolve()}:{tree.resolve()}/generated"
            servers[name] = start_server(Path(f"/tmp/denv-p8-{name}"), ("--zygotes",))
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    try:
        for s in servers.values():
            _start(s)  # a boot, which leaves the zygote behind
        while not all(_zygote_ready(s.state_dir) for s in servers.values()):
            time.sleep(0.2)
        times: dict[str, list[float]] = {"a": [], "b": []}
        for i in range(args.n):
            for name in ("a", "b") if i % 2 == 0 else ("b", "a"):
                elapsed, start = _start(servers[name])
                if start == "zygote":
                    times[name].append(elapsed)
                else:
                    print(f"{name}: a start that was {start}, not a copy ({elapsed:.1f} s)")
        for name, tree in (("a", args.a), ("b", args.b)):
            xs = sorted(times[name])
            p90 = xs[int(0.9 * (len(xs) - 1))]
            print(
                f"{name} ({tree}): n {len(xs)}, median {statistics.median(xs) * 1e3:.0f} ms, "
                f"p90 {p90 * 1e3:.0f} ms, min {xs[0] * 1e3:.0f} ms"
            )
        ratio = statistics.median(times["a"]) / statistics.median(times["b"])
        print(f"median a / b: {ratio:.2f}; load average {os.getloadavg()}")
    finally:
        for s in servers.values():
            stop_process(s.proc)
            remove_leftovers(s.state_dir)


if __name__ == "__main__":
    main()
