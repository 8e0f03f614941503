"""Start -> ready and stop: DenvProvider against OpenEnv's LocalDockerProvider and the floor.

Issue 8 item 1, and issue 6 item 5 (fork(8) of a live env, cold and warm, against one
LocalDockerProvider cold start) in the same rounds. Each round runs every measurement once,
in a rotated order, so drift on a shared machine hits all of them alike:

- denv: `DenvProvider().start_container(image)` + `wait_for_ready(url)` (health and a
  WebSocket through the ingress proxy: egress deny, the default), then `stop_container()`.
- local: `LocalDockerProvider().start_container(image)` (an env var marks the run's
  containers: bench.local_docker) + `wait_for_ready(url)` (it polls
  /health every 0.5 s after a fixed 1 s sleep: that is what its users get), then its
  `stop_container()` (`docker stop`, 10 s grace, then `docker rm`).
- floor: `docker run -d -p` to the first 200 on /health, polled every 10 ms; `docker rm -f`.
- fork8 cold / warm: `fork_clients(root, 8)` of a live env, 8 children ready (health and
  WebSocket); the children are then deleted and the machine left to settle.

Run: ``python -m bench --only start`` (``make bench`` runs every benchmark;
``--quick`` and ``--smoke`` are smaller profiles: bench/__main__.py).
"""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import httpx
from denv.openenv import fork_clients
from openenv.core import GenericEnvClient
from openenv.core.containers.runtime import LocalDockerProvider

from denv import Denv, Fork

from . import local_docker
from .harness import RUN_LABEL, Bench, free_port, ratio, summarize
from .measure import sh

log = logging.getLogger("bench.start")

READY_TIMEOUT_S = 180.0
FLOOR_POLL_S = 0.01


def _denv_once(b: Bench) -> dict[str, Any]:
    provider = b.provider()
    t0 = time.perf_counter()
    try:
        url = provider.start_container(b.image)
        t1 = time.perf_counter()
        provider.wait_for_ready(url, timeout_s=READY_TIMEOUT_S)
        t2 = time.perf_counter()
    finally:
        t3 = time.perf_counter()
        provider.stop_container()
        t4 = time.perf_counter()
    return {"ready_s": t2 - t0, "start_call_s": t1 - t0, "stop_s": t4 - t3}


def _local_once(b: Bench) -> dict[str, Any]:
    provider = LocalDockerProvider()
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    try:
        url = provider.start_container(b.image, env_vars=local_docker.marker(b.run_id))
        t1 = time.perf_counter()
        provider.wait_for_ready(url, timeout_s=READY_TIMEOUT_S)
        t2 = time.perf_counter()
        out.update(ready_s=t2 - t0, start_call_s=t1 - t0)
    finally:
        t3 = time.perf_counter()
        try:
            provider.stop_container()
        except subprocess.TimeoutExpired as exc:  # its `docker stop` call has a 10 s timeout
            out["stop_error"] = f"TimeoutExpired after {exc.timeout}s"
        out["stop_s"] = time.perf_counter() - t3
        # What a stop that timed out, or an interrupted start, left (found by its marker).
        local_docker.remove(b.image, b.run_id)
    return out


def _floor_once(b: Bench) -> dict[str, Any]:
    port = free_port()
    name = f"denv-bench-floor-{b.run_id}-{port}"  # labelled: Bench.cleanup finds it
    health = f"http://127.0.0.1:{port}/health"
    t0 = time.perf_counter()
    try:
        sh(*_floor_command(b, port, name))
        with httpx.Client(trust_env=False, timeout=2.0) as http:
            while True:
                try:
                    if http.get(health).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.perf_counter() - t0 > READY_TIMEOUT_S:
                    raise TimeoutError(f"{b.image} did not answer {health} in {READY_TIMEOUT_S}s")
                time.sleep(FLOOR_POLL_S)
        ready = time.perf_counter() - t0
    finally:
        t3 = time.perf_counter()
        sh("docker", "rm", "-f", name, check=False)
        stop = time.perf_counter() - t3
    return {"ready_s": ready, "stop_s": stop}


