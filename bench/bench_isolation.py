"""runc against gVisor (issue 45): start, step latency, fork(n), memory, on two servers.

Two private servers run side by side, `denv serve` (runc, Docker's default) and
`denv serve --isolation gvisor` (every env's containers under runsc through the engine's
`denv-runsc` runtime), both at ``--log-level INFO`` (the gvisor server's log says what a
fork's checkpoint took). Each round does the same on both, in an order that alternates, on
OpenEnv's echo env through the public API with the defaults a user gets (`fork="auto"`:
live under runc; under gvisor, which refuses live, the parent's sandbox saved and each child
resumed from it, or, where it cannot be saved, each child booted from the parent's /work):

- ``start``: `GenericEnvClient.from_docker_image(image, provider=DenvProvider())` to its
  first `reset()` answered.
- ``step``: the median of `steps` WebSocket `step()` calls through the ingress proxy
  (egress deny, the default), after a warm-up that is not counted.
- ``memory_env``: the root env's container, as the host sees it: its memory cgroup's usage
  less inactive file cache (what `docker stats` shows) and the unique set size (smaps_rollup
  `Private_*`) of the processes in it (under gvisor: runsc's sandbox, gofer and helpers,
  which hold the sandbox's kernel and the app's memory).
- ``fork<n>``: `fork_clients(root, n)` until every child's `state()` answered; the kind
  of each child's start. Then each child's memory: a live child's cgroup below its
  parent's container (bench.live_cgroups), a volume child's own container. The root holds
  its WebSocket session open while it forks, and this runsc cannot save a sandbox with an
  open TCP connection: under gvisor these children boot ("cold"; ``checkpoint`` says why
  the save was refused), which is what a client holding a session gets.
- ``http_fork<n>``: an env made with `denv.Denv` (`live="auto"` under runc, so that it forks
  live; the default under gvisor), reset and stepped over plain HTTP through its ingress
  endpoint (`POST /reset`, `POST /step`, `GET /state`; every client closed before the fork,
  no WebSocket open), then `Denv.fork(env_id, n, kind="auto", wait="none")`: the fork call's
  time (under gvisor it holds the checkpoint), each child's `/state` polled through its
  ingress endpoint (every `POLL_S`, its endpoint read off `get_env` until it has one) until
  it answers, each child's time to that answer from the fork request and from the fork's
  answer (under gvisor: its restore to ready), all children's, their start kinds
  (`get_env(child).start`: live, restored, or cold where the save failed), whether each
  answered the parent's `step_count`, each child's memory; the children are deleted before
  the next n (one more HTTP step of the root before each fork), the root after the last.
  Under gvisor, ``checkpoint``: the seconds and MB of the parent's saved sandbox, read from
  the server's log (``<state dir>/server.log``: `bench.harness.Server` keeps no log of its
  own), or why it was not saved.
- ``gvisor_warm`` (full profile): the same from a gvisor root with `warm=n` spares booted
  (`warm_fork=True`), after the pool refilled; or the server's refusal, asked once (a
  spare's /work is mounted after it boots, which a gVisor sandbox does not see).

Results: bench/results/isolation.json (medians, gvisor / runc ratios, and fork(n) by
restore, by boot and live side by side). Nothing asserts on time.

Run: ``python -m bench --only isolation`` (``make bench`` runs every benchmark;
``--quick`` and ``--smoke`` are smaller profiles: bench/__main__.py).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import httpx
from denv.openenv import DenvProvider, fork_clients
from openenv.core import GenericEnvClient

from denv import Conflict, Denv, Env

from .bench_start import READY_TIMEOUT_S
from .harness import (
    Bench,
    Server,
    parallel,
    ratio,
    remove_leftovers,
    start_server,
    stop_process,
    summarize,
)
from .live_cgroups import TREE, container_pid, group_of
from .live_density import env_memory, private_bytes
from .measure import container_memory, sh

log = logging.getLogger("bench.isolation")

ISOLATIONS = ("runc", "gvisor")
WARMUP = 10
#: Both servers log at INFO: the gvisor server's log is where a fork's checkpoint is told.
SERVER_ARGS = ("--log-level", "INFO")
HTTP_STEPS = 3  # HTTP steps of an http_fork root before its first fork (one more before each)
POLL_S = 0.1  # how often a child's /state (or, before it has an endpoint, get_env) is asked
HTTP_TIMEOUT_S = 30.0
# denv.server.docker.checkpoints' and denv.server.lifecycle.fork's lines (INFO).
CHECKPOINT_LINE = re.compile(r"checkpoint of (\S+): ([0-9.]+) s, ([0-9.]+) MB")
NOT_SAVED_LINE = re.compile(r"fork of (\S+): its sandbox was not saved \((.*)\); children boot")


def _container(env_id: str) -> str:
    ids = sh("docker", "ps", "-q", "--no-trunc", "--filter", f"label=denv.env={env_id}").split()
    if not ids:
        raise RuntimeError(f"no running container has label denv.env={env_id}")
    return ids[0]


def _memory_cgroup(pid: int) -> Path:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, where = line.split(":", 2)
        if "memory" in controllers.split(","):
            where = where.split(f"/{TREE}/")[0]  # the container's group, not a live env's
            return Path("/sys/fs/cgroup") / controllers / where.strip("/")
    raise RuntimeError(f"process {pid} has no v1 memory cgroup (this bench reads cgroup v1)")


def container_memory_of(env_id: str) -> dict[str, int]:
    """`cgroup` (usage less inactive file) and `uss` of the processes in the container of
    env `env_id` and the groups below it (a live root's own, and its live children's: read
    it before forking)."""
    cid = _container(env_id)
    group = _memory_cgroup(container_pid(env_id))
    procs = [int(p) for f in group.rglob("cgroup.procs") for p in f.read_text().split()]
    out = {"uss": sum(private_bytes(p) for p in procs), "processes": len(procs)}
    mem = container_memory(cid)
    if mem is not None:
        out["cgroup"] = mem["usage"]
    return out


def child_memory(root_id: str, child_id: str, kind: str) -> dict[str, int]:
    """A live child's group below its root's container, else the child's own container."""
    if kind == "live":
        return env_memory(group_of(container_pid(root_id)), child_id)
    return container_memory_of(child_id)


