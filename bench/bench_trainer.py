"""What trainers wait for (issue 15): warm starts of one image, async calls, diffs of versions.

Three measurements, each side by side in the same run and reported as ratios:

- warm16: `n` envs of one image started at once and ready (health and a WebSocket), by `n`
  threads each with its own provider: DenvProvider(warm=n) with the image's n spares booted
  beforehand (a first env asked for them, `wait_warm`), against `n` concurrent OpenEnv
  LocalDockerProvider starts (each of a tag of its own of the image: it names containers
  by the millisecond), and `n` cold DenvProvider starts for reference. Rounds rotate
  the order; the machine settles between measurements.
- async_get_env: `m` `get_env` calls of one env, gathered on one event loop through
  `AsyncDenv`, against the same `m` calls one after another through `Denv`.
- diff: `Denv.diff` of two versions of a volume holding 1 GB (1024 files of 1 MB) where
  1 MB changed: a fork's child that rewrote one file, snapshotted (the versions share the
  1 GB layer), and two snapshots of one env (their layers share nothing: every file is
  compared). Checked: the diff lists exactly the one file.

Run: ``python -m bench --only trainer`` (``make bench-trainer``; ``make bench`` runs every
benchmark; ``--quick`` and ``--smoke`` are smaller profiles: bench/__main__.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from openenv.core.containers.runtime import LocalDockerProvider

from denv import AsyncDenv

from . import local_docker
from .harness import Bench, parallel, ratio, summarize
from .measure import sh

log = logging.getLogger("bench.trainer")

READY_TIMEOUT_S = 300.0
MB = 1024 * 1024


# -- warm16 ----------------------------------------------------------------------------------


def _denv_concurrent(b: Bench, n: int, warm: int) -> dict[str, Any]:
    providers = [b.provider(warm=warm, timeout_s=READY_TIMEOUT_S) for _ in range(n)]

    def start(p: Any) -> Callable[[], None]:
        return lambda: p.wait_for_ready(p.start_container(b.image))

    t0 = time.perf_counter()
    try:
        parallel([start(p) for p in providers])
        elapsed = time.perf_counter() - t0
        starts = [str(p.start) for p in providers]
    finally:
        parallel([p.stop_container for p in providers])
    return {"ready_s": elapsed, "starts": starts}


def _local_concurrent(b: Bench, n: int) -> dict[str, Any]:
    """`n` OpenEnv LocalDockerProvider starts at once, each of a tag of its own of the image
    (it names containers after the image and the millisecond: bench.local_docker)."""

    def start(image: str) -> Callable[[], None]:
        def run() -> None:
            p = LocalDockerProvider()
            url = p.start_container(image, env_vars=local_docker.marker(b.run_id))
            p.wait_for_ready(url, timeout_s=READY_TIMEOUT_S)

        return run

    with local_docker.tags(b.image, b.run_id, n) as images:
        t0 = time.perf_counter()
        try:
            parallel([start(image) for image in images])
            return {"ready_s": time.perf_counter() - t0}
        finally:
            # `docker rm -f`: its own stop waits out a 10 s grace each
            local_docker.remove(b.image, b.run_id)


def _warm_round(b: Bench, n: int) -> dict[str, Any]:
    """One env asks for `n` spares of the image; once they are booted, `n` more start."""
    seed = b.provider(warm=n, timeout_s=READY_TIMEOUT_S)
    try:
        seed.wait_for_ready(seed.start_container(b.image))
        pool = seed.wait_warm(timeout_s=900)
        b.settle(max_s=120)
        out = _denv_concurrent(b, n, warm=n)
        out["spares_ready"] = pool.ready
        return out
    finally:
        seed.stop_container()


def warm16(b: Bench) -> dict[str, Any]:
    n, rounds = int(b.profile.trainer_envs), int(b.profile.trainer_rounds)
    runs: dict[str, list[dict[str, Any]]] = {"denv_warm": [], "local": [], "denv_cold": []}
    plan: dict[str, Callable[[], dict[str, Any]]] = {
        "denv_warm": lambda: _warm_round(b, n),
        "local": lambda: _local_concurrent(b, n),
        "denv_cold": lambda: _denv_concurrent(b, n, warm=0),
    }
    kinds = list(plan)
    for r in range(rounds):
        for kind in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
            log.info("warm16 round %d: %s x%d", r + 1, kind, n)
            try:
                runs[kind].append(plan[kind]())
            except Exception as exc:
                log.warning("%s failed: %s", kind, exc)
                runs[kind].append({"error": f"{type(exc).__name__}: {exc}"})
            b.settle(max_s=120)
    ready = {k: summarize([x["ready_s"] for x in v if "ready_s" in x]) for k, v in runs.items()}
    warm_starts = [s for x in runs["denv_warm"] for s in x.get("starts", [])]
    return {
        "envs": n,
        "ready": ready,
        "runs": runs,
        "warm_share": warm_starts.count("warm") / len(warm_starts) if warm_starts else None,
        "ratios": {
            "local_over_denv_warm_median": ratio(
                ready["local"].get("median"), ready["denv_warm"].get("median")
            ),
            "denv_cold_over_denv_warm_median": ratio(
                ready["denv_cold"].get("median"), ready["denv_warm"].get("median")
            ),
        },
        "target": "local / denv warm >= 10x",
    }


# -- async get_env --------------------------------------------------------------------------


async def _gathered(b: Bench, env_id: str, m: int) -> float:
    async with AsyncDenv(b.server.url, b.server.api_key) as denv:
        await denv.get_env(env_id)  # the connection is open before the clock starts
        t0 = time.perf_counter()
        got = await asyncio.gather(*(denv.get_env(env_id) for _ in range(m)))
        elapsed = time.perf_counter() - t0
    assert len(got) == m and {e.id for e in got} == {env_id}
    return elapsed


def _sequential(b: Bench, env_id: str, m: int) -> float:
    with b.denv() as denv:
        denv.get_env(env_id)
        t0 = time.perf_counter()
        for _ in range(m):
            denv.get_env(env_id)
        return time.perf_counter() - t0


def async_get_env(b: Bench) -> dict[str, Any]:
    m, rounds = int(b.profile.trainer_gets), int(b.profile.trainer_get_rounds)
    with b.denv(detach=True) as api:  # the env outlives this client: deleted below
        env = api.create_sandbox(b.image, wait="healthy", wait_timeout_s=READY_TIMEOUT_S)
    b.settle(max_s=60)
    gathered: list[float] = []
    sequential: list[float] = []
    try:
        for r in range(rounds):
            if r % 2:
                gathered.append(asyncio.run(_gathered(b, env.id, m)))
                sequential.append(_sequential(b, env.id, m))
            else:
                sequential.append(_sequential(b, env.id, m))
                gathered.append(asyncio.run(_gathered(b, env.id, m)))
    finally:
        with b.denv() as api:
            api.delete_env(env.id)
    g, s = summarize(gathered), summarize(sequential)
    return {
        "calls": m,
        "async_gather_s": g,
        "sequential_s": s,
        "ratios": {"sequential_over_async_median": ratio(s.get("median"), g.get("median"))},
        "target": "sequential Denv / AsyncDenv gather >= 5x",
    }


# -- diff -----------------------------------------------------------------------------------


def _container(env_id: str) -> str:
    ids = sh("docker", "ps", "-q", "--filter", f"label=denv.env={env_id}").split()
    if not ids:
        raise RuntimeError(f"no running container has label denv.env={env_id}")
    return ids[0]


def _exec(env_id: str, script: str) -> None:
    sh("docker", "exec", _container(env_id), "sh", "-c", script, timeout=900)


def _time_diff(b: Bench, a: str, c: str, reps: int) -> tuple[dict[str, Any], Any]:
    times: list[float] = []
    with b.denv() as api:
        diff = api.diff(a, c)  # warm the connection and the page cache alike for every rep
        for _ in range(reps):
            t0 = time.perf_counter()
            diff = api.diff(a, c)
            times.append(time.perf_counter() - t0)
    return summarize(times), diff


def diff(b: Bench) -> dict[str, Any]:
    files, reps = int(b.profile.diff_files), int(b.profile.diff_reps)
    created: list[str] = []
    versions: list[str] = []
    with b.denv(timeout_s=900) as api:
        try:
            env = api.create_sandbox(b.image, wait="healthy", wait_timeout_s=READY_TIMEOUT_S)
            created.append(env.id)
            t0 = time.perf_counter()
            _exec(
                env.id, f"for i in $(seq {files}); do head -c {MB} /dev/urandom > /work/f$i; done"
            )
            write_s = time.perf_counter() - t0
            fork = api.fork(env.id, 1, wait="healthy", wait_timeout_s=READY_TIMEOUT_S)
            base = fork.version.id
            versions.append(base)
            child = fork.envs[0]
            created.append(child.id)
            change = f"head -c {MB} /dev/urandom > /work/f1 && sync"
            _exec(child.id, change)
            after_fork = api.snapshot(child.id).id
            versions.append(after_fork)
            _exec(env.id, change)
            again = api.snapshot(env.id).id
            versions.append(again)
            sh("sync")
            shared, d1 = _time_diff(b, base, after_fork, reps)
            unshared, d2 = _time_diff(b, base, again, reps)
            found = [[(c.path, str(c.change), c.size) for c in d.changes] for d in (d1, d2)]
        finally:
            for env_id in created:
                api.delete_env(env_id)
            for version_id in reversed(versions):
                try:
                    api.delete_version(version_id)
                except Exception as exc:
                    log.warning("could not delete version %s: %s", version_id, exc)
    expected = [("/work/f1", "modified", MB)]
    return {
        "volume_bytes": files * MB,
        "changed_bytes": MB,
        "write_s": write_s,
        "diff_s": {"fork_child": shared, "same_env": unshared},
        "changes": {"fork_child": found[0], "same_env": found[1]},
        "correct": found[0] == expected and found[1] == expected,
        "target": "Denv.diff <= 50 ms",
        "meets_target": (shared.get("median") or 1) <= 0.05
        and (unshared.get("median") or 1) <= 0.05,
    }


def run(b: Bench) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, fn in (("async_get_env", async_get_env), ("diff", diff), ("warm16", warm16)):
        log.info("-- %s", name)
        try:
            out[name] = fn(b)
        except Exception as exc:
            log.exception("%s failed", name)
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
        b.settle(max_s=120)
    return out
