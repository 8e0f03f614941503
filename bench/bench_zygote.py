"""Starts from a zygote (issue 24 item 3) side by side with a boot and a warm spare, in one run.

- ``zygote_start``: `provider.start_container(image)`, `wait_for_ready`, a client, and its
  `reset()` answered, for three kinds of start on one server of its own (zygotes on, the
  main run's server has them off so its other parts keep their meaning): a copy of the key's
  zygote (`DenvProvider()`'s default, live auto, once the first start left the zygote), a
  warm spare (`DenvProvider(fork="volume", warm_fork=True)`, spares kept by a holder env
  with `warm=n`, refilled between rounds) and a boot (`fork="volume"` and an env var of its
  own, so no spare or zygote has its configuration). Rounds
  alternate the kinds; each env is deleted outside the timing. Then ``sustained``: zygote
  starts (to `reset()` answered) one after another for S seconds, each env deleted in the
  background: starts per second, the clock stopped once the last delete is done too; then
  the same with 4 clients starting at once (``sustained_parallel``).

Nothing asserts on time; medians and ratios go to bench/results/zygote_start.json.

Run: ``python -m bench --only zygote`` (``make bench`` runs every benchmark;
``--quick`` and ``--smoke`` are smaller profiles: bench/__main__.py).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from denv.openenv import DenvProvider
from openenv.core import GenericEnvClient

from .bench_start import READY_TIMEOUT_S
from .harness import Bench, Server, ratio, remove_leftovers, start_server, stop_process, summarize

log = logging.getLogger("bench.zygote")

ZYGOTE_WAIT_S = 600.0
SUSTAINED_CLIENTS = 4  # threads starting envs at once for `sustained_parallel`


def _provider(server: Server, **options: Any) -> DenvProvider:
    options.setdefault("timeout_s", READY_TIMEOUT_S)
    return DenvProvider(server=server.url, api_key=server.api_key, ttl_s=3600, **options)


def _start_once(
    server: Server, image: str, env_vars: dict[str, str] | None = None, **options: Any
) -> tuple[float, str, DenvProvider]:
    """Seconds from start_container to reset() answered; the env's start; its provider."""
    provider = _provider(server, **options)
    t0 = time.perf_counter()
    url = provider.start_container(image, env_vars=env_vars)
    provider.wait_for_ready(url)
    client: Any = GenericEnvClient(base_url=url, provider=provider).sync()
    client.reset()
    elapsed = time.perf_counter() - t0
    start = str(provider.start)
    client.close()  # deletes the env (outside the timing)
    return elapsed, start, provider


def _zygote_ready(server: Server) -> bool:
    """Whether the server holds a healthy zygote (its store: no client can see one)."""
    with sqlite3.connect(server.state_dir / "denv.db") as con:
        q = "SELECT COUNT(*) FROM envs WHERE owner LIKE 'zygote:%' AND status='healthy'"
        return bool(con.execute(q).fetchone()[0])


def _wait_zygote(server: Server, image: str) -> float:
    """Start once (a boot, which leaves the zygote behind: the first start's time), then
    wait until the zygote serves."""
    first, _, _ = _start_once(server, image)
    deadline = time.monotonic() + ZYGOTE_WAIT_S
    while not _zygote_ready(server):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no zygote served within {ZYGOTE_WAIT_S:.0f} s of the first start")
        time.sleep(0.2)
    return first


def _sustained(server: Server, image: str, seconds: float, clients: int = 1) -> dict[str, Any]:
    """Zygote starts to `reset()` answered for `seconds`, by `clients` threads each starting
    one env after another (each env deleted in the background)."""
    starts: list[str] = []
    lock = threading.Lock()

    def loop(t0: float, stops: ThreadPoolExecutor) -> None:
        while time.perf_counter() - t0 < seconds:
            provider = _provider(server)
            url = provider.start_container(image)
            provider.wait_for_ready(url)
            client: Any = GenericEnvClient(base_url=url, provider=provider).sync()
            client.reset()
            with lock:
                starts.append(str(provider.start))
            stops.submit(client.close)

    with ThreadPoolExecutor(4, thread_name_prefix="bench-zygote-stop") as stops:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(clients, thread_name_prefix="bench-zygote-start") as pool:
            for f in [pool.submit(loop, t0, stops) for _ in range(clients)]:
                f.result()
        started_s = time.perf_counter() - t0
    # The clock runs until the last delete is done too: starts that leave their deletes
    # queued behind them are not a rate the server could keep up.
    elapsed = time.perf_counter() - t0
    return {
        "clients": clients,
        "seconds": round(elapsed, 2),
        "deletes_after_last_start_s": round(elapsed - started_s, 2),
        "starts": len(starts),
        "per_s": round(len(starts) / elapsed, 1),
        "zygote_share": sum(s == "zygote" for s in starts) / max(1, len(starts)),
        "not_copies": dict(Counter(s for s in starts if s != "zygote")),
    }


