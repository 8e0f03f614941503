"""The long soak (issue 25 item 7): GRPO-shaped rounds on a server with a tight disk budget,
trainers SIGKILLed at random, a server restart in the middle; then what was left.

    python -m bench.soak_long                 # make soak-long: 2,000+ envs, ~15 min
    python -m bench.soak_long --rounds 20     # a shorter run, results in .cache/soak-long

A round (bench/soak_trainer.py) starts a group's env (a live create, answered from the
server's zygote), steps it, live-forks it into ``group`` children, steps each child at once
over its own WebSocket session through ingress, and deletes the group. ``trainers`` trainer
processes run rounds side by side; ``kills`` rounds, picked at random, have their trainer
SIGKILLed after it made the round's first or all of its envs (only its lease can clean up),
and a new trainer takes its place. Halfway through, the server is stopped (SIGTERM) and
started again on the same state dir and port while the trainers go on.

What the run reports (``run`` returns it; ``main`` writes bench/results/soak-long.json and
.md): envs leaked (not deleted at the end), versions left beyond the expiry policy once its
grace and a collection have passed, layers no version names, the state dir's disk at the
start and the end, what the instance left on the machine after it stopped, the p99 step
latency, how long a killed trainer's envs outlived it, and the server's resident memory
sampled through the run (start, end, and its slope per 1,000 envs in each server's life).

The CI version is tests/reliability/test_soak_long.py: the same loop for a few rounds,
asserting the invariants (nothing leaked, nothing beyond policy). Nothing here asserts on
time.
"""

from __future__ import annotations

import contextlib
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from . import soak_checks as checks
from .harness import free_port, summarize

TRAINER = Path(__file__).with_name("soak_trainer.py")
IMAGE = "denv-echo-env:latest"
MIB = 1024 * 1024
EVENT_TIMEOUT_S = 300.0  # a trainer silent this long is hung: the soak kills it and says so
SAMPLE_EVERY_S = 2.0


@dataclass(frozen=True)
class Plan:
    """The run's shape; the defaults are ``make soak-long``'s (9 envs a round)."""

    rounds: int = 230
    trainers: int = 3
    group: int = 8
    steps: int = 4
    message_kb: int = 256  # each step's message; the echo env saves it to /work
    kills: int = 12  # rounds whose trainer is SIGKILLed in their middle
    max_disk_mb: int = 16  # denv serve --max-disk-per-key
    floor_below_free_mb: int = 20 * 1024  # --min-free-disk: this far below the free disk
    grace_s: float = 10.0  # --version-grace
    gc_interval_s: float = 5.0  # --gc-interval
    lease_timeout_s: float = 15.0  # --lease-timeout (the server's default)
    seed: int = 25

    def serve_flags(self, state_dir: Path, port: int) -> list[str]:
        state_dir.mkdir(parents=True, exist_ok=True)
        st = __import__("os").statvfs(state_dir)
        free_mb = st.f_bavail * st.f_frsize // MIB
        floor = max(free_mb - self.floor_below_free_mb, 1024)
        return [
            *("--port", str(port), "--zygotes", "--log-level", "WARNING"),
            *("--max-envs-per-key", "128", "--lease-timeout", f"{self.lease_timeout_s:g}"),
            *("--max-disk-per-key", f"{self.max_disk_mb}M", "--min-free-disk", f"{floor}M"),
            *("--version-grace", f"{self.grace_s:g}", "--gc-interval", f"{self.gc_interval_s:g}"),
        ]


