"""Fork against replay: N ready branches at step K, by fork or by N fresh envs replaying K steps.

Issue 8 item 2. One root env per start mode steps its episode up to each K in turn; at
each K, for each N, the same run times

- fork (cold): `fork_clients(root, N)`: one snapshot, N children booted, all ready;
- fork (warm): the same from a root whose server keeps N booted spares (`DenvProvider(warm=N)`),
  only when the server starts children warm;
- replay: N fresh envs started in parallel (`DenvProvider`, cold), each `reset()` and K
  steps through the OpenEnv client, all done;

alternating which goes first, and checks that every branch reports step_count == K.

Run: ``python -m bench --only fork`` (``make bench`` runs every benchmark;
``--quick`` and ``--smoke`` are smaller profiles: bench/__main__.py).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from openenv.core import GenericEnvClient

from .bench_start import READY_TIMEOUT_S, Root, fork_once
from .harness import Bench, parallel, ratio, summarize

log = logging.getLogger("bench.fork")


def _replay_one(b: Bench, k: int) -> int:
    provider = b.provider(timeout_s=READY_TIMEOUT_S)
    try:
        url = provider.start_container(b.image, env_vars={"DENV_BENCH_ROOT": "replay"})
        provider.wait_for_ready(url)
        client: Any = GenericEnvClient(base_url=url, provider=provider).sync()
    except BaseException:
        provider.stop_container()
        raise
    try:
        client.reset()
        for i in range(k):
            client.step({"message": f"prefix {i}"})
        return int(client.state().get("step_count", -1))
    finally:
        client.close()


def replay_once(b: Bench, k: int, n: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    counts = parallel([lambda: _replay_one(b, k) for _ in range(n)])
    # The state check above ran inside the timing (a client would not skip it either); it
    # is one message per branch.
    return {"ready_s": time.perf_counter() - t0, "state_ok": all(c == k for c in counts)}


def run(b: Bench) -> dict[str, dict[str, Any]]:
    p = b.profile
    ks: list[int] = sorted(p.fork_ks)
    ns: list[int] = list(p.fork_ns)
    notes: list[str] = []
    rows: list[dict[str, Any]] = []
    cold = Root(b, warm=0, tag="cold", steps=0)
    warm: Root | None = None
    if p.fork_warm:
        warm = Root(b, warm=max(ns), tag="warm", steps=0)
        b.settle(max_s=120)
    warm_available = warm is not None
    try:
        turn = 0
        for k in ks:
            for root in (cold, warm):
                if root is not None:
                    root.step_to(k)
            for n in ns:
                for rep in range(p.fork_reps):
                    plan = ["fork_cold", "replay"] + (["fork_warm"] if warm_available else [])
                    shift = turn % len(plan)
                    turn += 1
                    for method in plan[shift:] + plan[:shift]:
                        row: dict[str, Any] = {"k": k, "n": n, "rep": rep, "method": method}
                        try:
                            if method == "replay":
                                row.update(replay_once(b, k, n))
                            else:
                                root = cold if method == "fork_cold" else warm
                                assert root is not None
                                row.update(fork_once(b, root, n))
                        except Exception as exc:
                            log.warning("%s K=%d N=%d failed: %s", method, k, n, exc)
                            row["error"] = f"{type(exc).__name__}: {exc}"
                        b.settle(max_s=120)
                        if method == "fork_warm" and "warm" not in row.get("starts", []):
                            warm_available = False
                            notes.append(
                                "warm: not available (the server started every child cold)"
                            )
                            continue
                        rows.append(row)
                log.info("fork vs replay: K=%d N=%d done", k, n)
    finally:
        for root in (cold, warm):
            if root is not None:
                root.close()
    if not p.fork_warm:
        notes.append("warm: not measured in this profile")
    return {"fork": _result(rows, ks, ns, notes, p.fork_reps)}


def _result(
    rows: list[dict[str, Any]], ks: list[int], ns: list[int], notes: list[str], reps: int
) -> dict[str, Any]:
    table: list[dict[str, Any]] = []
    for k in ks:
        for n in ns:
            cell: dict[str, Any] = {"k": k, "n": n}
            for method in ("fork_cold", "fork_warm", "replay"):
                times = [
                    r["ready_s"]
                    for r in rows
                    if r["k"] == k and r["n"] == n and r["method"] == method and "error" not in r
                ]
                cell[method] = summarize(times)
            rep = cell["replay"].get("median")
            cell["replay_over_fork_cold"] = ratio(rep, cell["fork_cold"].get("median"))
            cell["replay_over_fork_warm"] = ratio(rep, cell["fork_warm"].get("median"))
            table.append(cell)
    return {
        "params": {
            "ks": ks,
            "ns": ns,
            "reps": reps,
            "replay": "N fresh cold envs in parallel, reset + K steps each",
        },
        "table": table,
        "runs": rows,
        "notes": notes,
    }