def _floor_command(b: Bench, port: int, name: str) -> list[str]:
    return [
        "docker", "run", "-d", "--name", name, "--label", f"{RUN_LABEL}={b.run_id}",
        "-p", f"127.0.0.1:{port}:8000", b.image,
    ]  # fmt: skip


class Root:
    """A live env the fork measurements branch from (kept for the whole benchmark)."""

    def __init__(self, b: Bench, *, warm: int, tag: str, steps: int = 10) -> None:
        # Volume forks, cold or warm (the default forks live: bench_live measures that).
        self.provider = b.provider(
            fork="volume",
            warm=warm,
            warm_fork=True if warm else None,
            ttl_s=7200,
            timeout_s=READY_TIMEOUT_S,
        )
        url = self.provider.start_container(b.image, env_vars={"DENV_BENCH_ROOT": tag})
        self.provider.wait_for_ready(url)
        self.client: Any = GenericEnvClient(base_url=url, provider=self.provider).sync()
        self.client.reset()
        for i in range(steps):
            self.client.step({"message": f"prefix {i}"})
        self.step_count = steps

    def step_to(self, k: int) -> None:
        for i in range(self.step_count, k):
            self.client.step({"message": f"prefix {i}"})
        self.step_count = max(self.step_count, k)

    def close(self) -> None:
        self.client.close()


def fork_once(b: Bench, root: Root, n: int) -> dict[str, Any]:
    """Time `fork_clients(root, n)`; then check the children and delete them.

    Also times the server's part alone (POST /v1/envs/{id}/fork, which returns once the
    children run): the `denv.Denv.fork` call the provider makes, timed while the fork runs
    (`timing_forks`); the rest is the client waiting for health and a WebSocket on every child.
    """
    api_s: list[float] = []
    t0 = time.perf_counter()
    with timing_forks(api_s):
        children = fork_clients(root.client, n)
    elapsed = time.perf_counter() - t0
    try:
        with b.denv() as api:
            starts = [str(api.get_env(c.provider.env_id or "").start) for c in children]
        state = children[0].state()
        same = state.get("step_count") == root.step_count
    finally:
        for child in children:
            child.close()
    return {
        "ready_s": elapsed,
        "server_fork_s": api_s[0] if api_s else None,
        "starts": starts,
        "state_ok": same,
    }


@contextmanager
def timing_forks(seconds: list[float]) -> Iterator[None]:
    """Append the seconds of each `denv.Denv.fork` call made in this process while open.

    Instrumentation only: the call itself is unchanged. `DenvProvider.fork` makes one
    (the POST) before it probes the children; a provider that made none leaves `seconds`
    empty, and the result says `server_fork_s: null` rather than a wrong number.
    """
    fork = Denv.fork

    def timed(self: Denv, *args: Any, **kwargs: Any) -> Fork:
        started = time.perf_counter()
        try:
            return fork(self, *args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - started)

    with mock.patch.object(Denv, "fork", timed):
        yield


