"""Where the seed's 8 single forks go: each `root.provider.fork()`, the child's client
connect and its `state()`, timed apart, and the server's own account of each fork (its
`live fork ... total` log line: the node's stages and the copy's total).

Runs one server of this checkout (`bench.harness.start_server`), the seed's usage on
OpenEnv's echo env as OpenEnv builds it (or the bench's echo image), ``--rounds`` times.
Run as root from a checkout: `.venv/bin/python bench/live_fork_probe/p12_seed_phases.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from denv.openenv import DenvProvider  # noqa: E402
from openenv.core import GenericEnvClient  # noqa: E402

from bench.harness import remove_leftovers, start_server, stop_process  # noqa: E402

TEMPLATE = "denv-openenv-template:latest"
LINE = re.compile(r"live fork \S+ into 1: (?P<stages>.*), total (?P<total>[\d.]+) ms")


def _round(url: str, key: str, image: str, steps: int = 10) -> list[list[float]]:
    provider = DenvProvider(server=url, api_key=key, ttl_s=600, timeout_s=300)
    root: Any = GenericEnvClient.from_docker_image(image, provider=provider).sync()
    branches: list[DenvProvider] = []
    rows: list[list[float]] = []
    try:
        root.reset()
        for i in range(steps):
            root.step({"message": f"prefix {i}"})
        for _ in range(8):
            t0 = time.perf_counter()
            branch = root.provider.fork()
            t1 = time.perf_counter()
            client: Any = GenericEnvClient(base_url=branch.base_url, provider=branch).sync()
            client.connect()
            t2 = time.perf_counter()
            client.state()
            t3 = time.perf_counter()
            branches.append(branch)
            rows.append([t1 - t0, t2 - t1, t3 - t2, t3 - t0])
        return rows
    finally:
        for b in branches:
            b.stop_container()
        root.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    image = (
        TEMPLATE
        if os.popen(f"docker image ls -q {TEMPLATE}").read().strip()
        else "denv-echo-env:latest"
    )
    state = Path("/tmp/denv-p12")
    server = start_server(state, ("--log-level", "INFO"))  # the forks' own log lines
    try:
        load_before = os.getloadavg()
        rows = [r for _ in range(args.rounds) for r in _round(server.url, server.api_key, image)]
        log = (state / "server.out").read_text(errors="replace")
        totals = [float(m["total"]) for m in LINE.finditer(log)]
        stages: dict[str, list[float]] = {}
        for m in LINE.finditer(log):
            for part in m["stages"].split(", "):
                name, _, value = part.rpartition(" ")
                stages.setdefault(name, []).append(float(value))
        med = {
            k: round(statistics.median(r[j] for r in rows) * 1e3, 1)
            for j, k in enumerate(("fork", "connect", "state", "total"))
        }
        out = {
            "image": image,
            "forks": len(rows),
            "eight_forks_s_median": round(
                statistics.median(
                    sum(r[3] for r in rows[i : i + 8]) for i in range(0, len(rows), 8)
                ),
                3,
            ),
            "client_median_ms": med,
            "server_copy_total_median_ms": round(statistics.median(totals), 1) if totals else None,
            "server_stage_median_ms": {
                k: round(statistics.median(v), 1) for k, v in stages.items()
            },
            "load_before": load_before,
            "load_after": os.getloadavg(),
        }
        print(json.dumps(out, indent=1))
        if args.out:
            args.out.write_text(json.dumps(out, indent=1) + "\n")
    finally:
        stop_process(server.proc)
        remove_leftovers(server.state_dir)


if __name__ == "__main__":
    main()