class Served(Protocol):
    """A running server, as ``start`` gives it (tests/conftest.py's LocalDenv fits)."""

    @property
    def url(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def proc(self) -> subprocess.Popen[bytes] | None: ...


#: Starts a server on the run's state dir with these flags; stopping it is leaving the block.
Start = Callable[[list[str]], AbstractContextManager[Served]]


@dataclass
class Log:
    """What the trainers said, shared by the slots (under ``lock``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    next_round: int = 0
    done: int = 0
    steps: list[float] = field(default_factory=list)
    round_s: list[float] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    retries: list[dict[str, Any]] = field(default_factory=list)
    killed: list[dict[str, Any]] = field(default_factory=list)
    hung: int = 0

    def take(self, rounds: int) -> int | None:
        with self.lock:
            if self.next_round >= rounds:
                return None
            self.next_round += 1
            return self.next_round - 1


class Trainer:
    """One trainer process and the queue its stdout lines go to."""

    def __init__(self, url: str, key: str, plan: Plan) -> None:
        args = [str(plan.group), str(plan.steps), str(plan.message_kb * 1024)]
        self.proc = subprocess.Popen(
            [sys.executable, str(TRAINER), url, key, IMAGE, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.next_event()  # "ready"

    def _read(self) -> None:
        import json

        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.events.put(json.loads(line))
        self.events.put(None)

    def next_event(self) -> dict[str, Any]:
        event = self.events.get(timeout=EVENT_TIMEOUT_S)
        if event is None:
            raise RuntimeError(f"trainer {self.proc.pid} exited ({self.proc.wait()})")
        return event

    def go(self, n: int, hold: bool = False) -> None:
        """Run round ``n``; ``hold``: stop before its delete (a round whose trainer is killed)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"go {n}{' hold' if hold else ''}\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def close(self) -> None:
        """A clean exit: its Denv closes its lease."""
        if self.proc.poll() is None and self.proc.stdin is not None:
            self.proc.stdin.close()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()


def slot(
    server: list[Served], plan: Plan, kill_rounds: set[int], log: Log, rng: random.Random
) -> None:
    """One trainer's place: rounds until none are left, a new trainer after each kill."""
    trainer = Trainer(server[0].url, server[0].key, plan)
    try:
        while (n := log.take(plan.rounds)) is not None:
            trainer.go(n, hold=n in kill_rounds)
            if n in kill_rounds:
                trainer = _kill_in_round(trainer, n, plan, log, rng, server[0])
                continue
            try:
                while (event := trainer.next_event())["event"] in ("envs", "retry"):
                    if event["event"] == "retry":
                        with log.lock:
                            log.retries.append({**event, "at": time.time()})
            except queue.Empty:
                with log.lock:
                    log.hung += 1
                trainer.kill()
                trainer = Trainer(server[0].url, server[0].key, plan)
                continue
            with log.lock:
                if event["event"] == "done":
                    log.done += 1
                    log.steps += event["steps"]
                    log.round_s.append(event["seconds"])
                else:
                    log.errors.append({**event, "at": time.time()})
    finally:
        trainer.close()


def _kill_in_round(
    trainer: Trainer, n: int, plan: Plan, log: Log, rng: random.Random, server: Served
) -> Trainer:
    """SIGKILL the trainer once it made the round's first env, or all of them. The round was
    sent with ``hold``, so the trainer deletes none of them before the kill: what the log
    records as the killed trainer's envs are left to its lease alone."""
    wanted = rng.choice([1, 2])  # after the group's env, or after its fork too
    ids: list[str] = []
    seen = 0
    while seen < wanted:
        event = trainer.next_event()
        if event["event"] == "retry":  # the failed attempt's envs are its own to delete
            ids, seen = [], 0
            continue
        if event["event"] != "envs":
            break  # the round ended before the moment came: kill the trainer anyway
        ids += event["ids"]
        seen += 1
    time.sleep(rng.uniform(0, 0.3))
    trainer.kill()
    with log.lock:
        log.killed.append({"round": n, "at": time.time(), "envs": ids})
    return Trainer(server.url, server.key, plan)


class Sampler:
    """The server's RSS, the state dir's disk and the database's counts every few seconds."""

    def __init__(self, state_dir: Path, log: Log) -> None:
        self.state_dir = state_dir
        self.log = log
        self.samples: list[dict[str, Any]] = []
        self.pid: int | None = None
        self.phase = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def watch(self, pid: int, phase: int) -> None:
        self.pid, self.phase = pid, phase
        if not self._thread.is_alive():
            self._thread.start()

    def sample(self) -> dict[str, Any]:
        rss = checks.rss_kib(self.pid) if self.pid else None
        with self.log.lock:
            done, taken = self.log.done, self.log.next_round
        point = {
            "t": round(time.time(), 1),
            "phase": self.phase,
            "rounds_done": done,
            "rounds_started": taken,
            "rss_kib": rss,
            "disk_bytes": checks.disk(self.state_dir)["total"],
            "idle_implicit_versions": len(checks.versions_beyond_policy(self.state_dir)),
            "live_envs": len(checks.live_envs(self.state_dir)),
        }
        self.samples.append(point)
        return point

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY_S):
            with contextlib.suppress(Exception):  # the database mid-restart: next time
                self.sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _wait(what: Callable[[], Any], timeout_s: float, every_s: float = 0.5) -> Any:
    """``what()`` once it is falsy, or its last value after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while (value := what()) and time.monotonic() < deadline:
        time.sleep(every_s)
    return value


def run(plan: Plan, state_dir: Path, start: Start) -> dict[str, Any]:
    """The soak on a fresh ``state_dir``; what it found (see the module's docstring)."""
    rng = random.Random(plan.seed)
    kill_rounds = set(rng.sample(range(plan.trainers, plan.rounds), plan.kills))
    flags = plan.serve_flags(state_dir, free_port())
    log = Log()
    sampler = Sampler(state_dir, log)
    t0 = time.monotonic()
    restart: dict[str, Any] = {}
    with ExitStack() as first:
        srv = first.enter_context(start(flags))
        assert srv.proc is not None
        server: list[Served] = [srv]
        disk_start = checks.disk(state_dir)
        sampler.watch(srv.proc.pid, 1)
        sampler.sample()
        slots = [
            threading.Thread(
                target=slot, args=(server, plan, kill_rounds, log, random.Random(rng.random()))
            )
            for _ in range(plan.trainers)
        ]
        for s in slots:
            s.start()
        while log.next_round < plan.rounds // 2 and any(s.is_alive() for s in slots):
            time.sleep(0.2)
        restart["at_round"] = log.next_round
        restart["rss_before_kib"] = sampler.sample()["rss_kib"]
        stopped = time.monotonic()
    with ExitStack() as second:
        srv = second.enter_context(start(flags))
        assert srv.proc is not None and srv.key == server[0].key
        restart["down_s"] = round(time.monotonic() - stopped, 2)
        server[0] = srv
        sampler.watch(srv.proc.pid, 2)
        restart["rss_after_kib"] = sampler.sample()["rss_kib"]
        for s in slots:
            s.join()
        loop_s = time.monotonic() - t0
        # Trainers closed cleanly (their leases closed); the killed ones' leases expire.
        leaked = _wait(lambda: checks.live_envs(state_dir), plan.lease_timeout_s + 30)
        settled = time.monotonic()
        beyond = _wait(
            lambda: checks.versions_beyond_policy(state_dir),
            plan.grace_s + 2 * plan.gc_interval_s + 5,
        )
        policy_s = time.monotonic() - settled
        end = sampler.sample()
        sampler.stop()
        disk_end = checks.disk(state_dir)
        layers_left = checks.unreferenced_layers(state_dir)
        killed_envs = checks.deletions(state_dir, [i for k in log.killed for i in k["envs"]])
        counts = {**checks.env_counts(state_dir), **checks.version_counts(state_dir)}
        zygotes = checks.zygotes(state_dir)
        stale_cgroups = checks.stale_live_cgroups(state_dir)
    disk_stopped = checks.disk(state_dir)
    left = checks.machine_leftovers(state_dir)
    return _result(
        plan, log, sampler, restart, leaked, beyond, layers_left, killed_envs, counts,
        {"start": disk_start, "end": disk_end, "after_stop": disk_stopped},
        left, loop_s, policy_s, end, zygotes, stale_cgroups,
    )  # fmt: skip


def _reap_seconds(log: Log, killed_envs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """For each killed trainer's envs: how they were deleted and how long after the kill."""
    reasons: dict[str, int] = {}
    waited: list[float] = []
    for kill in log.killed:
        for env_id in kill["envs"]:
            rec = killed_envs.get(env_id, {})
            reason = rec.get("reason", rec.get("status", "missing"))
            reasons[reason] = reasons.get(reason, 0) + 1
            if rec.get("at"):
                waited.append(checks.seconds_between(kill["at"], rec["at"]))
    return {"envs": sum(reasons.values()), "reasons": reasons, "seconds": summarize(waited)}


def _rss_trend(samples: list[dict[str, Any]], group: int) -> dict[str, Any]:
    """Per server life: RSS at its start and end, and its slope (MiB per 1,000 envs) over
    the rounds after the first fifth (warm-up: imports, zygote, caches)."""
    out: dict[str, Any] = {}
    for phase in (1, 2):
        points = [s for s in samples if s["phase"] == phase and s["rss_kib"]]
        if not points:
            continue
        first, last = points[0]["rounds_done"], points[-1]["rounds_done"]
        warm = first + (last - first) / 5
        fit = [
            (s["rounds_done"] * (group + 1) / 1000, s["rss_kib"] / 1024)
            for s in points
            if s["rounds_done"] >= warm
        ]
        slope = checks.slope(fit)
        out[f"server_{phase}"] = {
            "rss_start_mib": round(points[0]["rss_kib"] / 1024, 1),
            "rss_end_mib": round(points[-1]["rss_kib"] / 1024, 1),
            "rss_max_mib": round(max(s["rss_kib"] for s in points) / 1024, 1),
            "slope_mib_per_1000_envs": None if slope is None else round(slope, 2),
            "samples": len(points),
        }
    return out


def _result(
    plan: Plan, log: Log, sampler: Sampler, restart: dict[str, Any], leaked: list[Any],
    beyond: list[str], layers_left: list[str], killed_envs: dict[str, dict[str, Any]],
    counts: dict[str, int], disk: dict[str, dict[str, int]], left: dict[str, list[str]],
    loop_s: float, policy_s: float, end: dict[str, Any], zygotes: int, stale_cgroups: list[str],
) -> dict[str, Any]:  # fmt: skip
    steps = summarize(log.steps)
    return {
        "plan": asdict(plan),
        "envs_total": counts["envs"],
        "rounds": {
            "done": log.done,
            "errors": len(log.errors),
            "killed": len(log.killed),
            "hung": log.hung,
            "retried": len(log.retries),
        },
        "errors": log.errors,
        "retries": log.retries,
        "killed": log.killed,
        "leaked_envs": [list(e) for e in leaked],
        "versions_beyond_policy": beyond,
        "seconds_until_policy_held": round(policy_s, 1),
        "unreferenced_layers": layers_left,
        "zygotes_at_end": zygotes,
        "cgroups_of_deleted_live_envs": stale_cgroups,
        "counts": counts,
        "disk_bytes": disk,
        "machine_leftovers": {k: len(v) for k, v in left.items()},
        "machine_leftovers_named": {k: v for k, v in left.items() if v},
        "step_seconds": steps,
        "round_seconds": summarize(log.round_s),
        "killed_trainers": _reap_seconds(log, killed_envs),
        "restart": restart,
        "rss": _rss_trend(sampler.samples, plan.group),
        "loop_seconds": round(loop_s, 1),
        "end_sample": end,
        "samples": sampler.samples,
    }


# -- make soak-long -------------------------------------------------------------------------


@contextlib.contextmanager
def serve(state_dir: Path, flags: list[str]) -> Iterator[Served]:
    """``denv serve`` on ``state_dir``, in a session of its own; SIGTERM on leaving."""
    import os
    from types import SimpleNamespace

    from denv.local import read_local_server

    from .harness import SERVER_START_TIMEOUT_S, stop_process

    out = open(state_dir / "server.out", "ab")  # noqa: SIM115 (the server holds it)
    proc = subprocess.Popen(
        [sys.executable, "-m", "denv", "serve", "--state-dir", str(state_dir), *flags],
        stdout=out,
        stderr=out,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    out.close()
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while (found := read_local_server(state_dir)) is None or found.pid != proc.pid:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (state_dir / "server.out").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"denv server did not start (exit {proc.poll()}):\n{tail}")
            time.sleep(0.1)
        yield SimpleNamespace(url=found.url, key=found.api_key, proc=proc)
    finally:
        stop_process(proc)


def markdown(result: dict[str, Any]) -> str:
    """The result as the page committed beside its JSON."""
    r, plan = result, result["plan"]
    steps, kills, disk = r["step_seconds"], r["killed_trainers"], r["disk_bytes"]

    def mib(n: int) -> str:
        return f"{n / MIB:.1f} MiB"

    lines = [
        "# Long soak (issue 25 item 7)",
        "",
        f"Command: `{r['command']}`  ",
        f"Date: {r['date']}, commit {r['commit']}  ",
        f"Duration: {r['duration_s']:.0f} s (the loop {r['loop_seconds']:.0f} s); "
        f"load average at the start {r['load_start']}, at the end {r['load_end']} "
        f"({r['cores']} cores, shared with other agents)",
        "",
        f"{plan['rounds']} rounds of a GRPO-shaped group ({plan['trainers']} trainers side by "
        f"side; each round: a live create from the zygote, 1 step, a live fork into "
        f"{plan['group']}, {plan['steps']} steps per child over its own WebSocket through "
        f"ingress, {plan['message_kb']} KiB a step saved to /work; then the group deleted). "
        f"{plan['kills']} rounds had their trainer SIGKILLed mid-round; the server was "
        f"stopped and started again at round {r['restart']['at_round']} "
        f"(down {r['restart']['down_s']} s). Disk budget: --max-disk-per-key "
        f"{plan['max_disk_mb']}M, --min-free-disk {plan['floor_below_free_mb'] // 1024} GiB "
        f"below the free disk at the start, --version-grace {plan['grace_s']:g}, "
        f"--gc-interval {plan['gc_interval_s']:g}, --lease-timeout {plan['lease_timeout_s']:g}.",
        "",
        "| what | result |",
        "| --- | --- |",
        f"| envs in all | {r['envs_total']} |",
        f"| rounds done / failed / killed / hung | {r['rounds']['done']} / "
        f"{r['rounds']['errors']} / {r['rounds']['killed']} / {r['rounds']['hung']} "
        f"(attempts tried again: {r['rounds']['retried']}) |",
        f"| envs leaked (not deleted at the end) | {len(r['leaked_envs'])} |",
        f"| versions beyond policy (after grace + a collection) | "
        f"{len(r['versions_beyond_policy'])} (held {r['seconds_until_policy_held']} s "
        "after the last env went) |",
        f"| layers no version names | {len(r['unreferenced_layers'])} |",
        "| cgroups of deleted live envs in running containers, at the end | "
        f"{len(r['cgroups_of_deleted_live_envs'])} |",
        "| left on the machine after the server stopped | "
        + ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in r["machine_leftovers"].items())
        + " |",
        f"| killed trainers' envs | {kills['envs']}: {kills['reasons']}, deleted "
        f"{kills['seconds'].get('median', 0):.1f} s (median) / "
        f"{kills['seconds'].get('max', 0):.1f} s (max) after the kill |",
        f"| step latency (n={steps.get('n', 0)}) | median {steps.get('median', 0) * 1e3:.1f} ms, "
        f"p90 {steps.get('p90', 0) * 1e3:.1f} ms, p99 {steps.get('p99', 0) * 1e3:.1f} ms, "
        f"max {steps.get('max', 0) * 1e3:.0f} ms |",
        f"| round (median / p99) | {r['round_seconds'].get('median', 0):.2f} s / "
        f"{r['round_seconds'].get('p99', 0):.2f} s |",
        f"| state dir's disk: start / end / after stop | {mib(disk['start']['total'])} / "
        f"{mib(disk['end']['total'])} / {mib(disk['after_stop']['total'])} |",
        f"| peak disk sampled | {mib(max(s['disk_bytes'] for s in r['samples']))} |",
    ]
    for name, rss in r["rss"].items():
        lines.append(
            f"| {name.replace('_', ' ')} RSS: start / end / max | {rss['rss_start_mib']} / "
            f"{rss['rss_end_mib']} / {rss['rss_max_mib']} MiB, slope "
            f"{rss['slope_mib_per_1000_envs']} MiB per 1,000 envs ({rss['samples']} samples) |"
        )
    lines += [
        "",
        "Disk at the end: layers "
        f"{mib(disk['end']['layers'])}, env dirs {mib(disk['end']['envs'])} (the zygote's "
        f"/work: {r['zygotes_at_end']} zygote(s) left, reaped when idle or at exit), packed "
        f"{mib(disk['end']['packed'])}; what stays after the stop is the image's seed layer, "
        "kept on purpose for new versions.",
        "",
        f"Failed rounds: {len(r['errors'])}; attempts tried again (a round's trainer cleans up "
        f"and starts it over): {len(r['retries'])}. The first of each:",
        "",
        *[
            f"- round {e['round']} {e['event']} ({e['stage']}): {e['error'][:200]}"
            for e in (r["errors"][:10] + r["retries"][:10])
        ],
        "",
        "Raw numbers, samples every 2 s included: soak-long.json.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    import os
    import shutil

    from .harness import remove_leftovers
    from .measure import ROOT, loadavg, machine, now_iso

    parser = argparse.ArgumentParser(prog="python -m bench.soak_long", description=__doc__)
    defaults = Plan()
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--out", type=Path, default=None, help="default: bench/results for "
                        "the full run, .cache/soak-long for another plan")  # fmt: skip
    parser.add_argument("--state-dir", type=Path, default=Path(f"/tmp/denv-soak-{os.getuid()}"))
    args = parser.parse_args(argv)
    plan = Plan(**{k: getattr(args, k) for k in asdict(defaults)})
    out = args.out or (ROOT / ("bench/results" if plan == defaults else ".cache/soak-long"))
    state: Path = args.state_dir
    if state.exists():
        raise SystemExit(f"{state} exists: remove it or give another --state-dir")
    state.mkdir(parents=True)
    t0, load_start = time.monotonic(), loadavg()
    try:
        result = run(plan, state, lambda flags: serve(state, flags))
    finally:
        remove_leftovers(state)
        shutil.rmtree(state, ignore_errors=True)
    info = machine()
    result = {
        "command": " ".join(["python -m bench.soak_long", *(argv or sys.argv[1:])]),
        "date": now_iso(),
        "commit": info.get("denv_commit", info.get("commit", "unknown")),
        "cores": os.cpu_count(),
        "duration_s": round(time.monotonic() - t0, 1),
        "load_start": load_start,
        "load_end": loadavg(),
        **result,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak-long.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "soak-long.md").write_text(markdown(result))
    print(markdown(result))
    bad = result["leaked_envs"] or result["versions_beyond_policy"]
    return 1 if bad or any(result["machine_leftovers"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