def run(b: Bench) -> dict[str, dict[str, Any]]:
    p = b.profile
    rounds = max(p.start_runs, p.fork8_cold_runs, p.fork8_warm_runs)
    n = int(p.fork8_n)
    samples: dict[str, list[dict[str, Any]]] = {
        k: [] for k in ("denv", "local", "floor", "fork8_cold", "fork8_warm")
    }
    notes: list[str] = []
    cold_root = Root(b, warm=0, tag="cold") if p.fork8_cold_runs else None
    warm_root: Root | None = None
    if p.fork8_warm_runs:
        warm_root = Root(b, warm=n, tag="warm")
        b.settle(max_s=120)  # let the server fill the warm pool, if it keeps one
    warm_available = warm_root is not None

    def measure(kind: str, fn: Callable[[], dict[str, Any]]) -> None:
        try:
            samples[kind].append(fn())
        except Exception as exc:
            log.warning("%s run failed: %s", kind, exc)
            samples[kind].append({"error": f"{type(exc).__name__}: {exc}"})
        b.settle(max_s=180)  # deleted children, and a warm pool refilling

    try:
        for i in range(rounds):
            plan: list[tuple[str, Callable[[], dict[str, Any]]]] = []
            if i < p.start_runs:
                plan += [
                    ("denv", lambda: _denv_once(b)),
                    ("local", lambda: _local_once(b)),
                    ("floor", lambda: _floor_once(b)),
                ]
            if cold_root is not None and i < p.fork8_cold_runs:
                plan.append(("fork8_cold", lambda: fork_once(b, cold_root, n)))
            if warm_root is not None and warm_available and i < p.fork8_warm_runs:
                plan.append(("fork8_warm", lambda: fork_once(b, warm_root, n)))
            shift = i % len(plan)
            for kind, fn in plan[shift:] + plan[:shift]:
                measure(kind, fn)
                if kind == "fork8_warm" and "warm" not in samples[kind][-1].get("starts", []):
                    warm_available = False
                    notes.append("warm: not available (the server started every child cold)")
                    samples[kind].pop()
            log.info("start round %d/%d done", i + 1, rounds)
    finally:
        for root in (cold_root, warm_root):
            if root is not None:
                root.close()
    return {"start": _start_result(samples, notes), "fork8": _fork8_result(samples, notes, n)}


def _ok(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in rows if r.get(key) is not None and "error" not in r]


def _start_result(s: dict[str, list[dict[str, Any]]], notes: list[str]) -> dict[str, Any]:
    ready = {k: summarize(_ok(s[k], "ready_s")) for k in ("denv", "local", "floor")}
    stop = {k: summarize(_ok(s[k], "stop_s")) for k in ("denv", "local", "floor")}
    med = {k: ready[k].get("median") for k in ready}
    return {
        "params": {"egress_denv": "deny (ingress proxy)", "floor_poll_s": FLOOR_POLL_S},
        "ready": ready,
        "stop": stop,
        "ratios": {
            "local_over_denv_median": ratio(med["local"], med["denv"]),
            "denv_over_floor_median": ratio(med["denv"], med["floor"]),
            "local_over_floor_median": ratio(med["local"], med["floor"]),
            "local_over_denv_p90": ratio(ready["local"].get("p90"), ready["denv"].get("p90")),
            "local_stop_over_denv_stop_median": ratio(
                stop["local"].get("median"), stop["denv"].get("median")
            ),
        },
        "runs": {k: s[k] for k in ("denv", "local", "floor")},
        "notes": [n for n in notes if not n.startswith("warm")],
    }


def _fork8_result(s: dict[str, list[dict[str, Any]]], notes: list[str], n: int) -> dict[str, Any]:
    ready = {k: summarize(_ok(s[k], "ready_s")) for k in ("fork8_cold", "fork8_warm", "local")}
    local = ready["local"].get("median")
    warm_runs = [r for r in s["fork8_warm"] if "error" not in r]
    return {
        "params": {"n": n, "ready": "health + WebSocket on every child"},
        "ready": {
            "cold": ready["fork8_cold"],
            "warm": ready["fork8_warm"],
            "local": ready["local"],
        },
        "server_fork": {
            "cold": summarize(_ok(s["fork8_cold"], "server_fork_s")),
            "warm": summarize(_ok(s["fork8_warm"], "server_fork_s")),
        },
        "warm_available": bool(warm_runs),
        "ratios": {
            "local_over_fork8_cold_median": ratio(local, ready["fork8_cold"].get("median")),
            "local_over_fork8_warm_median": ratio(local, ready["fork8_warm"].get("median")),
        },
        "runs": {"cold": s["fork8_cold"], "warm": s["fork8_warm"]},
        "notes": notes,
    }
