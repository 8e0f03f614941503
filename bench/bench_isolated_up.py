"""What nodes that share nothing cost at start: ``denv cluster up`` shared against
``--isolated``, one after the other in one run (issue 27, item 1).

    sudo .venv/bin/python -m bench.bench_isolated_up [--nodes 2] [--image denv-echo-env:latest]

Each case runs ``denv cluster up --no-store`` then ``denv cluster down --purge`` as a user
does (the CLI in a process of its own), timed with ``time.monotonic``, with the machine's
load average beside it; results go to ``bench/results/isolated_up.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
CLI = [sys.executable, "-m", "denv", "cluster"]


def run_case(name: str, extra: list[str], nodes: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"denv-bench-{name}-") as tmp:
        where = ["--state-dir", str(Path(tmp) / "cluster")]
        load_before = os.getloadavg()[0]
        started = time.monotonic()
        up = subprocess.run(
            [*CLI, "up", "--nodes", str(nodes), "--no-store", *extra, *where],
            capture_output=True,
            text=True,
            timeout=900,
        )
        up_s = time.monotonic() - started
        started = time.monotonic()
        down = subprocess.run(
            [*CLI, "down", "--purge", *where], capture_output=True, text=True, timeout=300
        )
        down_s = time.monotonic() - started
        if up.returncode != 0 or down.returncode != 0:
            raise SystemExit(f"{name}: up/down failed:\n{up.stderr[-3000:]}\n{down.stderr[-2000:]}")
    return {
        "case": name,
        "up_s": round(up_s, 1),
        "down_s": round(down_s, 1),
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--image", default="denv-echo-env:latest")
    args = parser.parse_args()
    rows = [
        run_case("shared", [], args.nodes),
        run_case("isolated", ["--isolated", "--image", args.image], args.nodes),
    ]
    result = {"nodes": args.nodes, "image": args.image, "cpus": os.cpu_count(), "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "isolated_up.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"# `denv cluster up --nodes {args.nodes}`: shared engine vs `--isolated` "
        "(bench/bench_isolated_up.py)",
        "",
        f"Isolated nodes get `{args.image}` copied into each engine. {os.cpu_count()} cores.",
        "",
        "| case | up s | down s | load before | load after |",
        "|---|---|---|---|---|",
        *(
            f"| {r['case']} | {r['up_s']} | {r['down_s']} | {r['load_before']} | "
            f"{r['load_after']} |"
            for r in rows
        ),
        "",
    ]
    (RESULTS / "isolated_up.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
