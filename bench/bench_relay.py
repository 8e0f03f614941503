"""What a node relay adds to a WebSocket step: ingress to the env directly (the env on the
control plane's machine) against ingress through the relay of the env's node (issue 27).

    .venv/bin/python -m bench.bench_relay [--n 3000] [--out bench/results]
    make bench-relay

Three processes on loopback, as on a cluster: the env (OpenEnv ``create_app`` with an echo
env, and a WebSocket ``/echo``, from ``ingress_latency``), a node relay
(``denv.cluster.relay.Relay``, its own process as in a node agent, with a key made for the
run), and a control plane's ingress (``mount_ingress`` with the relay key) holding two routes
to the same env: one to its address, one to ``<address>@<relay>``. The same client steps
through both in alternating batches of 100, so load from elsewhere hits both alike; each
side keeps one WebSocket (a session pays the relay's handshake once). Loopback has no
latency between machines: what is measured is the relay's own cost (one more TCP hop, a
copy each way in another process).

Medians, p90 and the difference go to ``<out>/relay.json`` and ``<out>/relay.md``, with the
load average before and after. Asserts nothing; stops what it started, also on failure.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from .harness import write_json
from .ingress_latency import UPSTREAM, free_port, wait_listening
from .measure import conditions, machine

RELAY = textwrap.dedent(
    """
    import sys, threading
    from denv.cluster.relay import Relay
    relay = Relay(bytes.fromhex(sys.stdin.readline().strip()), lambda ip: ip == "127.0.0.1")
    relay.start("127.0.0.1", int(sys.argv[1]))
    threading.Event().wait()
    """
)

PROXY = textwrap.dedent(
    """
    import sys, fastapi, uvicorn
    from denv.server.ingress.proxy import mount_ingress
    from denv.server.ingress.relay import relayed
    from denv.server.ingress.routes import IngressTable
    port, up, relay, direct, via = sys.argv[1:6]
    app = fastapi.FastAPI()
    table = IngressTable()
    mount_ingress(app, table, relay_key=bytes.fromhex(sys.stdin.readline().strip()))
    table.register(direct, "127.0.0.1", int(up))
    table.register(via, relayed("127.0.0.1", f"127.0.0.1:{relay}"), int(up))
    uvicorn.run(app, host="127.0.0.1", port=int(port), log_level="warning", access_log=False)
    """
)

SIDES = ("direct", "relay")
START_TIMEOUT_S = 300.0  # importing OpenEnv and uvicorn on a busy 2-core machine


def alternate(n: int, make: dict[str, Callable[[], Callable[[], None]]]) -> dict[str, list[float]]:
    """Seconds of each call per side, in alternating batches of 100 (after 100 to warm up)."""
    steps = {side: make[side]() for side in SIDES}
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    for step in steps.values():
        for _ in range(100):
            step()
    while len(times["relay"]) < n:
        for side in SIDES:
            step = steps[side]
            for _ in range(100):
                start = time.perf_counter()
                step()
                times[side].append(time.perf_counter() - start)
    return times


def summary(times: dict[str, list[float]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for side in SIDES:
        ts = sorted(times[side])
        out[side] = {
            "p50_us": round(statistics.median(ts) * 1e6, 1),
            "p90_us": round(ts[int(len(ts) * 0.9)] * 1e6, 1),
            "n": len(ts),
        }
    out["added_p50_us"] = round(out["relay"]["p50_us"] - out["direct"]["p50_us"], 1)
    return out


def _start(script: str, args: list[str], key: bytes | None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-c", script, *args], env=env, stdin=subprocess.PIPE)
    assert proc.stdin is not None
    if key is not None:
        proc.stdin.write(key.hex().encode() + b"\n")  # never in argv, where ps shows it
    proc.stdin.close()
    return proc


def measure(n: int) -> dict[str, Any]:
    """Each kind of step, ``n`` per side: p50, p90 and the relay's added p50 (see above)."""
    from openenv.core.generic_client import GenericEnvClient
    from websockets.sync.client import connect

    key = secrets.token_bytes(32)
    up, relay, port = free_port(), free_port(), free_port()
    tokens = {side: secrets.token_urlsafe(24) for side in SIDES}
    before = conditions()
    procs: list[subprocess.Popen[bytes]] = []
    results: dict[str, Any] = {}
    try:
        procs.append(_start(UPSTREAM, [str(up)], None))
        procs.append(_start(RELAY, [str(relay)], key))
        proxy_args = [str(port), str(up), str(relay), tokens["direct"], tokens["relay"]]
        procs.append(_start(PROXY, proxy_args, key))
        for p, proc in zip((up, relay, port), procs, strict=True):
            wait_listening(p, proc, START_TIMEOUT_S)
        base = {side: f"http://127.0.0.1:{port}/ingress/{tokens[side]}" for side in SIDES}

        def ws_echo(stack: ExitStack, url: str) -> Callable[[], Callable[[], None]]:
            def make() -> Callable[[], None]:
                ws = stack.enter_context(connect(url.replace("http", "ws", 1) + "/echo"))

                def step() -> None:
                    ws.send("x" * 64)
                    ws.recv()

                return step

            return make

        def openenv_step(stack: ExitStack, url: str) -> Callable[[], Callable[[], None]]:
            def make() -> Callable[[], None]:
                client = stack.enter_context(GenericEnvClient(base_url=url).sync())
                client.reset()
                return lambda: client.step({"message": "hello"}) and None

            return make

        kinds = {"openenv_step": openenv_step, "ws_echo_64B": ws_echo}
        for name, kind in kinds.items():
            with ExitStack() as stack:
                times = alternate(n, {side: kind(stack, base[side]) for side in SIDES})
            results[name] = summary(times)
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return {
        "conditions": {"before": before, "after": conditions()},
        "steps_per_side": n,
        "target_added_p50_us": 1000,
        **results,
    }


def table(result: dict[str, Any]) -> list[str]:
    """The results as Markdown lines: load, then a row per kind of step."""
    before, after = (result["conditions"][k]["loadavg"][0] for k in ("before", "after"))
    lines = [
        f"{result['steps_per_side']} steps per side and kind, alternating batches of 100; "
        f"load average {before:.1f} before, {after:.1f} after.",
        "",
        "| step | direct p50 | relay p50 | added p50 | direct p90 | relay p90 |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name in ("openenv_step", "ws_echo_64B"):
        r = result[name]
        lines.append(
            f"| {name} | {r['direct']['p50_us']:.0f} us | {r['relay']['p50_us']:.0f} us | "
            f"{r['added_p50_us']:+.0f} us (target <= +1000) | {r['direct']['p90_us']:.0f} us | "
            f"{r['relay']['p90_us']:.0f} us |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_relay")
    parser.add_argument("--n", type=int, default=3000, help="steps per side and kind")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    out = {"machine": machine(), **measure(args.n)}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "relay.json", out)
    lines = ["# Ingress through a node relay against direct (issue 27), one run", ""]
    lines += table(out)
    (args.out / "relay.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