def _provider(server: Server, **options: Any) -> DenvProvider:
    return DenvProvider(
        server=server.url,
        api_key=server.api_key,
        ttl_s=3600,
        timeout_s=READY_TIMEOUT_S,
        **options,
    )


def _fork(server: Server, root: Any, n: int) -> dict[str, Any]:
    """fork_clients(root, n) to every child's state() answered; then their memory, closed.
    ``checkpoint``: what the server logged of saving the root's sandbox (gvisor)."""
    since = log_size(server)
    t0 = time.perf_counter()
    children = fork_clients(root, n)
    try:
        states = [c.state() for c in children]
        elapsed = time.perf_counter() - t0
        kinds = [str(c.provider.start) for c in children]
        root_id = str(root.provider.env_id)
        memory = [
            child_memory(root_id, str(c.provider.env_id), kind)
            for c, kind in zip(children, kinds, strict=True)
        ]
        carried = all(s.get("step_count") == states[0].get("step_count") for s in states)
        return {
            "s": elapsed,
            "kinds": sorted(set(kinds)),
            "step_count": [s.get("step_count") for s in states],
            "state_carried": carried,
            "memory": memory,
            "checkpoint": checkpoint_of(server, root_id, since),
        }
    finally:
        for child in children:
            child.close()


def _round(server: Server, image: str, steps: int, forks: tuple[int, ...]) -> dict[str, Any]:
    """One start, `steps` steps, the root's memory, then each fork(n) of the same root."""
    provider = _provider(server)
    t0 = time.perf_counter()
    root: Any = GenericEnvClient.from_docker_image(image, provider=provider).sync()
    try:
        root.reset()
        out: dict[str, Any] = {"start_s": time.perf_counter() - t0, "start": provider.start}
        for i in range(WARMUP):
            root.step({"message": f"warm-up {i}"})
        step_s: list[float] = []
        for i in range(steps):
            t1 = time.perf_counter()
            root.step({"message": f"step {i}"})
            step_s.append(time.perf_counter() - t1)
        out["step_median_s"] = summarize(step_s)["median"]
        out["step_p90_s"] = summarize(step_s)["p90"]
        out["memory_env"] = container_memory_of(str(provider.env_id))
        out["root_step_count"] = root.state().get("step_count")
        for n in forks:
            out[f"fork{n}"] = _fork(server, root, n)
        return out
    finally:
        root.close()


