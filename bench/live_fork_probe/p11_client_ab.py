"""Zygote starts by two denv *client* trees side by side, against one server, alternating.

p8 compares two servers under one client; this compares two clients (``--a``, ``--b``: a
source tree's root) under one server (this checkout's, with its zygotes). Each batch is a
process of its own, importing denv from its tree, that makes ``--per-batch`` starts as a
trainer that makes a provider per env does (`DenvProvider(...)`, `start_container`,
`wait_for_ready`, a client, `reset()`, `close()`); batches alternate between the trees.
A start is timed from the provider's construction to `reset()` answered. The first start
of each batch (a new process) is reported apart from the rest. Run from a checkout as
root: `.venv/bin/python bench/live_fork_probe/p11_client_ab.py --a /tmp/before --b . -n 6`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.harness import remove_leftovers, start_server, stop_process  # noqa: E402

IMAGE = "denv-echo-env:latest"

BATCH = """
import importlib.util, inspect, json, os, sys, time
# denv.openenv from the tree too: an editable install maps it to its own checkout.
here = os.environ["P11_TREE"] + "/adapters/openenv"
spec = importlib.util.spec_from_file_location(
    "denv.openenv", here + "/__init__.py", submodule_search_locations=[here]
)
module = importlib.util.module_from_spec(spec)
sys.modules["denv.openenv"] = module
spec.loader.exec_module(module)
from denv.openenv import DenvProvider
assert DenvProvider.__module__.startswith("denv.openenv") and inspect.getfile(
    DenvProvider).startswith(here + "/")
from openenv.core import GenericEnvClient
url, key, image, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
out = []
for _ in range(n):
    t0 = time.perf_counter()
    p = DenvProvider(server=url, api_key=key, ttl_s=600, timeout_s=300)
    base = p.start_container(image)
    p.wait_for_ready(base)
    client = GenericEnvClient(base_url=base, provider=p).sync()
    client.reset()
    out.append([time.perf_counter() - t0, str(p.start)])
    client.close()
print(json.dumps(out))
"""


def _batch(tree: Path, url: str, key: str, n: int) -> list[list[Any]]:
    root = tree.resolve()
    env = {**os.environ, "PYTHONPATH": f"{root}:{root}/generated", "P11_TREE": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", BATCH, url, key, IMAGE, str(n)],
        env=env,
        cwd="/",  # never this checkout's denv by way of the working directory
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    rows: list[list[Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return rows


def _summary(rows: list[float]) -> dict[str, Any]:
    xs = sorted(rows)
    return {
        "n": len(xs),
        "median_ms": round(statistics.median(xs) * 1e3, 1),
        "p90_ms": round(xs[int(0.9 * (len(xs) - 1))] * 1e3, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--a", type=Path, required=True)
    parser.add_argument("--b", type=Path, required=True)
    parser.add_argument("-n", type=int, default=6, help="batches per tree")
    parser.add_argument("--per-batch", type=int, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    state = Path("/tmp/denv-p11")
    server = start_server(state, ("--zygotes",))
    try:
        _batch(args.a, server.url, server.api_key, 2)  # a boot, which leaves the zygote
        time.sleep(5)  # the zygote's preload and warm-up
        got: dict[str, dict[str, list[float]]] = {t: {"first": [], "rest": []} for t in ("a", "b")}
        starts: set[str] = set()
        load_before = os.getloadavg()
        for i in range(args.n):
            for name in ("a", "b") if i % 2 == 0 else ("b", "a"):
                tree = args.a if name == "a" else args.b
                rows = _batch(tree, server.url, server.api_key, args.per_batch)
                starts.update(str(r[1]) for r in rows)
                got[name]["first"].append(float(rows[0][0]))
                got[name]["rest"] += [float(r[0]) for r in rows[1:]]
        out: dict[str, Any] = {
            "command": " ".join(["bench/live_fork_probe/p11_client_ab.py", *sys.argv[1:]]),
            "load_before": load_before,
            "load_after": os.getloadavg(),
            "starts": sorted(starts),
            "a_tree": str(args.a),
            "b_tree": str(args.b),
        }
        for name in ("a", "b"):
            out[name] = {part: _summary(xs) for part, xs in got[name].items()}
        out["rest_median_a_over_b"] = round(
            out["a"]["rest"]["median_ms"] / out["b"]["rest"]["median_ms"], 2
        )
        print(json.dumps(out, indent=1))
        if args.out:
            args.out.write_text(json.dumps(out, indent=1) + "\n")
    finally:
        stop_process(server.proc)
        remove_leftovers(server.state_dir)


if __name__ == "__main__":
    main()
