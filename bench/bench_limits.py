"""What the limits cost: a cold start, a warm fork(8) and a snapshot, with and without them.

    .venv/bin/python -m bench.bench_limits [--rounds 8] [--out bench/results]
    make bench-limits

Issue 17's targets: the limits add at most 5% to a cold start and at most 5 ms to a warm
fork(8). Two private servers run side by side on the echo env image:

- ``limits``: `denv serve` as shipped: 2 GiB, 1024 pids and 2 CPUs per container, and each
  volume's changes on an ext4 of its own of 10 GiB (`--max-volume-mb`, writes past it fail
  with ENOSPC);
- ``none``: `--env-memory 0 --env-pids 0 --env-cpus 0 --max-volume-mb 0`.

First, the volume filesystem alone, in this process, alternating with and without a size
(`--micro N` times each): what a volume's set-up costs (`Volumes.prepare` + `attach`: a
cold start does both, a warm spare the first when it boots), what the late mount of a fork
costs (`attach` alone), the teardown, and a snapshot of 32 MB written to the volume
(`Volumes.capture`). Then each round measures, on both servers in a rotated order so
drift on a shared machine hits both alike: a cold start (`DenvProvider` start + ready,
then stop), a warm fork(8) (`fork_clients` of a live env whose pool holds 8 booted spares,
to 8 ready children; the pool refills and the machine settles first) and a snapshot after
the env rewrote a 32 MB file in /work. Medians side by side, the ratio and the difference,
written to ``<out>/limits.json`` and ``<out>/limits.md``. Asserts nothing.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import shutil
import signal
import statistics
import time
from pathlib import Path
from typing import Any

from denv.server.volumes.overlay import Volumes

from .bench_start import Root, _denv_once, fork_once
from .harness import IMAGE, Bench, start_server, write_json
from .measure import ROOT, conditions, machine, now_iso, sh

log = logging.getLogger("bench.limits")

SERVERS: dict[str, tuple[str, ...]] = {
    "limits": (),
    "none": ("--env-memory", "0", "--env-pids", "0", "--env-cpus", "0", "--max-volume-mb", "0"),
}
SNAPSHOT_MB = 32
KINDS = ("cold_start_s", "fork8_warm_s", "fork8_warm_server_s", "snapshot_s")


def _snapshot_once(b: Bench, env_id: str, cid: str) -> float:
    """Rewrite a SNAPSHOT_MB file in /work, then time the snapshot (its version deleted)."""
    sh("docker", "exec", cid, "sh", "-c", f"head -c {SNAPSHOT_MB}M /dev/urandom > /work/blob")
    sh("sync")
    with b.denv(timeout_s=600) as api:
        t0 = time.perf_counter()
        version = api.snapshot(env_id)
        elapsed = time.perf_counter() - t0
        api.delete_version(version.id)
    return elapsed


def _container(env_id: str) -> str:
    ids = sh("docker", "ps", "-q", "--filter", f"label=denv.env={env_id}").split()
    if not ids:
        raise RuntimeError(f"no running container has label denv.env={env_id}")
    return ids[0]


def _round(b: Bench, root: Root, snap_env: str, snap_cid: str) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    out["cold_start_s"] = _denv_once(b)["ready_s"]
    b.settle(max_s=120)  # the warm pool refilled after the last fork
    fork = fork_once(b, root, 8)
    out["fork8_warm_s"] = fork["ready_s"]
    out["fork8_warm_server_s"] = fork["server_fork_s"]
    out["fork8_warm_children"] = float(sum(s == "warm" for s in fork["starts"]))
    if not all(s == "warm" for s in fork["starts"]):
        log.warning("%s: fork children started %s", b.run_id, fork["starts"])
    out["snapshot_s"] = _snapshot_once(b, snap_env, snap_cid)
    return out


def _volume_once(vols: Volumes, env_id: str) -> dict[str, float]:
    t0 = time.perf_counter()
    vols.prepare(env_id, "agent", 0)
    t1 = time.perf_counter()
    vols.attach(env_id, "agent", 0, [])
    t2 = time.perf_counter()
    mnt = vols.mnt(env_id, "agent", 0)
    with open(mnt / "blob", "wb") as f:
        for _ in range(SNAPSHOT_MB):
            f.write(os.urandom(1 << 20))
        os.fsync(f.fileno())
    t3 = time.perf_counter()
    layer = vols.capture(vols.upper(env_id, "agent", 0))
    t4 = time.perf_counter()
    vols.remove_env(env_id)
    t5 = time.perf_counter()
    if layer:
        vols.delete_layers({layer})
    return {
        "prepare_s": t1 - t0,
        "attach_s": t2 - t1,
        "setup_s": t2 - t0,
        "capture_32mb_s": t4 - t3,
        "teardown_s": t5 - t4,
    }


MICRO_KINDS = ("setup_s", "prepare_s", "attach_s", "capture_32mb_s", "teardown_s")


def _micro(root: Path, n: int) -> dict[str, list[dict[str, float]]]:
    """The volume filesystem alone: sized (10 GiB, the default) against a plain dir."""
    vols = {
        "limits": Volumes(root / "limits", 10240),
        "none": Volumes(root / "none", 0),
    }
    fs = vols["limits"].fs
    assert fs is not None
    fs.check()
    out: dict[str, list[dict[str, float]]] = {name: [] for name in vols}
    try:
        for i in range(n):
            for name in list(vols) if i % 2 == 0 else reversed(list(vols)):
                out[name].append(_volume_once(vols[name], f"env_bench{i}"))
    finally:
        for v in vols.values():
            for d in v.envs_dir.iterdir():
                v.remove_env(d.name)
        shutil.rmtree(root, ignore_errors=True)
    return out


def _median_ms(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return round(statistics.median(got) * 1000, 1) if got else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_limits")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--micro", type=int, default=30, help="volume set-ups timed each way")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--state-dir", type=Path, default=Path("/tmp/denv-bench-limits"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("httpx", "denv", "websockets"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    run_id = secrets.token_hex(4)
    before = conditions()
    micro = _micro((args.state_dir / "micro").resolve(), args.micro)
    log.info(
        "volume micro: %s", {n: _median_ms([s["setup_s"] for s in v]) for n, v in micro.items()}
    )
    benches: dict[str, Bench] = {}
    samples: dict[str, list[dict[str, float | None]]] = {name: [] for name in SERVERS}
    try:
        for name, extra in SERVERS.items() if args.rounds > 0 else ():
            server = start_server((args.state_dir / name).resolve(), extra)
            benches[name] = Bench(server=server, image=IMAGE, profile=None, run_id=run_id)
        roots = {n: Root(b, warm=8, tag=n) for n, b in benches.items()}
        snaps: dict[str, tuple[str, str]] = {}
        for n, b in benches.items():
            with b.denv() as api:
                env = api.create_sandbox(IMAGE, wait="healthy", ttl_s=7200)
            snaps[n] = (env.id, _container(env.id))
        order = list(SERVERS)
        for r in range(args.rounds):
            for n in order if r % 2 == 0 else reversed(order):
                got = _round(benches[n], roots[n], *snaps[n])
                samples[n].append(got)
                log.info("round %d %s: %s", r, n, {k: round(v or 0, 4) for k, v in got.items()})
        for root in roots.values():
            root.close()
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not strand envs
        for b in benches.values():
            b.cleanup()
    result: dict[str, Any] = {
        "benchmark": "limits",
        "date": now_iso(),
        "run_id": run_id,
        "machine": machine(),
        "conditions": {"before": before, "after": conditions()},
        "rounds": args.rounds,
        "micro_n": args.micro,
        "servers": {n: list(extra) for n, extra in SERVERS.items()},
        "samples": samples,
        "micro": micro,
        "micro_median_ms": {
            n: {k: _median_ms([s[k] for s in micro[n]]) for k in MICRO_KINDS} for n in SERVERS
        },
        "median_ms": {
            n: {k: _median_ms([s.get(k) for s in samples[n]]) for k in KINDS} for n in SERVERS
        },
    }
    write_json(args.out / "limits.json", result)
    (args.out / "limits.md").write_text(_table(result))
    print(_table(result))
    return 0


def _table(result: dict[str, Any]) -> str:
    med = result["median_ms"]
    lines = [
        f"# What the limits cost ({result['date']}, {result['rounds']} rounds, "
        f"{result['machine']['cores']} cores, load before {result['conditions']['before']})",
        "",
        "`python -m bench.bench_limits` (`make bench-limits`): medians, the two servers "
        "measured side by side in rotated order.",
        "",
        "| measure | limits (defaults) | none | ratio | difference |",
        "|---|---:|---:|---:|---:|",
    ]
    rows = [(k, med) for k in KINDS]
    rows += [
        (f"volume {k} ({result['micro_n']} each)", result["micro_median_ms"]) for k in MICRO_KINDS
    ]
    for kind, table in rows:
        key = kind.split(" ")[1] if kind.startswith("volume ") else kind
        a, b = table["limits"][key], table["none"][key]
        if a is None and b is None:  # not measured in this run (--rounds 0)
            continue
        ratio = f"{a / b:.3f}" if a and b else "-"
        diff = f"{a - b:+.1f} ms" if a is not None and b is not None else "-"
        lines.append(f"| {kind} | {a} ms | {b} ms | {ratio} | {diff} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