def _zygote_warnings(state: Path) -> list[str]:
    """What the server said about its zygotes going wrong (a copy that failed, a zygote
    dropped): why a start that should have been a copy booted. Its log goes with its state
    dir, so it is kept in the results."""
    log_file = state / "server.out"
    if not log_file.exists():
        return []
    lines = log_file.read_text(errors="replace").splitlines()
    return [line for line in lines if "zygote:" in line and "WARNING" in line][:20]


def run(b: Bench) -> dict[str, dict[str, Any]]:
    rounds = dict(zip(("zygote", "warm", "boot"), map(int, b.profile.zygote_rounds), strict=True))
    warm_n = 2
    state = Path(f"{b.server.state_dir}-zygote")
    server = start_server(state, ("--zygotes",))
    holder: DenvProvider | None = None
    runs: dict[str, list[float]] = {k: [] for k in rounds}
    starts: dict[str, list[str]] = {k: [] for k in rounds}
    try:
        first_start_s = _wait_zygote(server, b.image)
        holder = _provider(server, fork="volume", warm=warm_n, warm_fork=True)
        holder.wait_for_ready(holder.start_container(b.image))
        holder.wait_warm(timeout_s=600)
        kinds: dict[str, dict[str, Any]] = {
            "zygote": {},
            "warm": {"fork": "volume", "warm_fork": True},
            "boot": {"fork": "volume"},
        }
        for i in range(max(rounds.values())):
            order = list(kinds)[i % 3 :] + list(kinds)[: i % 3]
            for kind in order:
                if len(runs[kind]) >= rounds[kind]:
                    continue
                if kind == "warm":
                    holder.wait_warm(timeout_s=600)
                b.settle(max_s=60)
                # A boot's env var of its own: no pool's spare (nor zygote) has its configuration.
                own = {"DENV_BENCH_BOOT": str(i)} if kind == "boot" else None
                elapsed, start, _ = _start_once(server, b.image, own, **kinds[kind])
                runs[kind].append(elapsed)
                starts[kind].append(start)
        sustained = _sustained(server, b.image, float(b.profile.live_sustained_s))
        b.settle(max_s=60)
        parallel = _sustained(server, b.image, float(b.profile.live_sustained_s), SUSTAINED_CLIENTS)
    finally:
        if holder is not None:
            holder.close()
        stop_process(server.proc)
        said = _zygote_warnings(state)
        remove_leftovers(state)
    ready = {k: summarize(v) for k, v in runs.items()}
    zygote_median = ready["zygote"]["median"]
    zygote_ms = zygote_median * 1e3
    log.info(
        "start to reset(): zygote %.0f ms, warm %.0f ms, boot %.0f ms (medians); "
        "sustained %.1f starts/s (%d clients: %.1f/s)",
        zygote_ms,
        ready["warm"]["median"] * 1e3,
        ready["boot"]["median"] * 1e3,
        sustained["per_s"],
        SUSTAINED_CLIENTS,
        parallel["per_s"],
    )
    for name, part in (("sustained", sustained), ("sustained_parallel", parallel)):
        if part["not_copies"]:
            log.warning(
                "%s: starts that were not copies %s; the server said: %s",
                name,
                part["not_copies"],
                said[:3],
            )
    return {
        "zygote_start": {
            "what": "start_container + wait_for_ready + client + reset() answered, seconds",
            "ready": ready,
            "starts": starts,
            "first_start_s": round(first_start_s, 3),  # the boot that left the zygote behind
            "target_zygote_median_ms": 100,
            "zygote_median_ms": round(zygote_ms, 1),
            "ratios": {
                "boot_over_zygote_median": ratio(ready["boot"]["median"], zygote_median),
                "warm_over_zygote_median": ratio(ready["warm"]["median"], zygote_median),
            },
            "sustained": sustained,  # one client
            "sustained_parallel": parallel,  # SUSTAINED_CLIENTS clients at once
            "target_sustained_per_s": 50,
            "zygote_warnings": said,  # the server's, on copies that failed (then a boot)
            "runs": runs,
        }
    }
