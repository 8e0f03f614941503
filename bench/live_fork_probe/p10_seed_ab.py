"""The seed's usage on two denv checkouts side by side, alternating, under the same load.

The seed's usage as `bench_live.seed` times it, with `DenvProvider()`'s defaults: a root from
`from_docker_image` (a copy of the key's zygote once one is there), `reset()`, a prefix of 10
steps, then 8 single `root.provider.fork()` calls, timed until each child answered `state()`
(its step count checked). One server per checkout (``--a``, ``--b``), each started outside
the checkout (see p8_zygote_ab.py), a first round on each (a boot, which leaves the zygote),
then N rounds alternating. Prints medians and their ratio; ``--out FILE`` writes JSON.
Run from a checkout as root: `.venv/bin/python bench/live_fork_probe/p10_seed_ab.py
--a /tmp/base --b . -n 6`.
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

from denv.openenv import DenvProvider  # noqa: E402
from openenv.core import GenericEnvClient  # noqa: E402

from bench.harness import Server, remove_leftovers, start_server, stop_process  # noqa: E402

TEMPLATE = "denv-openenv-template:latest"  # OpenEnv's echo env as OpenEnv builds it
STEPS = 10


def _image() -> str:
    out = subprocess.run(["docker", "image", "ls", "-q", TEMPLATE], capture_output=True, text=True)
    return TEMPLATE if out.stdout.strip() else "denv-echo-env:latest"


def _steps(state: Any) -> Any:
    return state["step_count"] if isinstance(state, dict) else getattr(state, "step_count", None)


def _seed(server: Server, image: str) -> tuple[float, bool, list[str]]:
    """Seconds for 8 forks to 8 answered state(); whether each kept the prefix; the starts."""
    provider = DenvProvider(server=server.url, api_key=server.api_key, ttl_s=3600, timeout_s=300)
    root: Any = GenericEnvClient.from_docker_image(image, provider=provider).sync()
    branches: list[DenvProvider] = []
    try:
        root.reset()
        for i in range(STEPS):
            root.step({"message": f"prefix {i}"})
        t0 = time.perf_counter()
        branches = [root.provider.fork() for _ in range(8)]
        clients = [GenericEnvClient(base_url=p.base_url, provider=p).sync() for p in branches]
        states = [c.state() for c in clients]
        elapsed = time.perf_counter() - t0
        ok = all(_steps(s) == STEPS for s in states)
        return elapsed, ok, sorted({str(p.start) for p in branches})
    finally:
        for p in branches:
            p.stop_container()
        root.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--a", type=Path, required=True)
    parser.add_argument("--b", type=Path, required=True)
    parser.add_argument("-n", type=int, default=6)
    parser.add_argument("--out", type=Path, help="write the medians here as JSON")
    args = parser.parse_args()
    image = _image()
    servers: dict[str, Server] = {}
    saved, cwd = os.environ.get("PYTHONPATH"), os.getcwd()
    os.chdir("/")  # python -m puts the working directory first on sys.path
    try:
        for name, tree in (("a", args.a), ("b", args.b)):
            os.environ["PYTHONPATH"] = f"{tree.resolve()}:{tree.resolve()}/generated"
            servers[name] = start_server(Path(f"/tmp/denv-p10-{name}"), ("--zygotes",))
    finally:
        os.chdir(cwd)
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    try:
        for s in servers.values():
            _seed(s, image)  # the first start boots and leaves the zygote behind
        time.sleep(15)
        times: dict[str, list[float]] = {"a": [], "b": []}
        load_before = os.getloadavg()
        for i in range(args.n):
            for name in ("a", "b") if i % 2 == 0 else ("b", "a"):
                elapsed, ok, starts = _seed(servers[name], image)
                times[name].append(elapsed)
                print(f"{name}: 8 forks {elapsed * 1e3:.0f} ms, prefix kept {ok}, {starts}")
        out: dict[str, Any] = {"image": image, "n": args.n, "load_before": load_before}
        out["load_after"] = os.getloadavg()
        for name, tree in (("a", args.a), ("b", args.b)):
            xs = times[name]
            out[name] = {"tree": str(tree), "median_s": statistics.median(xs), "runs_s": xs}
            print(f"{name} ({tree}): median {statistics.median(xs) * 1e3:.0f} ms")
        out["median_a_over_b"] = round(out["a"]["median_s"] / out["b"]["median_s"], 2)
        print(f"median a / b: {out['median_a_over_b']}; load {load_before} -> {out['load_after']}")
        if args.out:
            args.out.write_text(json.dumps(out, indent=1) + "\n")
    finally:
        for s in servers.values():
            stop_process(s.proc)
            remove_leftovers(s.state_dir)


if __name__ == "__main__":
    main()
