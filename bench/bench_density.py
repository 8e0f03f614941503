"""Density: how many idle echo envs this machine holds, and what one costs in memory.

Issue 8 item 5. Envs are created (egress deny, healthy) in batches of as many as there are
cores, until the first of:

- the cap of the profile (booting an env is CPU work; the cap keeps a run in its time budget),
- the memory bound: (MemAvailable at the start - reserve) / (memory of the first env x 1.5),
  with reserve = max(2 GiB, 20% of MemTotal), recomputed as the run goes,
- MemAvailable falling under the reserve, or an env failing to become healthy.

Once the last batch is up and the machine has settled, it records each env's memory from
its container's cgroup (usage as `docker stats` shows it, and anonymous RSS), the host's
MemAvailable drop per env, and whether every env still answers /health through ingress.

Run: ``python -m bench --only density`` (``make bench`` runs every benchmark;
``--quick`` and ``--smoke`` are smaller profiles: bench/__main__.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any

import httpx

from .harness import Bench, parallel, summarize
from .measure import container_memory, meminfo, sh

log = logging.getLogger("bench.density")

GIB = 1024**3
HEADROOM = 1.5


def _reserve() -> int:
    return max(2 * GIB, int(meminfo()["MemTotal"] * 0.2))


def _env_memory(env_ids: list[str]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for env_id in env_ids:
        cids = sh("docker", "ps", "-q", "--no-trunc", "--filter", f"label=denv.env={env_id}")
        for cid in cids.split():
            mem = container_memory(cid)
            if mem is not None:
                out[env_id] = mem
    return out


def run(b: Bench) -> dict[str, dict[str, Any]]:
    cap = int(b.profile.density_cap)
    batch = max(1, os.cpu_count() or 1)
    reserve = _reserve()
    avail0 = meminfo()["MemAvailable"]
    env_ids: list[str] = []
    urls: list[str] = []
    growth: list[dict[str, Any]] = [{"envs": 0, "mem_available_bytes": avail0, "t_s": 0.0}]
    bound, stop_reason = cap, f"cap ({cap})"
    t0 = time.perf_counter()
    with b.denv() as api:

        def create() -> Any:
            return api.create_sandbox(b.image, ports=[8000], wait="healthy", wait_timeout_s=300)

        try:
            while len(env_ids) < bound:
                n = min(batch, bound - len(env_ids))
                try:
                    envs = parallel([create for _ in range(n)])
                except Exception as exc:
                    stop_reason = f"an env failed to start: {type(exc).__name__}: {exc}"
                    log.warning("density: %s", stop_reason)
                    break
                for env in envs:
                    env_ids.append(env.id)
                    urls.append(next(str(e.url) for e in env.endpoints).rstrip("/"))
                avail = meminfo()["MemAvailable"]
                growth.append(
                    {
                        "envs": len(env_ids),
                        "mem_available_bytes": avail,
                        "t_s": time.perf_counter() - t0,
                    }
                )
                if len(env_ids) == n:  # the first batch sets the memory bound
                    first = _env_memory(env_ids[:1]).get(env_ids[0], {}).get("usage", 0)
                    per_env = max(first, 32 * 1024**2) * HEADROOM
                    by_memory = int((avail0 - reserve) / per_env)
                    if by_memory < cap:
                        bound, stop_reason = by_memory, f"memory bound ({by_memory})"
                if avail < reserve:
                    stop_reason = "MemAvailable fell under the reserve"
                    break
                log.info("density: %d envs up", len(env_ids))
            boot_s = time.perf_counter() - t0
            settle_s = b.settle(max_s=120)
            mem = _env_memory(env_ids)
            avail1 = meminfo()["MemAvailable"]
            answered = _health(urls)
        finally:
            t1 = time.perf_counter()
            for start in range(0, len(env_ids), 8):
                ids = env_ids[start : start + 8]
                parallel([lambda i=i: api.delete_env(i) for i in ids])  # type: ignore[misc]
            delete_s = time.perf_counter() - t1
    count = len(env_ids)
    usage = [m["usage"] for m in mem.values()]
    rss = [m["rss"] for m in mem.values()]
    return {
        "density": {
            "params": {
                "cap": cap,
                "batch": batch,
                "reserve_bytes": reserve,
                "headroom": HEADROOM,
                "egress": "deny",
            },
            "envs": count,
            "stopped_because": stop_reason,
            "healthy_at_end": answered,
            "memory_per_env_bytes": {
                "cgroup_usage": summarize(usage),
                "cgroup_rss": summarize(rss),
                "host_available_drop": (avail0 - avail1) / count if count else None,
            },
            "mem_available_bytes": {"before": avail0, "after": avail1},
            "estimated_capacity_by_memory": (
                int((avail0 - reserve) / (sum(usage) / len(usage))) if usage else None
            ),
            "boot_all_s": boot_s,
            "settle_s": settle_s,
            "delete_all_s": delete_s,
            "growth": growth,
            "notes": [],
        }
    }


def _health(urls: list[str]) -> int:
    """How many of the envs answer 200 on /health through their endpoint."""
    ok = 0
    with httpx.Client(trust_env=False, timeout=10.0) as http:
        for url in urls:
            with contextlib.suppress(httpx.TransportError):
                ok += http.get(url + "/health").status_code == 200
    return ok
