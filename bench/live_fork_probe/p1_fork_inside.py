"""Probe 1: os.fork() of the booted echo server inside its own (unprivileged) container.

    .venv/bin/python bench/live_fork_probe/p1_fork_inside.py   (as root: reads /proc)

Measures, on one container run as denv runs envs (--cap-drop ALL, no-new-privileges, default
seccomp): fork(8) to 8 children answering /health on their own ports, with and without
gc.freeze(); the parent's fork() call per child; each child's private memory after a
reset + step of its own; the hang a child meets without forgetting the parent's idle worker
threads; sustained forks per second; the wait the quiescent point adds under load.
Writes p1_fork_inside.json beside this file.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from common import (
    call,
    ctl,
    host_pid,
    kill,
    median,
    pct,
    private_kb,
    start_server,
    stop_server,
    wait_http,
    write_result,
)

ROUNDS = 10


def fork_n(srv: dict[str, Any], ports: list[int], **opts: Any) -> dict[str, Any]:
    """One fork request; returns its reply, the time until every child answers /health,
    and the children's host pids."""
    t0 = time.perf_counter()
    reply = ctl(srv, {"op": "fork", "ports": ports, **opts})
    t_reply = time.perf_counter() - t0
    with ThreadPoolExecutor(len(ports)) as pool:
        list(pool.map(lambda p: wait_http(srv["ip"], p, "/health", 10), ports))
    t_ready = time.perf_counter() - t0
    pids = [host_pid(srv["pid"], c["pid"]) for c in reply["children"]]
    return {"reply": reply, "reply_s": t_reply, "ready_s": t_ready, "pids": pids}


def use(ip: str, port: int, tag: str) -> None:
    call(ip, port, "/reset", {})
    for i in range(3):
        call(ip, port, "/step", {"action": {"message": f"{tag} {i}"}})


def fork8_rounds(srv: dict[str, Any], freeze: bool) -> dict[str, Any]:
    ready, fork_ms, priv, seen_ok = [], [], [], True
    for r in range(ROUNDS):
        ports = [9001 + i for i in range(8)]
        res = fork_n(srv, ports, freeze=freeze, reset_pools=True)
        ready.append(res["ready_s"] * 1e3)
        fork_ms += [c["fork_ms"] for c in res["reply"]["children"]]
        parent_seen = call(srv["ip"], 8000, "/_probe/state")[1]["seen"]
        for port in ports:
            state = call(srv["ip"], port, "/_probe/state")[1]
            seen_ok &= state["seen"] in (parent_seen - 1, parent_seen, parent_seen + 1)
        if r == ROUNDS - 1:  # memory after each child did a reset and 3 steps of its own
            for port in ports:
                use(srv["ip"], port, f"child {port}")
            time.sleep(0.2)
            priv = [private_kb(p) for p in res["pids"]]
        kill(res["pids"])
        time.sleep(0.3)
    return {
        "fork8_ready_ms": {"median": median(ready), "p90": pct(ready, 0.9), "all": ready},
        "fork_call_ms": {"median": median(fork_ms), "p90": pct(fork_ms, 0.9)},
        "child_private_kb": priv,
        "child_private_mb_median": median([p["Private"] for p in priv]) / 1024,
        "children_carry_parent_memory": seen_ok,
    }


def hang_without_reset(srv: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for reset in (False, True):
        res = fork_n(srv, [9101], reset_pools=reset)
        t0 = time.perf_counter()
        try:
            status = call(srv["ip"], 9101, "/step", {"action": {"message": "x"}}, timeout=3)[0]
            out[f"reset_pools={reset}"] = (
                f"step answered {status} in {time.perf_counter() - t0:.3f} s"
            )
        except TimeoutError:
            out[f"reset_pools={reset}"] = "step hung (no answer in 3 s)"
        kill(res["pids"])
        time.sleep(0.3)
    return out


def throughput(srv: dict[str, Any], total: int = 100, batch: int = 10) -> dict[str, Any]:
    pids: list[int] = []
    t0 = time.perf_counter()
    for b in range(total // batch):
        ports = [10000 + b * batch + i for i in range(batch)]
        pids += fork_n(srv, ports, freeze=True, reset_pools=True)["pids"]
    dt = time.perf_counter() - t0
    priv = [private_kb(p)["Private"] for p in pids]
    kill(pids)
    time.sleep(1)
    return {
        "children": total,
        "batch": batch,
        "seconds_to_all_ready": dt,
        "children_per_s": total / dt,
        "idle_child_private_mb_median": median(priv) / 1024,
    }


def quiescence_under_load(srv: dict[str, Any], clients: int = 4) -> dict[str, Any]:
    stop = threading.Event()
    steps = [0]

    def load() -> None:
        import http.client

        conn = http.client.HTTPConnection(srv["ip"], 8000, timeout=5)
        body = '{"action": {"message": "load"}}'
        while not stop.is_set():
            conn.request("POST", "/step", body, {"content-type": "application/json"})
            conn.getresponse().read()
            steps[0] += 1

    out: dict[str, Any] = {}
    for gate in (True, False):
        stop.clear()
        threads = [threading.Thread(target=load) for _ in range(clients)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        waits, fails = [], 0
        for _ in range(20):
            try:
                reply = ctl(srv, {"op": "fork", "ports": [9201], "gate": gate, "reset_pools": True})
                waits.append(reply["wait_ms"])
                time.sleep(0.05)
                kill([host_pid(srv["pid"], reply["children"][0]["pid"])])
            except (TimeoutError, OSError):
                fails += 1
            time.sleep(0.1)
        stop.set()
        for t in threads:
            t.join()
        out[f"gate={gate}"] = {
            "wait_ms_median": median(waits) if waits else None,
            "wait_ms_max": max(waits) if waits else None,
            "forks": len(waits),
            "timeouts": fails,
        }
    out["steps_served_during_probe"] = steps[0]
    out["clients"] = clients
    return out


def main() -> None:
    srv = start_server("p1")
    try:
        use(srv["ip"], 8000, "parent")  # the parent has booted, reset and stepped
        parent = private_kb(srv["pid"])
        result: dict[str, Any] = {
            "command": ".venv/bin/python bench/live_fork_probe/p1_fork_inside.py",
            "parent_kb": parent,
            "parent_threads": ctl(srv, {"op": "info"})["threads"],
        }
        result["no_freeze"] = fork8_rounds(srv, freeze=False)
        result["freeze"] = fork8_rounds(srv, freeze=True)
        result["thread_pools_after_fork"] = hang_without_reset(srv)
        result["throughput"] = throughput(srv)
        result["quiescence"] = quiescence_under_load(srv)
        for key in ("no_freeze", "freeze"):
            r = result[key]
            print(
                f"{key}: fork(8) ready median {r['fork8_ready_ms']['median']:.1f} ms "
                f"p90 {r['fork8_ready_ms']['p90']:.1f} ms; fork() call median "
                f"{r['fork_call_ms']['median']:.2f} ms; child private median "
                f"{r['child_private_mb_median']:.1f} MB; carries parent memory "
                f"{r['children_carry_parent_memory']}"
            )
        print("thread pools:", result["thread_pools_after_fork"])
        print("throughput:", result["throughput"])
        print("quiescence:", result["quiescence"])
        write_result("p1_fork_inside", result)
    finally:
        stop_server(srv)


if __name__ == "__main__":
    main()