# -- fork over HTTP, no session open: gvisor's children resume from the parent's sandbox ----


def log_size(server: Server) -> int:
    """Where the server's log (``<state dir>/server.log``) ends now: a mark for
    `checkpoint_of`."""
    path = server.state_dir / "server.log"
    return path.stat().st_size if path.exists() else 0


def checkpoint_of(server: Server, env_id: str, since: int) -> dict[str, Any] | None:
    """What the server logged after `since` (`log_size`) of saving env `env_id`'s sandbox
    for a fork: ``{"s", "mb"}``, or ``{"refused": why}``; None when it logged neither (runc,
    which has no saver, and a fork that asked for no save)."""
    path = server.state_dir / "server.log"
    if not path.exists():
        return None
    with path.open("rb") as f:
        if path.stat().st_size >= since:  # else the log rotated since: read all of it
            f.seek(since)
        text = f.read().decode(errors="replace")
    found: dict[str, Any] | None = None
    for line in text.splitlines():
        if (m := CHECKPOINT_LINE.search(line)) and m.group(1) == env_id:
            found = {"s": float(m.group(2)), "mb": float(m.group(3))}
        elif (m := NOT_SAVED_LINE.search(line)) and m.group(1) == env_id:
            found = {"refused": m.group(2)}
    return found


def _ingress_url(env: Env) -> str | None:
    urls = [str(e.url).rstrip("/") for e in env.endpoints if e.service == env.agent_service]
    return urls[0] if urls else None


def _http_steps(url: str, steps: int, *, reset: bool) -> int:
    """`steps` steps over plain HTTP through the ingress (after a reset), the client closed
    after them; the env's `step_count` then."""
    with httpx.Client(timeout=HTTP_TIMEOUT_S) as http:
        if reset:
            http.post(f"{url}/reset", json={}).raise_for_status()
        for i in range(steps):
            http.post(f"{url}/step", json={"action": {"message": f"http {i}"}}).raise_for_status()
        state = http.get(f"{url}/state")
        state.raise_for_status()
    return int(state.json()["step_count"])


def _ready(api: Denv, env_id: str, t0: float) -> dict[str, Any]:
    """Env `env_id`'s /state polled through its ingress endpoint (read off get_env until it
    has one) until it answers: the seconds from `t0` to its endpoint and to that answer, and
    the `step_count` it answered."""
    url: str | None = None
    out: dict[str, Any] = {}
    with httpx.Client(timeout=HTTP_TIMEOUT_S) as http:
        while time.perf_counter() - t0 < READY_TIMEOUT_S:
            if url is None:
                env = api.get_env(env_id)
                if str(env.status) in ("failed", "deleted"):
                    raise RuntimeError(f"child {env_id} is {env.status}: {env.error}")
                if (url := _ingress_url(env)) is not None:
                    out["endpoint_s"] = time.perf_counter() - t0
            if url is not None:
                try:
                    answer = http.get(f"{url}/state")
                except httpx.HTTPError:
                    answer = None
                if answer is not None and answer.status_code == 200:
                    out["ready_s"] = time.perf_counter() - t0
                    out["step_count"] = answer.json().get("step_count")
                    return out
            time.sleep(POLL_S)
    raise TimeoutError(f"child {env_id}'s /state did not answer in {READY_TIMEOUT_S:.0f} s")


def _deleter(api: Denv, env_id: str) -> Callable[[], None]:
    return lambda: api.delete_env(env_id)


