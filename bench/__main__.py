"""python -m bench [--quick | --smoke] [--only start,...]: run the benchmarks, write results, plots.

Starts a private denv server (state dir --state-dir, default /tmp/denv-bench-<uid>),
runs each benchmark, writes <out>/<name>.json as each finishes, then <out>/SUMMARY.md and
the PNG plots. The full run's <out> is bench/results (the committed results); --quick and
--smoke write elsewhere (.cache/bench-quick, .cache/bench-smoke) and refuse bench/results.
Everything the run started is deleted at the end, also on Ctrl-C or SIGTERM. Benchmarks
report; they never assert on time. --smoke is CI's check that every benchmark still runs
(tests/e2e/test_bench_smoke.py): one row of each, numbers that mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from . import (
    bench_density,
    bench_fork,
    bench_isolation,
    bench_latency,
    bench_live,
    bench_live_netns,
    bench_shapes,
    bench_snapshot,
    bench_start,
    bench_trainer,
    bench_upload,
    bench_zygote,
    live_density,
    report,
)
from .harness import IMAGE, Bench, start_server, write_json
from .measure import ROOT, conditions, machine, sh

log = logging.getLogger("bench")

MB = 1024 * 1024


@dataclass(frozen=True)
class Profile:
    """How much each benchmark measures. `full` takes ~35 min on 2 quiet cores (the tree
    search ~10 of them); `quick` 10-15 on 2 busy cores; `smoke` 5-10 there, the least that
    still makes a row of every benchmark."""

    name: str
    start_runs: int
    fork8_n: int
    fork8_cold_runs: int
    fork8_warm_runs: int
    fork_ks: tuple[int, ...]
    fork_ns: tuple[int, ...]
    fork_reps: int
    fork_warm: bool
    snapshot_sizes_mb: tuple[int, ...]
    snapshot_changes: tuple[int, ...]
    snapshot_reps: int
    latency_steps: int
    density_cap: int
    trainer_envs: int  # envs of one image started at once (warm16)
    trainer_rounds: int
    trainer_gets: int  # get_env calls gathered / one after another (async_get_env)
    trainer_get_rounds: int
    diff_files: int  # 1 MB files in the diffed volume
    diff_reps: int
    live_tree: tuple[int, ...] = (4, 4)  # branching, depth of the tree search (bench_live)
    live_tree_compare: bool = True  # also the tree by warm volume forks and by replay
    live_sustained_s: int = 60  # seconds of live fork(8) after fork(8)
    live_density_n: int = 1000  # live envs at once (bench/live_density.py)
    # the same again with --merge-pages; it pauses and paces the host's ksmd meanwhile
    live_density_merged: bool = True
    live_seed_forks: int = 8  # single provider.fork() calls of the seed's usage (bench_live)
    live_netns_rounds: int = 10  # fork(8) rounds per mode (bench_live_netns)
    upload_mb: int = 256  # each layer's size (bench_upload)
    upload_reps: int = 3
    zygote_rounds: tuple[int, ...] = (30, 10, 5)  # starts from a zygote, a spare, a boot
    shapes_rounds: int = 4  # rounds per server shape (bench_shapes)
    shapes_first: int = 0  # only the first n shapes (0: every shape)
    isolation_rounds: int = 3  # rounds of runc against gvisor (bench_isolation)
    isolation_steps: int = 200  # timed WebSocket steps per root and round
    isolation_forks: tuple[int, ...] = (4, 8)  # fork(n) of each round's root
    isolation_warm: bool = True  # also gvisor's fork(max n) from booted spares


FULL = Profile(
    name="full",
    start_runs=10,
    fork8_n=8,
    fork8_cold_runs=5,
    fork8_warm_runs=10,
    fork_ks=(10, 100, 1000),
    fork_ns=(1, 8),
    fork_reps=1,
    fork_warm=True,
    snapshot_sizes_mb=(10, 100, 1000),
    snapshot_changes=(1024, MB, 10 * MB, 100 * MB),
    snapshot_reps=3,
    latency_steps=2000,
    density_cap=24,
    trainer_envs=16,
    trainer_rounds=3,
    trainer_gets=64,
    trainer_get_rounds=10,
    diff_files=1024,
    diff_reps=20,
)

QUICK = Profile(
    name="quick",
    start_runs=2,
    fork8_n=2,
    fork8_cold_runs=1,
    fork8_warm_runs=1,
    fork_ks=(10, 1000),
    fork_ns=(1,),
    fork_reps=1,
    fork_warm=False,
    snapshot_sizes_mb=(10, 100),
    snapshot_changes=(1024, MB, 10 * MB),
    snapshot_reps=1,
    latency_steps=500,
    density_cap=4,
    trainer_envs=4,
    trainer_rounds=1,
    trainer_gets=64,
    trainer_get_rounds=3,
    diff_files=64,
    diff_reps=5,
    live_tree=(2, 3),
    live_sustained_s=10,
    live_density_n=16,
    live_netns_rounds=8,
    upload_mb=64,
    upload_reps=1,
    zygote_rounds=(10, 5, 2),
    shapes_rounds=2,
    isolation_rounds=2,
    isolation_steps=100,
    isolation_warm=False,
)

#: One row of every benchmark, its numbers meaningless: that each still runs (CI). The merged
#: live density is left out: it pauses the host's ksmd, which tests beside it may be using.
SMOKE = Profile(
    name="smoke",
    start_runs=1,
    fork8_n=1,
    fork8_cold_runs=1,
    fork8_warm_runs=1,
    fork_ks=(2,),
    fork_ns=(1,),
    fork_reps=1,
    fork_warm=False,
    snapshot_sizes_mb=(1,),
    snapshot_changes=(1024,),
    snapshot_reps=1,
    latency_steps=20,
    density_cap=1,
    trainer_envs=1,
    trainer_rounds=1,
    trainer_gets=4,
    trainer_get_rounds=1,
    diff_files=2,
    diff_reps=1,
    live_tree=(2, 2),  # the root and its 2 children: depth counts the root's level
    live_tree_compare=False,
    live_sustained_s=1,
    live_density_n=2,
    live_density_merged=False,
    live_seed_forks=1,
    live_netns_rounds=1,
    upload_mb=4,
    upload_reps=1,
    zygote_rounds=(1, 1, 1),
    shapes_rounds=1,
    shapes_first=1,
    isolation_rounds=1,
    isolation_steps=10,
    isolation_forks=(2,),
    isolation_warm=False,
)
PROFILES = {p.name: p for p in (FULL, QUICK, SMOKE)}
#: Where each profile writes unless told (--out); only the full run writes bench/results.
RESULTS = ROOT / "bench" / "results"
OUT = {
    "full": RESULTS,
    "quick": ROOT / ".cache" / "bench-quick",
    "smoke": ROOT / ".cache" / "bench-smoke",
}

Runner = Callable[[Bench], dict[str, dict[str, Any]]]
BENCHMARKS: dict[str, Runner] = {
    "start": bench_start.run,
    "fork": bench_fork.run,
    "snapshot": bench_snapshot.run,
    "latency": bench_latency.run,
    "density": bench_density.run,
    "trainer": bench_trainer.run,
    "live": bench_live.run,
    "live_tree": bench_live.run_tree,
    "live_netns": bench_live_netns.run,
    "upload": bench_upload.run,
    "zygote": bench_zygote.run,
    "shapes": bench_shapes.run,
    "isolation": bench_isolation.run,
    "live_density": live_density.bench,
}


def _override(profile: Profile, settings: list[str]) -> Profile:
    """`--set key=value` (ints, comma lists of ints, true/false) applied to a profile."""
    changes: dict[str, Any] = {}
    fields = {f.name: f for f in dataclasses.fields(profile)}
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or key not in fields or key == "name":
            raise SystemExit(
                f"--set {setting!r}: expected key=value with key one of "
                f"{', '.join(k for k in fields if k != 'name')}"
            )
        current = getattr(profile, key)
        if isinstance(current, bool):
            changes[key] = value.lower() in ("1", "true", "yes")
        elif isinstance(current, tuple):
            changes[key] = tuple(int(x) for x in value.split(",") if x)
        else:
            changes[key] = int(value)
    return dataclasses.replace(profile, **changes) if changes else profile


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _check_image(image: str) -> None:
    if not sh("docker", "images", "-q", image, check=False):
        raise SystemExit(
            f"image {image!r} is not on the Docker Engine: build it first (make images)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="the small profile (10-15 min)")
    size.add_argument(
        "--smoke", action="store_true", help="one row of every benchmark, to check they run"
    )
    parser.add_argument("--only", default="", help=f"comma list of {', '.join(BENCHMARKS)}")
    parser.add_argument("--image", default=IMAGE)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a profile setting, e.g. --set fork8_cold_runs=10 --set fork_ks=10,100",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(f"/tmp/denv-bench-{os.getuid()}"),
        help="the private server's state dir (removed at the end; default %(default)s)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="where results go (default: bench/results for the full run, "
        ".cache/bench-quick or .cache/bench-smoke for the others)",
    )
    parser.add_argument("--report-only", action="store_true", help="only rewrite SUMMARY/plots")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("httpx", "denv", "websockets"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    profile_name = "quick" if args.quick else "smoke" if args.smoke else "full"
    out: Path = args.out or OUT[profile_name]
    if args.report_only:
        report.write(out)
        return 0
    if profile_name != "full" and out.resolve() == RESULTS.resolve():
        parser.error(
            f"--out {out}: bench/results holds the committed full run; a --{profile_name} "
            f"run writes elsewhere (default {OUT[profile_name].relative_to(ROOT)})"
        )
    names = [n for n in args.only.split(",") if n] or list(BENCHMARKS)
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    profile = _override(PROFILES[profile_name], args.set)
    _check_image(args.image)
    signal.signal(signal.SIGTERM, _interrupt)

    run_id = secrets.token_hex(4)
    host = machine()
    started = time.monotonic()
    log.info("bench %s (%s profile) on %s cores", run_id, profile.name, host["cores"])
    server = start_server(args.state_dir.resolve())
    bench = Bench(server=server, image=args.image, profile=profile, run_id=run_id)
    failed: list[str] = []
    try:
        for name in names:
            before, t0 = conditions(), time.monotonic()
            log.info("== %s", name)
            try:
                results = BENCHMARKS[name](bench)
            except KeyboardInterrupt:
                raise
            except Exception as exc:
                log.exception("benchmark %s failed", name)
                failed.append(name)
                results = {name: {"error": f"{type(exc).__name__}: {exc}"}}
            for result_name, payload in results.items():
                write_json(
                    out / f"{result_name}.json",
                    {
                        "benchmark": result_name,
                        "runner": name,  # the benchmark (--only) that wrote it
                        "profile": profile.name,
                        "profile_params": asdict(profile),
                        "image": args.image,
                        "run_id": run_id,
                        "machine": host,
                        "conditions": {"before": before, "after": conditions()},
                        "elapsed_s": round(time.monotonic() - t0, 1),
                        **payload,
                    },
                )
            log.info("== %s done in %.0fs", name, time.monotonic() - t0)
            bench.settle()
    except KeyboardInterrupt:
        log.warning("interrupted: cleaning up")
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not strand envs
        log.info("cleaning up (Ctrl-C is ignored until done)")
        bench.cleanup()
        log.info("cleaned up; the run took %.0fs", time.monotonic() - started)
    report.write(out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
