"""Per-step latency over the WebSocket: a published port (egress allow) against the ingress proxy.

Issue 8 item 4. Two envs of the same image run side by side: one with `egress="allow"`
(the client connects to a port published on 127.0.0.1) and one with `egress="deny"` (the
client connects through the denv server's ingress proxy). One OpenEnv client on each steps
in alternating blocks, so both see the same machine; every `step()` is timed on its own,
after a warm-up that is not counted.

Run: ``python -m bench --only latency`` (``make bench`` runs every benchmark;
``--quick`` and ``--smoke`` are smaller profiles: bench/__main__.py).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from openenv.core import GenericEnvClient

from .bench_start import READY_TIMEOUT_S
from .harness import Bench, parallel, summarize

log = logging.getLogger("bench.latency")

BLOCK = 20
WARMUP = 50


def _open(b: Bench, egress: str) -> tuple[Any, Any, str]:
    provider = b.provider(egress=egress, timeout_s=READY_TIMEOUT_S)
    try:
        url = provider.start_container(b.image)
        provider.wait_for_ready(url)
        with b.denv() as api:
            env = api.get_env(provider.env_id)
        via = next(str(e.via) for e in env.endpoints if e.service == env.agent_service)
    except BaseException:
        provider.stop_container()
        raise
    client = GenericEnvClient(base_url=url, provider=provider).sync()
    return client, provider, via


def run(b: Bench) -> dict[str, dict[str, Any]]:
    steps = int(b.profile.latency_steps)
    opened = parallel([lambda: _open(b, "allow"), lambda: _open(b, "deny")])
    clients = {"direct": opened[0][0], "ingress": opened[1][0]}
    via = {"direct": opened[0][2], "ingress": opened[1][2]}
    times: dict[str, list[float]] = {"direct": [], "ingress": []}
    try:
        b.settle()
        for client in clients.values():
            client.reset()
            for i in range(WARMUP):
                client.step({"message": f"warm-up {i}"})
        order = ["direct", "ingress"]
        while len(times["ingress"]) < steps:
            for name in order:
                client, out = clients[name], times[name]
                for _ in range(min(BLOCK, steps - len(out))):
                    t0 = time.perf_counter()
                    client.step({"message": f"step {len(out)}"})
                    out.append(time.perf_counter() - t0)
            order.reverse()
    finally:
        for client in clients.values():
            client.close()
    stats = {name: summarize(values) for name, values in times.items()}
    diff = {q: stats["ingress"][q] - stats["direct"][q] for q in ("median", "p90", "p99", "mean")}
    return {
        "latency": {
            "params": {
                "steps_each": steps,
                "warmup_steps": WARMUP,
                "block": BLOCK,
                "client": "openenv GenericEnvClient (sync), step({'message': ...})",
                "via": via,
            },
            "step": stats,
            "ingress_minus_direct_s": diff,
            "samples_ms": {
                name: [round(v * 1000, 3) for v in values] for name, values in times.items()
            },
            "notes": [],
        }
    }
