"""Live forks (issue 14) side by side with warm volume forks and with replay, in one run.

- ``live_fork8``: `fork_clients(root, 8)` of a live echo env (`DenvProvider(fork="live")`)
  against the same of a warm-volume root (`DenvProvider(warm=8)`, its 8 spares booted before
  each round), to 8 ready clients (health and a WebSocket through the ingress), rounds
  alternating; the children's state is checked equal to the root's.
- ``live_tree``: a tree search from a stepped root, branching B, depth D, a fork at every
  inner node and one step in every new node (B=4, D=4: 85 envs), by live forks, by warm
  volume forks, and by replay (every node a fresh env replaying its path); one plot.
- ``live_sustained``: live children made per second over S seconds (fork(8) after fork(8)
  from one root, each batch deleted in the background); ``sustained2``: the same with two
  clients forking two roots at once.
- ``live_cpu``: CPU time of one live fork(8) to 8 ready clients, by who spends it (the denv
  server, the root's process, this client, the 8 children), and the floor it sets on this
  machine's cores (the sum over the cores: no schedule can beat it).
- ``live_memory``: private memory (smaps_rollup Private_*) of each of 8 live children after
  one step each, against the root's.
- ``live_seed``: the seed's usage as written, with `DenvProvider()`'s defaults: a root of
  OpenEnv's echo env as OpenEnv builds it (the `openenv init` image, when built), reset, 10
  steps, then `[root.provider.fork() for _ in range(8)]`, until each child answered
  `state()`; side by side with the same under `DenvProvider(fork="volume")` (one round: each
  child boots).

Nothing asserts on time; the ratios go to bench/results/live.json and SUMMARY.md.

Run: ``python -m bench --only live,live_tree`` (``make bench-live``; ``make bench`` runs every
benchmark; ``--quick`` and ``--smoke`` are smaller profiles: bench/__main__.py).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from denv.openenv import DenvProvider, fork_clients
from openenv.core import GenericEnvClient

from .bench_start import READY_TIMEOUT_S
from .harness import Bench, parallel, ratio, summarize
from .measure import sh

log = logging.getLogger("bench.live")


class Root:
    """A stepped root env: live (`fork="live"`) or warm volume (`warm=n`)."""

    def __init__(self, b: Bench, kind: str, warm: int = 0, steps: int = 10) -> None:
        options: dict[str, Any] = {"ttl_s": 7200, "timeout_s": READY_TIMEOUT_S}
        if kind == "live":
            options["fork"] = "live"
        else:
            options.update(warm=warm, warm_fork=True)
        self.kind = kind
        self.provider: DenvProvider = b.provider(**options)
        url = self.provider.start_container(b.image)
        self.provider.wait_for_ready(url)
        self.client: Any = GenericEnvClient(base_url=url, provider=self.provider).sync()
        self.client.reset()
        for i in range(steps):
            self.client.step({"message": f"prefix {i}"})
        self.steps = steps

    def close(self) -> None:
        self.client.close()


def _fork8_once(root: Root, n: int) -> dict[str, Any]:
    """fork_clients(root, n), until every child has answered state() over its WebSocket
    (through the ingress): the same finish line for both kinds."""
    t0 = time.perf_counter()
    children = fork_clients(root.client, n)
    states = parallel([c.state for c in children])
    elapsed = time.perf_counter() - t0
    try:
        ok = all(s["step_count"] == root.steps for s in states)
        starts = [str(c.provider.start) for c in children]
    finally:
        parallel([c.close for c in children])
    return {"ready_s": elapsed, "state_ok": ok, "starts": starts}


def fork8(b: Bench) -> dict[str, Any]:
    n, rounds = int(b.profile.fork8_n), int(b.profile.fork8_warm_runs)
    live, warm = Root(b, "live"), Root(b, "warm", warm=n)
    runs: dict[str, list[dict[str, Any]]] = {"live": [], "warm": []}
    try:
        for i in range(rounds):
            plan: list[tuple[str, Callable[[], dict[str, Any]]]] = [
                ("live", lambda: _fork8_once(live, n)),
                ("warm", lambda: _fork8_once(warm, n)),
            ]
            warm.provider.wait_warm(timeout_s=600)
            b.settle(max_s=120)
            for kind, fn in plan[i % 2 :] + plan[: i % 2]:
                runs[kind].append(fn())
                if kind == "warm":
                    warm.provider.wait_warm(timeout_s=600)
                    b.settle(max_s=120)
    finally:
        live.close()
        warm.close()
    ready = {k: summarize([r["ready_s"] for r in v]) for k, v in runs.items()}
    return {
        "n": n,
        "ready": ready,
        "state_ok": all(r["state_ok"] for v in runs.values() for r in v),
        "warm_share": sum(s == "warm" for r in runs["warm"] for s in r["starts"])
        / max(1, sum(len(r["starts"]) for r in runs["warm"])),
        "ratios": {
            "warm_over_live_median": ratio(ready["warm"]["median"], ready["live"]["median"])
        },
        "runs": runs,
    }


# --- the tree search -----------------------------------------------------------------------


def _tree_fork(root: Root, branching: int, depth: int) -> dict[str, Any]:
    """Every inner node forks `branching` children, each steps once; all nodes closed."""
    made: list[Any] = []
    t0 = time.perf_counter()
    level = [root.client]
    for d in range(depth - 1):
        nxt: list[Any] = []

        def grow(node: Any, d: int = d) -> list[Any]:
            kids = fork_clients(node, branching)
            for i, kid in enumerate(kids):
                kid.step({"message": f"depth {d + 1} branch {i}"})
            return kids

        for kids in parallel([lambda n=node: grow(n) for node in level]):
            nxt += kids
        made += nxt
        level = nxt
    elapsed = time.perf_counter() - t0
    parallel([c.close for c in made])
    return {"s": elapsed, "envs": len(made) + 1}


def _tree_replay(b: Bench, root_steps: int, branching: int, depth: int) -> dict[str, Any]:
    """Every node but the root a fresh env that replays its path (8 at a time)."""
    paths: list[int] = []
    for d in range(1, depth):
        paths += [root_steps + d] * (branching**d)

    def replay(steps: int) -> None:
        p = b.provider(timeout_s=READY_TIMEOUT_S)
        url = p.start_container(b.image)
        p.wait_for_ready(url)
        client: Any = GenericEnvClient(base_url=url, provider=p).sync()
        try:
            client.reset()
            for i in range(steps):
                client.step({"message": f"replay {i}"})
        finally:
            client.close()

    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(replay, paths))
    return {"s": time.perf_counter() - t0, "envs": len(paths) + 1}


def tree(b: Bench) -> dict[str, Any]:
    branching, depth = (int(x) for x in b.profile.live_tree)
    out: dict[str, Any] = {"branching": branching, "depth": depth}
    live = Root(b, "live")
    try:
        out["live"] = _tree_fork(live, branching, depth)
    finally:
        live.close()
    b.settle(max_s=120)
    if b.profile.live_tree_compare:
        warm = Root(b, "warm", warm=branching)
        try:
            warm.provider.wait_warm(timeout_s=600)
            b.settle(max_s=120)
            out["warm"] = _tree_fork(warm, branching, depth)
        finally:
            warm.close()
        b.settle(max_s=120)
        out["replay"] = _tree_replay(b, 10, branching, depth)
    out["ratios"] = {
        "warm_over_live": ratio(out.get("warm", {}).get("s"), out["live"]["s"]),
        "replay_over_live": ratio(out.get("replay", {}).get("s"), out["live"]["s"]),
    }
    return out


# --- sustained rate and memory --------------------------------------------------------------


def deleter(api: Any, outstanding: threading.BoundedSemaphore) -> Callable[[list[str]], None]:
    """Deletes a batch of envs, then releases one ``outstanding`` slot (even on failure)."""

    def delete(ids: list[str]) -> None:
        try:
            for i in ids:
                api.delete_env(i)
        finally:
            outstanding.release()

    return delete


def sustained(b: Bench, forkers: int = 1) -> dict[str, Any]:
    """Live children made per second over S seconds: each of ``forkers`` threads forks its
    own live root into 8, again and again; every batch is deleted in the background (at
    most 6 batches alive at once, under the key's env quota)."""
    seconds = float(b.profile.live_sustained_s)
    roots = [Root(b, "live") for _ in range(forkers)]
    api = b.denv()
    made = [0] * forkers
    deletes = ThreadPoolExecutor(4)
    outstanding = threading.BoundedSemaphore(6)
    t0 = time.perf_counter()

    delete = deleter(api, outstanding)

    def forker(k: int) -> None:
        env_id = roots[k].provider.env_id or ""
        while time.perf_counter() - t0 < seconds:
            outstanding.acquire()
            fork = api.fork(env_id, 8, kind="live")
            made[k] += sum(str(e.status) == "healthy" for e in fork.envs)
            deletes.submit(delete, [e.id for e in fork.envs])

    try:
        parallel([lambda k=k: forker(k) for k in range(forkers)])  # type: ignore[misc]
        elapsed = time.perf_counter() - t0
    finally:
        deletes.shutdown(wait=True)
        for root in roots:
            root.close()
        api.close()
    return {
        "seconds": elapsed,
        "forkers": forkers,
        "children": sum(made),
        "per_s": sum(made) / elapsed,
    }


def sustained2(b: Bench) -> dict[str, Any]:
    """The same with two forking clients at once (two roots): what a search that forks
    several nodes at a time gets from one server."""
    return sustained(b, forkers=2)


def _private_mb(pid: int) -> float:
    total = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            total += int(line.split()[1])
    return total / 1024


def _pid_on_port(container: str, port: int) -> int:
    pid1 = int(sh("docker", "inspect", "-f", "{{.State.Pid}}", container).strip())
    inodes = {
        f.split()[9]
        for f in Path(f"/proc/{pid1}/net/tcp").read_text().splitlines()[1:]
        if f.split()[3] == "0A" and int(f.split()[1].split(":")[1], 16) == port
    }
    full = sh("docker", "inspect", "-f", "{{.Id}}", container).strip()
    # Docker's parent or the API key's group; live servers have cgroups of their own below
    trees = Path("/sys/fs/cgroup/pids").glob(f"*/{full}")
    for pid in (p for t in trees for f in t.rglob("cgroup.procs") for p in f.read_text().split()):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if fd.readlink().as_posix()[8:-1] in inodes:
                    return int(pid)
            except OSError:
                continue
    raise RuntimeError(f"no process listens on {port}")


def live_pid(env_id: str) -> int:
    """The host pid of a live env's server (pid 1 of its pid namespace, in the cgroup named
    after it), whether it serves in its container's network namespace or its own."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if f"/denv-live/{env_id}\n" in (proc / "cgroup").read_text():
                    found.append(int(proc.name))
            except OSError:
                continue
    if not found:
        raise RuntimeError(f"no process of live env {env_id}")
    return min(found)


def memory(b: Bench) -> dict[str, Any]:
    root = Root(b, "live")
    try:
        children = fork_clients(root.client, 8)
        try:
            for i, c in enumerate(children):
                c.step({"message": f"diverge {i}"})
            root_pid = live_pid(root.provider.env_id or "")
            child_mb = [_private_mb(live_pid(c.provider.env_id or "")) for c in children]
        finally:
            parallel([c.close for c in children])
        return {"root_mb": _private_mb(root_pid), "child_mb": summarize(child_mb)}
    finally:
        root.close()


def cpu_ns(pid: int) -> int:
    """CPU time a process (all its threads) has run, in ns (/proc/PID/task/*/schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError):
            continue
    return total


def cpu(b: Bench) -> dict[str, Any]:
    """Where the CPU of one live fork(8) to 8 ready clients goes: the denv server (API,
    node, ingress), the root's server process (its clones), this client (fork_clients and
    the 8 state() calls), and the 8 children (from their clone to their first answer)."""
    root = Root(b, "live")
    rows: list[dict[str, float]] = []
    try:
        root_pid = live_pid(root.provider.env_id or "")
        server_pid = b.server.proc.pid
        for _ in range(int(b.profile.fork8_warm_runs)):
            before = {"server": cpu_ns(server_pid), "root": cpu_ns(root_pid)}
            before["client"] = cpu_ns(os.getpid())
            children = fork_clients(root.client, 8)
            parallel([c.state for c in children])
            after = {"server": cpu_ns(server_pid), "root": cpu_ns(root_pid)}
            after["client"] = cpu_ns(os.getpid())
            kids = [cpu_ns(live_pid(c.provider.env_id or "")) for c in children]
            parallel([c.close for c in children])
            row = {k: (after[k] - before[k]) / 1e6 for k in before}
            row["children"] = sum(kids) / 1e6
            rows.append(row)
            b.settle(max_s=30)
    finally:
        root.close()
    parts = {k: summarize([r[k] for r in rows]) for k in rows[0]}
    total = sum(p["median"] for p in parts.values())
    return {
        "ms_per_fork8": parts,
        "total_ms_median": total,
        # A child's own, from its clone to its first answer; and the fork's whole CPU over 8.
        "per_child_ms": {"child": parts["children"]["median"] / 8, "all": total / 8},
        "cores": os.cpu_count(),
        "floor_ms": total / (os.cpu_count() or 1),
    }


def _parts(b: Bench, parts: list[tuple[str, Callable[[Bench], dict[str, Any]]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, fn in parts:
        log.info("-- live %s", name)
        try:
            out[name] = fn(b)
        except Exception as exc:
            log.exception("live %s failed", name)
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
        b.settle(max_s=120)
    return out


# OpenEnv's echo env as OpenEnv builds it (`make image-openenv-template`); the bench's image
# when that is not built.
OPENENV_TEMPLATE = "denv-openenv-template:latest"


def _seed_once(b: Bench, image: str, fork: str, steps: int = 10) -> dict[str, Any]:
    """The seed's usage: a stepped root, then `live_seed_forks` (8) single `provider.fork()`
    calls, timed until every child has answered state() (its step count checked)."""
    provider = b.provider(fork=fork, ttl_s=7200, timeout_s=READY_TIMEOUT_S)
    root: Any = GenericEnvClient.from_docker_image(image, provider=provider).sync()
    branches: list[DenvProvider] = []
    try:
        root.reset()
        for i in range(steps):
            root.step({"message": f"prefix {i}"})
        t0 = time.perf_counter()
        branches = [root.provider.fork() for _ in range(int(b.profile.live_seed_forks))]
        clients = [GenericEnvClient(base_url=p.base_url, provider=p).sync() for p in branches]
        states = [c.state() for c in clients]
        elapsed = time.perf_counter() - t0
        kept = fork != "volume" or image == b.image  # a volume fork keeps /work, not memory
        return {
            "s": elapsed,
            "starts": [str(p.start) for p in branches],
            "state_ok": all(s["step_count"] == steps for s in states) if kept else None,
        }
    finally:
        parallel([p.stop_container for p in branches])
        root.close()


def seed(b: Bench) -> dict[str, Any]:
    built = sh("docker", "image", "ls", "-q", OPENENV_TEMPLATE, check=False)
    image = OPENENV_TEMPLATE if built else b.image
    rounds = max(1, int(b.profile.fork8_warm_runs))
    runs = {"default": [_seed_once(b, image, "auto") for _ in range(rounds)]}
    b.settle(max_s=120)
    runs["volume"] = [_seed_once(b, image, "volume")]
    times = {k: summarize([r["s"] for r in v]) for k, v in runs.items()}
    return {
        "image": image,
        "forks": int(b.profile.live_seed_forks),
        "eight_forks_s": times,  # the name of the full run's count
        "starts": {k: sorted({s for r in v for s in r["starts"]}) for k, v in runs.items()},
        "state_ok": all(r["state_ok"] is not False for v in runs.values() for r in v),
        "ratios": {
            "volume_over_default_median": ratio(
                times["volume"]["median"], times["default"]["median"]
            )
        },
        "runs": runs,
    }


def run(b: Bench) -> dict[str, dict[str, Any]]:
    """fork(8) live vs warm, per-child memory, the sustained rate (results: live.json)."""
    parts: list[tuple[str, Callable[[Bench], dict[str, Any]]]] = [
        ("seed", seed),
        ("fork8", fork8),
        ("cpu", cpu),
        ("memory", memory),
        ("sustained", sustained),
        ("sustained2", sustained2),
    ]
    return {"live": _parts(b, parts)}


def run_tree(b: Bench) -> dict[str, dict[str, Any]]:
    """The tree search by live forks, warm volume forks and replay (live_tree.json)."""
    return {"live_tree": tree(b)}