def _http_fork(api: Denv, server: Server, root_id: str, n: int, parent: int) -> dict[str, Any]:
    """`fork(root_id, n, kind="auto", wait="none")` to every child's /state answered
    (`parent`: the root's step_count); the children's kinds and memory; then they go."""
    since = log_size(server)
    t0 = time.perf_counter()
    fork = api.fork(root_id, n, kind="auto", wait="none")
    call_s = time.perf_counter() - t0
    ids = [e.id for e in fork.envs]
    try:
        with ThreadPoolExecutor(len(ids)) as pool:
            ready = list(pool.map(lambda env_id: _ready(api, env_id, t0), ids))
        kinds = [str(api.get_env(env_id).start) for env_id in ids]
        memory = [child_memory(root_id, i, kind) for i, kind in zip(ids, kinds, strict=True)]
    finally:
        parallel([_deleter(api, env_id) for env_id in ids])
    return {
        "s": max(r["ready_s"] for r in ready),
        "call_s": call_s,
        "child_ready_s": [r["ready_s"] for r in ready],
        "child_after_call_s": [r["ready_s"] - call_s for r in ready],
        "child_endpoint_s": [r.get("endpoint_s") for r in ready],
        "kinds": sorted(set(kinds)),
        "child_kinds": kinds,
        "parent_step_count": parent,
        "step_count": [r["step_count"] for r in ready],
        "state_carried": all(r["step_count"] == parent for r in ready),
        "memory": memory,
        "checkpoint": checkpoint_of(server, root_id, since),
    }


def _http_round(b: Bench, live: bool, forks: tuple[int, ...]) -> dict[str, Any]:
    """An env made with `Denv` (`live="auto"` when `live`), stepped over HTTP, then each
    fork(n) of it (the children deleted before the next), then deleted."""
    server = b.server
    live_arg: bool | Literal["auto"] = "auto" if live else False
    with Denv(server.url, server.api_key, timeout_s=READY_TIMEOUT_S) as api:
        t0 = time.perf_counter()
        root = api.create_sandbox(b.image, live=live_arg, ttl_s=3600, wait="healthy")
        try:
            out: dict[str, Any] = {"start_s": time.perf_counter() - t0, "start": str(root.start)}
            out["live"] = root.live
            url = _ingress_url(root)
            if str(root.status) != "healthy" or url is None:
                raise RuntimeError(f"env {root.id} is {root.status} ({root.error})")
            _http_steps(url, HTTP_STEPS, reset=True)
            for n in forks:
                b.settle(max_s=120)  # the last fork's children gone
                step_count = _http_steps(url, 1, reset=False)
                out[f"http_fork{n}"] = _http_fork(api, server, root.id, n, step_count)
            return out
        finally:
            api.delete_env(root.id)


class WarmRoot:
    """A gvisor root whose volume forks start from `n` booted spares (kept for the run)."""

    def __init__(self, server: Server, image: str, n: int) -> None:
        self.provider = _provider(server, fork="volume", warm=n, warm_fork=True)
        self.client: Any = GenericEnvClient.from_docker_image(image, provider=self.provider)
        self.client = self.client.sync()
        self.client.reset()
        for i in range(3):
            self.client.step({"message": f"prefix {i}"})

    def close(self) -> None:
        self.client.close()


def _warm_fork(b: Bench, warm: WarmRoot, n: int) -> dict[str, Any]:
    b.settle(max_s=240)  # the pool refilled after the last fork
    found = _fork(b.server, warm.client, n)
    found["state_carried"] = found["step_count"] == [3] * n
    return found


def _med(rows: list[dict[str, Any]], get: Callable[[dict[str, Any]], Any]) -> float | None:
    values = []
    for row in rows:
        try:
            value = get(row)
        except (KeyError, TypeError):
            continue
        if value is not None:
            values.extend(value if isinstance(value, list) else [value])
    return summarize([float(v) for v in values]).get("median") if values else None


