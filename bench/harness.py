"""What every benchmark shares: its own denv server, cleanup, the machine, statistics.

A run starts a private local server (its own state dir, a new session so that Ctrl-C
reaches only the benchmark, which then deletes what it made) and records the machine and
the conditions the numbers were taken under (bench.measure). Nothing here asserts on time.

Not run on its own: the benchmarks import it (``python -m bench`` runs them).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from denv.openenv import DenvProvider

from denv import Denv
from denv.local import read_local_server

from . import local_docker
from .measure import container_cpu_ns, sh

log = logging.getLogger("bench")

T = TypeVar("T")

IMAGE = "denv-echo-env:latest"
#: Label on containers the benchmark runs itself (the `docker run` floor), for cleanup.
RUN_LABEL = "denv.bench.run"
SERVER_START_TIMEOUT_S = 60.0
#: Marks a state dir as the benchmark's own (it is deleted at the end of a run).
MARKER = ".denv-bench"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- statistics -----------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between the closest ranks (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(values: Sequence[float]) -> dict[str, float | int]:
    """n, median, p90, p99, mean, min, max of a sample (seconds stay seconds)."""
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "median": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "mean": sum(values) / len(values),
        "min": min(values),
        "max": max(values),
    }


def ratio(a: float | int | None, b: float | int | None) -> float | None:
    """a / b, or None when either is missing or b is zero."""
    if a is None or b is None or b == 0 or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    """(seconds, result) of one call."""
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def parallel(fns: Sequence[Callable[[], T]]) -> list[T]:
    """Run the calls at once in threads; their results in order; the first error re-raised."""
    if len(fns) <= 1:
        return [fn() for fn in fns]
    with ThreadPoolExecutor(max_workers=len(fns)) as pool:
        futures = [pool.submit(fn) for fn in fns]
        errors = [f.exception() for f in futures]
    for error in errors:
        if error is not None:
            raise error
    return [f.result() for f in futures]


def containers(label: str) -> list[str]:
    """Full ids of running containers with a label (`key=value`)."""
    return sh("docker", "ps", "-q", "--no-trunc", "--filter", f"label={label}").split()


# -- the benchmark's own server -------------------------------------------------------------


def instance_id(state_dir: Path) -> str | None:
    db = state_dir / "denv.db"
    if not db.exists():
        return None
    with sqlite3.connect(db) as con:
        row = con.execute("SELECT value FROM meta WHERE key='instance'").fetchone()
    return str(row[0]) if row else None


def remove_leftovers(state_dir: Path) -> None:
    """Containers, networks and mounts of a stopped server of `state_dir`; then the dir."""
    inst = instance_id(state_dir)
    if inst:
        label = f"label=denv.instance={inst}"
        ids = sh("docker", "ps", "-aq", "--filter", label, check=False).split()
        if ids:
            sh("docker", "rm", "-f", *ids, check=False)
        nets = sh("docker", "network", "ls", "-q", "--filter", label, check=False).split()
        if nets:
            sh("docker", "network", "rm", *nets, check=False)
        # its API keys' CPU groups (denv.server.docker.cgroups.key_parent), empty once its
        # containers are gone
        for group in Path("/sys/fs/cgroup").glob(f"*/denv-{inst}-*"):
            with contextlib.suppress(OSError):
                group.rmdir()
    root = str(state_dir.resolve()) + "/"
    for _ in range(10):
        with open("/proc/self/mountinfo") as f:
            mounts = [ln.split()[4] for ln in f if ln.split()[4].startswith(root)]
        if not mounts:
            break
        for m in sorted(mounts, key=len, reverse=True):
            sh("umount", "-l", m, check=False)
    shutil.rmtree(state_dir, ignore_errors=True)


@dataclass
class Server:
    url: str
    api_key: str
    state_dir: Path
    instance: str
    proc: subprocess.Popen[bytes]


def start_server(state_dir: Path, extra_args: tuple[str, ...] = ()) -> Server:
    """A fresh `denv serve --port 0` for `state_dir` (and `extra_args`), in a session of its own."""
    running = read_local_server(state_dir)
    if running is not None:
        raise RuntimeError(
            f"a denv server for {state_dir} already runs (pid {running.pid}): stop it "
            f"(kill {running.pid}) or give the benchmark another --state-dir"
        )
    if state_dir.exists() and any(state_dir.iterdir()):
        if not (state_dir / MARKER).exists():
            raise RuntimeError(
                f"{state_dir} is not empty and was not made by the benchmark: the benchmark "
                "deletes its state dir at the end, so give it an empty or new --state-dir"
            )
        remove_leftovers(state_dir)  # a run that was killed outright leaves its dir behind
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / MARKER).touch()
    out = open(state_dir / "server.out", "ab")  # noqa: SIM115 (the server process holds it)
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "denv", "serve", "--port", "0"),
            *("--state-dir", str(state_dir), "--max-envs-per-key", "1024"),
            # The benchmarks time denv, not its per-key fairness caps (bursts of 16 starts).
            *("--max-creates-per-key", "0", "--max-starting-per-key", "0"),
            *("--max-waits-per-key", "0", "--max-spares-per-key", "0"),
            *("--log-level", "WARNING"),
            # Zygotes only where a part asks (bench_zygote): the others measure boots and
            # spares, which a zygote would answer instead after an image's first live start.
            "--no-zygotes",
            *extra_args,
        ],
        stdout=out,
        stderr=out,
        start_new_session=True,  # Ctrl-C goes to the benchmark, which cleans up first
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    out.close()
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while (found := read_local_server(state_dir)) is None or found.pid != proc.pid:
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = (state_dir / "server.out").read_text(errors="replace")[-3000:]
            stop_process(proc)
            raise RuntimeError(f"denv server did not start (exit {proc.poll()}):\n{tail}")
        time.sleep(0.05)
    inst = instance_id(state_dir)
    if inst is None:
        raise RuntimeError(f"denv server for {state_dir} has no instance id in denv.db")
    return Server(found.url, found.api_key, state_dir, inst, proc)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- one run --------------------------------------------------------------------------------


@dataclass
class Bench:
    """One benchmark run: the server, the image, the profile, and what to clean up."""

    server: Server
    image: str
    profile: Any
    run_id: str

    def denv(self, timeout_s: float = 300.0, *, detach: bool = False) -> Denv:
        """A client of the run's server. `detach=True` for envs that must outlive it (its
        lease deletes the others when it closes); the run deletes those itself."""
        return Denv(self.server.url, self.server.api_key, timeout_s=timeout_s, detach=detach)

    def provider(self, **options: Any) -> DenvProvider:
        return DenvProvider(server=self.server.url, api_key=self.server.api_key, **options)

    def our_containers(self) -> list[str]:
        return containers(f"denv.instance={self.server.instance}")

    def settle(self, max_s: float = 60.0, idle_cores: float = 0.15) -> float:
        """Wait until this run's containers use under `idle_cores` CPU (boots done); seconds."""
        # Two quiet windows in a row with the same containers: a warm pool's refill may
        # start a moment after the fork that emptied it, so one quiet window is not enough.
        started, quiet = time.monotonic(), 0
        while quiet < 2 and time.monotonic() - started < max_s:
            ids = self.our_containers()
            before = sum(container_cpu_ns(c) or 0 for c in ids)
            time.sleep(0.5)
            after = sum(container_cpu_ns(c) or 0 for c in ids)
            same = set(self.our_containers()) == set(ids)
            quiet = quiet + 1 if same and (after - before) / 0.5e9 < idle_cores else 0
        return time.monotonic() - started

    def delete_all_envs(self) -> int:
        """Delete every env of this run's server that is not deleted; how many."""
        with self.denv() as api:
            ids = [e.id for e in api.list_envs() if str(e.status) != "deleted"]

            def delete(env_id: str) -> Callable[[], None]:
                return lambda: api.delete_env(env_id)

            for start in range(0, len(ids), 8):
                parallel([delete(i) for i in ids[start : start + 8]])
        return len(ids)

    def cleanup(self) -> None:
        """Leave nothing behind: envs, the server, its containers and mounts, the containers
        started outside denv (LocalDockerProvider's, the floor's) and their image tags."""
        try:
            n = self.delete_all_envs()
            if n:
                log.info("deleted %d envs left by the run", n)
        except Exception as exc:
            log.warning(
                "could not delete envs through the server (%s); removing them directly", exc
            )
        stop_process(self.server.proc)
        remove_leftovers(self.server.state_dir)
        labelled = sh("docker", "ps", "-aq", "--filter", f"label={RUN_LABEL}={self.run_id}")
        if labelled:
            sh("docker", "rm", "-f", *labelled.split(), check=False)
        local_docker.remove(self.image, self.run_id)
        local_docker.remove_tags(self.run_id)


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)


def seconds(values: Iterable[float]) -> list[float]:
    """Rounded to microseconds, for result files people read."""
    return [round(v, 6) for v in values]
