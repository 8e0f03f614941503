"""python -m bench [--quick] [--only start,fork,...]: run the benchmarks, write results and plots.

Starts a private denv server (state dir --state-dir, default /tmp/denv-bench-<uid>),
runs each benchmark, writes bench/results/<name>.json as each finishes, then
bench/results/SUMMARY.md and the PNG plots. Everything the run started is deleted at the
end, also on Ctrl-C or SIGTERM. Benchmarks report; they never assert on time.
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
    search ~10 of them)."""

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
)

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
    parser.add_argument("--quick", action="store_true", help="the small profile (< 3 min)")
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
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
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
    if args.report_only:
        report.write(args.out)
        return 0
    names = [n for n in args.only.split(",") if n] or list(BENCHMARKS)
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    profile = _override(QUICK if args.quick else FULL, args.set)
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
                    args.out / f"{result_name}.json",
                    {
                        "benchmark": result_name,
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
    report.write(args.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