def _summary(rows: list[dict[str, Any]], forks: tuple[int, ...]) -> dict[str, Any]:
    ok = [r for r in rows if "error" not in r]
    out: dict[str, Any] = {
        "start_s": _med(ok, lambda r: r["start_s"]),
        "step_median_s": _med(ok, lambda r: r["step_median_s"]),
        "memory_env_cgroup": _med(ok, lambda r: r["memory_env"]["cgroup"]),
        "memory_env_uss": _med(ok, lambda r: r["memory_env"]["uss"]),
        "errors": [r["error"] for r in rows if "error" in r],
    }
    for n in forks:
        forked = [r[f"fork{n}"] for r in ok if f"fork{n}" in r]
        out[f"fork{n}_s"] = _med(forked, lambda f: f["s"])
        out[f"fork{n}_kinds"] = sorted({k for f in forked for k in f["kinds"]})
        out[f"fork{n}_state_carried"] = all(f["state_carried"] for f in forked)
        memory = [m for f in forked for m in f["memory"]]
        out[f"memory_child{n}_cgroup"] = _med(memory, lambda m: m.get("cgroup"))
        out[f"memory_child{n}_uss"] = _med(memory, lambda m: m["uss"])
        out[f"fork{n}_checkpoint_refused"] = _refusals(forked)
    return out


def _refusals(forked: list[dict[str, Any]]) -> list[str]:
    """Why the server did not save the parent's sandbox for these forks (each reason once)."""
    saves = [f.get("checkpoint") or {} for f in forked]
    return sorted({str(c["refused"]) for c in saves if "refused" in c})


def _http_summary(rows: list[dict[str, Any]], forks: tuple[int, ...]) -> dict[str, Any]:
    """Medians of the http_fork rounds (a child's own times over every child of them)."""
    ok = [r for r in rows if "error" not in r]
    out: dict[str, Any] = {
        "http_start_s": _med(ok, lambda r: r["start_s"]),
        "http_errors": [r["error"] for r in rows if "error" in r],
    }
    saved_all: list[dict[str, Any]] = []
    for n in forks:
        key = f"http_fork{n}"
        forked = [r[key] for r in ok if key in r]
        out[f"{key}_s"] = _med(forked, lambda f: f["s"])
        out[f"{key}_call_s"] = _med(forked, lambda f: f["call_s"])
        out[f"{key}_child_ready_s"] = _med(forked, lambda f: f["child_ready_s"])
        out[f"{key}_child_after_call_s"] = _med(forked, lambda f: f["child_after_call_s"])
        out[f"{key}_kinds"] = sorted({k for f in forked for k in f["kinds"]})
        out[f"{key}_state_carried"] = bool(forked) and all(f["state_carried"] for f in forked)
        memory = [m for f in forked for m in f["memory"]]
        out[f"http_memory_child{n}_cgroup"] = _med(memory, lambda m: m.get("cgroup"))
        out[f"http_memory_child{n}_uss"] = _med(memory, lambda m: m["uss"])
        saved = [c for f in forked if "s" in (c := f.get("checkpoint") or {})]
        saved_all += saved
        out[f"{key}_checkpoint_s"] = _med(saved, lambda c: c["s"])
        out[f"{key}_checkpoint_mb"] = _med(saved, lambda c: c["mb"])
        out[f"{key}_checkpoint_refused"] = _refusals(forked)
    out["checkpoint_s"] = _med(saved_all, lambda c: c["s"])
    out["checkpoint_mb"] = _med(saved_all, lambda c: c["mb"])
    out["checkpoints"] = len(saved_all)
    return out


def _restore_boot_live(medians: dict[str, dict[str, Any]], n: int) -> dict[str, Any]:
    """fork(n) side by side: gvisor over HTTP with no session open (its children resumed
    from the parent's checkpoint: `restored`), gvisor from a WebSocket client holding its
    session (children booted: `cold`), runc over HTTP and over WebSocket (live)."""
    g, r = medians["gvisor"], medians["runc"]
    restore, boot, live = g.get(f"http_fork{n}_s"), g.get(f"fork{n}_s"), r.get(f"http_fork{n}_s")
    return {
        "gvisor_http_s": restore,
        "gvisor_http_kinds": g.get(f"http_fork{n}_kinds"),
        "gvisor_http_child_ready_s": g.get(f"http_fork{n}_child_ready_s"),
        "gvisor_http_child_after_call_s": g.get(f"http_fork{n}_child_after_call_s"),
        "gvisor_websocket_s": boot,
        "gvisor_websocket_kinds": g.get(f"fork{n}_kinds"),
        "runc_http_s": live,
        "runc_http_kinds": r.get(f"http_fork{n}_kinds"),
        "runc_websocket_s": r.get(f"fork{n}_s"),
        "gvisor_websocket_over_http": ratio(boot, restore),
        "gvisor_http_over_runc_http": ratio(restore, live),
    }


