"""runc against gVisor (issue 45): start, step latency, fork(n), memory, on two servers.

Two private servers run side by side, `denv serve` (runc, Docker's default) and
`denv serve --isolation gvisor` (every env's containers under runsc through the engine's
`denv-runsc` runtime). Each round does the same on both, in an order that alternates, on
OpenEnv's echo env through the public API (`DenvProvider`, `GenericEnvClient`,
`fork_clients`) with the defaults a user gets (`fork="auto"`: live under runc, volume
under gvisor, which refuses live):

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
  parent's container (bench.live_cgroups), a volume child's own container.
- ``gvisor_warm`` (full profile): the same from a gvisor root with `warm=n` spares booted
  (`warm_fork=True`), after the pool refilled; or the server's refusal, asked once (a
  spare's /work is mounted after it boots, which a gVisor sandbox does not see).

Results: bench/results/isolation.json (medians, and gvisor / runc ratios). Nothing asserts
on time.

Run: ``python -m bench --only isolation`` (``make bench`` runs every benchmark;
``--quick`` and ``--smoke`` are smaller profiles: bench/__main__.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from denv.openenv import DenvProvider, fork_clients
from openenv.core import GenericEnvClient

from denv import Conflict

from .bench_start import READY_TIMEOUT_S
from .harness import Bench, Server, ratio, remove_leftovers, start_server, stop_process, summarize
from .live_cgroups import TREE, container_pid, group_of
from .live_density import env_memory, private_bytes
from .measure import container_memory, sh

log = logging.getLogger("bench.isolation")

ISOLATIONS = ("runc", "gvisor")
WARMUP = 10


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


def _fork(root: Any, n: int) -> dict[str, Any]:
    """fork_clients(root, n) to every child's state() answered; then their memory, closed."""
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
            out[f"fork{n}"] = _fork(root, n)
        return out
    finally:
        root.close()


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
    found = _fork(warm.client, n)
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
    return out


def _servers(b: Bench) -> dict[str, Bench]:
    """A Bench per isolation on a server of its own (settle() watches that server's envs)."""
    started: dict[str, Bench] = {}
    try:
        for name in ISOLATIONS:
            args = ("--isolation", "gvisor") if name == "gvisor" else ()
            server = start_server(Path(f"{b.server.state_dir}-{name}"), args)
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
    if refused:
        result["gvisor_warm"] = {"refused": refused}
    return {"isolation": result}


def _brief(row: dict[str, Any], forks: tuple[int, ...]) -> str:
    if "error" in row:
        return str(row["error"])
    parts = [f"start {row['start_s']:.2f} s", f"step {row['step_median_s'] * 1000:.2f} ms"]
    parts += [f"fork({n}) {row[f'fork{n}']['s']:.2f} s" for n in forks]
    return ", ".join(parts)


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
