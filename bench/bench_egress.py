"""What egress costs: a cold start per egress mode, and the firewall's own operations.

    .venv/bin/python -m bench.bench_egress [--rounds 8] [--out bench/results]
    make bench-egress

One private server (started with ``--allow-private-egress``, so an allowlist may name the
host, as the capture-proxy set-up does). Each round creates an env of the echo image with
egress ``deny``, ``allow`` and an allowlist (``host.docker.internal:8100`` and a
198.18.0.0/15 address: the per-env rules of both chains), in a rotated order so drift on a
shared machine hits all alike, timing the create to healthy, then deletes them. Then the
firewall alone (``denv.server.net.firewall``), in this process: the rules of a new allowlist
bridge (``add_env``), their removal, and the periodic check (``ensure``, both families) with
0, 16 and 64 allowlist envs registered. Medians side by side and the ratios to ``deny``,
written to ``<out>/egress.json`` and ``<out>/egress.md``. Asserts nothing.
"""

from __future__ import annotations

import argparse
import logging
import secrets
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from denv.server.net.firewall import Firewall, resolvers, tools
from denv.server.node.egress import EnvRule

from .harness import IMAGE, Bench, start_server, write_json
from .measure import ROOT, conditions, machine, now_iso

log = logging.getLogger("bench.egress")

MODES: dict[str, Any] = {
    "deny": "deny",
    "allow": "allow",
    "allowlist": {"allow": ["host.docker.internal:8100", "198.18.0.1:443"]},
}
RULES = [EnvRule("198.18.0.1/32", 443), EnvRule("0.0.0.0/0", 8100, host=True)]
REGISTERED = (0, 16, 64)


def _ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 2) if values else float("nan")


def _firewall(n: int) -> dict[str, Any]:
    """add_env/remove_env of a fresh bridge, and ensure() with 0/16/64 envs registered."""
    fw = Firewall(resolvers())
    have = tools()
    tag = secrets.token_hex(3)
    add, remove = [], []
    for i in range(n):
        bridge = f"dvlb{tag}{i:05d}"[:15]
        t0 = time.perf_counter()
        fw.add_env(have, bridge, RULES, fresh=True)
        add.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        fw.remove_env(have, bridge)
        remove.append(time.perf_counter() - t0)
    ensure: dict[str, float] = {}
    made: list[str] = []  # bridges made here, removed at the end
    try:
        for count in REGISTERED:
            while len(made) < count:
                # A (down, empty) bridge of that name: ensure() drops the rules of missing ones.
                bridge = f"dvlb{tag}{len(made):05d}"[:15]
                subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], check=True)
                made.append(bridge)
                fw.add_env(have, bridge, RULES, fresh=True)
            runs = []
            for _ in range(max(3, n // 5)):
                t0 = time.perf_counter()
                for tool in have:
                    fw.ensure(tool)
                runs.append(time.perf_counter() - t0)
            ensure[str(count)] = _ms(runs)
    finally:
        for bridge in made:
            fw.remove_env(have, bridge)
            subprocess.run(["ip", "link", "del", bridge], check=False)
    return {"add_env_ms": _ms(add), "remove_env_ms": _ms(remove), "ensure_ms": ensure}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_egress")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--micro", type=int, default=30, help="firewall operations timed")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--state-dir", type=Path, default=Path("/tmp/denv-bench-egress"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("httpx", "denv", "websockets"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    run_id = secrets.token_hex(4)
    before = conditions()
    micro = _firewall(args.micro)
    log.info("firewall: %s", micro)
    samples: dict[str, list[float]] = {mode: [] for mode in MODES}
    server = start_server(args.state_dir.resolve(), ("--allow-private-egress",))
    bench = Bench(server=server, image=IMAGE, profile=None, run_id=run_id)
    try:
        order = list(MODES)
        for r in range(args.rounds):
            for mode in order[r % 3 :] + order[: r % 3]:
                with bench.denv() as api:
                    t0 = time.perf_counter()
                    env = api.create_sandbox(IMAGE, egress=MODES[mode], wait="healthy")
                    samples[mode].append(time.perf_counter() - t0)
                    api.delete_env(env.id)
            log.info("round %d: %s", r, {m: round(s[-1], 3) for m, s in samples.items()})
    finally:
        bench.cleanup()
    medians = {mode: _ms(values) for mode, values in samples.items()}
    result: dict[str, Any] = {
        "benchmark": "egress",
        "date": now_iso(),
        "run_id": run_id,
        "machine": machine(),
        "conditions": {"before": before, "after": conditions()},
        "rounds": args.rounds,
        "cold_start_ms": medians,
        "ratio_to_deny": {m: round(v / medians["deny"], 3) for m, v in medians.items()},
        "samples_s": {m: [round(v, 6) for v in s] for m, s in samples.items()},
        "firewall": micro,
        "micro_n": args.micro,
    }
    write_json(args.out / "egress.json", result)
    (args.out / "egress.md").write_text(_table(result))
    print(_table(result))
    return 0


def _table(result: dict[str, Any]) -> str:
    rows = [
        f"# egress ({result['date']}, {result['rounds']} rounds, run {result['run_id']})",
        "",
        "| egress | cold start to healthy (median ms) | ratio to deny |",
        "| --- | ---: | ---: |",
    ]
    for mode, ms in result["cold_start_ms"].items():
        rows.append(f"| {mode} | {ms} | {result['ratio_to_deny'][mode]} |")
    fw = result["firewall"]
    rows += [
        "",
        f"Firewall ({result['micro_n']} each, median ms): rules of a new allowlist bridge "
        f"{fw['add_env_ms']}, their removal {fw['remove_env_ms']}; the periodic check, both "
        "families, with " + ", ".join(f"{n} envs {ms}" for n, ms in fw["ensure_ms"].items()) + ".",
        "",
    ]
    return "\n".join(rows)


if __name__ == "__main__":
    raise SystemExit(main())