def _servers(b: Bench) -> dict[str, Bench]:
    """A Bench per isolation on a server of its own (settle() watches that server's envs)."""
    started: dict[str, Bench] = {}
    try:
        for name in ISOLATIONS:
            args = ("--isolation", "gvisor") if name == "gvisor" else ()
            server = start_server(Path(f"{b.server.state_dir}-{name}"), (*args, *SERVER_ARGS))
            started[name] = Bench(server, b.image, b.profile, b.run_id)
    except BaseException:
        _stop(started)
        raise
    return started


def _stop(servers: dict[str, Bench]) -> None:
    for each in servers.values():
        stop_process(each.server.proc)
        remove_leftovers(each.server.state_dir)


def run(b: Bench) -> dict[str, dict[str, Any]]:
    p = b.profile
    rounds, steps = int(p.isolation_rounds), int(p.isolation_steps)
    forks = tuple(int(n) for n in p.isolation_forks)
    servers = _servers(b)
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in ISOLATIONS}
    http_rows: dict[str, list[dict[str, Any]]] = {name: [] for name in ISOLATIONS}
    warm_rows: list[dict[str, Any]] = []
    warm: WarmRoot | None = None
    refused = ""
    try:
        for i in range(rounds):
            order = ISOLATIONS if i % 2 == 0 else ISOLATIONS[::-1]
            for name in order:
                servers[name].settle(max_s=120)
                try:
                    row = _round(servers[name].server, b.image, steps, forks)
                except Exception as exc:
                    log.warning("%s round %d failed: %s", name, i, exc)
                    row = {"error": f"{type(exc).__name__}: {exc}"}
                rows[name].append(row)
                log.info("%s round %d: %s", name, i + 1, _brief(row, forks))
                servers[name].settle(max_s=120)
                try:
                    row = _http_round(servers[name], name == "runc", forks)
                except Exception as exc:
                    log.warning("%s round %d over HTTP failed: %s", name, i, exc)
                    row = {"error": f"{type(exc).__name__}: {exc}"}
                http_rows[name].append(row)
                log.info("%s round %d over HTTP: %s", name, i + 1, _brief_http(row, forks))
            if p.isolation_warm and not refused:
                try:
                    if warm is None:
                        warm = WarmRoot(servers["gvisor"].server, b.image, max(forks))
                    warm_rows.append(_warm_fork(servers["gvisor"], warm, max(forks)))
                except Conflict as exc:  # the server says no: ask once, record why
                    log.info("gvisor warm forks refused: %s", exc)
                    refused = str(exc)
                except Exception as exc:
                    log.warning("gvisor warm fork failed: %s", exc)
                    warm_rows.append({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        if warm is not None:
            try:
                warm.close()
            except Exception as exc:
                log.info("closing the warm root failed (%s); the server's stop removes it", exc)
        _stop(servers)
    result = _result(rows, warm_rows, forks, rounds, steps, bool(p.isolation_warm))
    result = _with_http(result, http_rows, forks)
    if refused:
        result["gvisor_warm"] = {"refused": refused}
    return {"isolation": result}


def _brief(row: dict[str, Any], forks: tuple[int, ...]) -> str:
    if "error" in row:
        return str(row["error"])
    parts = [f"start {row['start_s']:.2f} s", f"step {row['step_median_s'] * 1000:.2f} ms"]
    parts += [f"fork({n}) {row[f'fork{n}']['s']:.2f} s" for n in forks]
    return ", ".join(parts)


def _brief_http(row: dict[str, Any], forks: tuple[int, ...]) -> str:
    if "error" in row:
        return str(row["error"])
    parts = [f"start {row['start_s']:.2f} s"]
    for n in forks:
        f = row[f"http_fork{n}"]
        saved = f.get("checkpoint") or {}
        note = f", checkpoint {saved['s']:.2f} s {saved['mb']:.1f} MB" if "s" in saved else ""
        parts.append(f"fork({n}) {f['s']:.2f} s ({'/'.join(f['kinds'])}{note})")
    return ", ".join(parts)


def _with_http(
    result: dict[str, Any], http_rows: dict[str, list[dict[str, Any]]], forks: tuple[int, ...]
) -> dict[str, Any]:
    """`_result` with the http_fork rounds: their medians beside the others, their gvisor /
    runc ratios, fork(n) by restore, boot and live side by side, the rounds themselves."""
    medians, ratios = result["medians"], result["ratios_gvisor_over_runc"]
    for name in ISOLATIONS:
        medians[name].update(_http_summary(http_rows[name], forks))
    for key, value in medians["runc"].items():
        if key.startswith(("http_", "checkpoint")) and not isinstance(value, bool | list):
            ratios[key] = ratio(medians["gvisor"][key], value)
    result["what"] += (
        "; http_fork(n): an env made with Denv (live='auto' under runc), stepped over plain "
        "HTTP through its ingress endpoint with no session open, fork(n, kind='auto', "
        "wait='none') to every child's /state answered through its endpoint (polled every "
        f"{POLL_S} s): the fork call's time (under gvisor it holds the checkpoint of the "
        "parent's sandbox), each child's time to that answer from the fork request "
        "(child_ready) and from the fork's answer (child_after_call: a restored child's "
        "restore to ready), its start (live, restored, cold) and whether it answered the "
        "parent's step_count; checkpoint: seconds and MB of the saved sandbox, from the "
        "gvisor server's log (or why it was not saved: `refused`)"
    )
    result["params"].update({"http_steps": HTTP_STEPS, "poll_s": POLL_S})
    result["fork_restore_boot_live"] = {f"fork{n}": _restore_boot_live(medians, n) for n in forks}
    result["http_rounds"] = http_rows
    return result


def _result(
    rows: dict[str, list[dict[str, Any]]],
    warm_rows: list[dict[str, Any]],
    forks: tuple[int, ...],
    rounds: int,
    steps: int,
    warm: bool,
) -> dict[str, Any]:
    medians = {name: _summary(rows[name], forks) for name in ISOLATIONS}
    numbers = {k: v for k, v in medians["runc"].items() if not isinstance(v, bool | list)}
    n = max(forks)
    warm_ok = [r for r in warm_rows if "error" not in r]
    warm_summary = (
        {
            f"fork{n}_s": _med(warm_ok, lambda r: r["s"]),
            "kinds": sorted({k for r in warm_ok for k in r["kinds"]}),
            "state_carried": [r["state_carried"] for r in warm_ok],
            f"memory_child{n}_uss": _med(
                [m for r in warm_ok for m in r["memory"]], lambda m: m["uss"]
            ),
            "errors": [r["error"] for r in warm_rows if "error" in r],
        }
        if warm
        else None
    )
    return {
        "what": "runc against gvisor on OpenEnv's echo env, the defaults a user gets "
        "(fork='auto': live under runc, volume under gvisor; a child's `kinds` is its "
        "provider's start: live, or cold / warm for a volume child): start to the first reset() "
        "answered; the median WebSocket step through ingress; fork(n) to every child's "
        "state() answered; memory of the root env's container and of each child, bytes "
        "(cgroup: usage less inactive file; uss: smaps_rollup Private_* of its processes)",
        "params": {"rounds": rounds, "steps": steps, "warmup_steps": WARMUP, "forks": forks},
        "medians": medians,
        "ratios_gvisor_over_runc": {k: ratio(medians["gvisor"][k], v) for k, v in numbers.items()},
        "gvisor_warm": warm_summary,
        "rounds": rows,
        "gvisor_warm_rounds": warm_rows,
    }
