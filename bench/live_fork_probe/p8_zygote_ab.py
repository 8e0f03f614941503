"""Zygote starts of two denv checkouts side by side, alternating, under the same load.

Starts one server from each checkout (``--a`` and ``--b``: a source tree's root; each
server imports denv, and mounts the live launcher, from its own tree), boots the echo env
once on each (which leaves its zygote), waits for both zygotes, then alternates N starts
between them: `start_container` to a client whose `reset()` answered (the bench's zygote
measure), each env deleted outside the timing, with its phases: `start_container` (the
provider's lease and the create), the client's WebSocket connect, its first `reset()`.
Prints medians, p90 and the ratio; with ``--out FILE``, writes them as JSON.
Run from a checkout as root: `.venv/bin/python bench/live_fork_probe/p8_zygote_ab.py
--a /work/main --b . -n 20`.

The servers start with the working directory at ``/``: ``python -m denv`` puts its working
directory first on ``sys.path``, so started from a checkout both servers would import that
checkout's denv whatever their PYTHONPATH (before this was fixed, an A/B run from a checkout
compared that checkout with itself).
"""

from __future__ import annotations

import argparse
import json
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


PHASES = ("start_container", "connect", "reset", "total")


def _start(server: Server) -> tuple[list[float], str]:
    """Seconds of each of PHASES; the env's start."""
    t0 = time.perf_counter()
    p = DenvProvider(server=server.url, api_key=server.api_key, ttl_s=600, timeout_s=300)
    url = p.start_container(IMAGE)
    t1 = time.perf_counter()
    p.wait_for_ready(url)
    client: Any = GenericEnvClient(base_url=url, provider=p).sync()
    client.connect()
    t2 = time.perf_counter()
    client.reset()
    t3 = time.perf_counter()
    start = str(p.start)
    client.close()
    return [t1 - t0, t2 - t1, t3 - t2, t3 - t0], start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--a", type=Path, required=True)
    parser.add_argument("--b", type=Path, required=True)
    parser.add_argument("-n", type=int, default=20)
    parser.add_argument("--out", type=Path, help="write the medians here as JSON")
    args = parser.parse_args()
    servers: dict[str, Server] = {}
    saved = os.environ.get("PYTHONPATH")
    cwd = os.getcwd()
    os.chdir("/")
    try:
        for name, tree in (("a", args.a), ("b", args.b)):
            os.environ["PYTHONPATH"] = f"{tree.resolve()}:{tree.resolve()}/generated"
            servers[name] = start_server(Path(f"/tmp/denv-p8-{name}"), ("--zygotes",))
    finally:
        os.chdir(cwd)
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    try:
        for s in servers.values():
            _start(s)  # a boot, which leaves the zygote behind
        while not all(_zygote_ready(s.state_dir) for s in servers.values()):
            time.sleep(0.2)
        time.sleep(3)  # the zygote's preload and warm-up
        times: dict[str, list[list[float]]] = {"a": [], "b": []}
        load_before = os.getloadavg()
        for i in range(args.n):
            for name in ("a", "b") if i % 2 == 0 else ("b", "a"):
                phases, start = _start(servers[name])
                if start == "zygote":
                    times[name].append(phases)
                else:
                    print(f"{name}: a start that was {start}, not a copy ({phases[-1]:.1f} s)")
        out: dict[str, Any] = {"n": args.n, "load_before": load_before}
        out["load_after"] = os.getloadavg()
        for name, tree in (("a", args.a), ("b", args.b)):
            rows = times[name]
            med = {k: statistics.median(r[j] for r in rows) * 1e3 for j, k in enumerate(PHASES)}
            xs = sorted(r[-1] for r in rows)
            p90 = xs[int(0.9 * (len(xs) - 1))] * 1e3
            out[name] = {"tree": str(tree), "median_ms": med, "p90_ms": p90, "starts": len(xs)}
            print(
                f"{name} ({tree}): n {len(xs)}, median {med['total']:.0f} ms (start_container "
                f"{med['start_container']:.0f}, connect {med['connect']:.0f}, reset "
                f"{med['reset']:.0f}), p90 {p90:.0f} ms, min {xs[0] * 1e3:.0f} ms"
            )
        ratio = out["a"]["median_ms"]["total"] / out["b"]["median_ms"]["total"]
        out["median_a_over_b"] = round(ratio, 2)
        print(f"median a / b: {ratio:.2f}; load average {load_before} -> {out['load_after']}")
        if args.out:
            args.out.write_text(json.dumps(out, indent=1) + "\n")
    finally:
        for s in servers.values():
            stop_process(s.proc)
            remove_leftovers(s.state_dir)


if __name__ == "__main__":
    main()
