"""What the ingress proxy adds to a round trip: direct vs through ``/ingress/<token>``.

    .venv/bin/python bench/ingress_latency.py [--n 3000]

Starts, on loopback, an upstream (OpenEnv ``create_app`` with a minimal echo env, plus a
WebSocket ``/echo``) and a proxy (FastAPI + ``mount_ingress``), each a uvicorn process, then
times the same requests direct and proxied, alternating batches of 100 so that load from
elsewhere on the machine hits both sides alike. Reports medians; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from contextlib import ExitStack

UPSTREAM = textwrap.dedent(
    """
    import sys, fastapi, uvicorn
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State

    class EchoAction(Action):
        message: str

    class EchoObservation(Observation):
        echoed: str = ""

    class EchoEnv(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True
        def __init__(self):
            super().__init__()
            self._state = State(episode_id="e", step_count=0)
        def reset(self, seed=None, episode_id=None, **kw):
            return EchoObservation(echoed="")
        def step(self, action, timeout_s=None, **kw):
            self._state.step_count += 1
            return EchoObservation(echoed=action.message, reward=1.0)
        @property
        def state(self):
            return self._state

    app = create_app(EchoEnv, EchoAction, EchoObservation, env_name="echo", max_concurrent_envs=4)

    @app.websocket("/echo")
    async def echo(ws: fastapi.WebSocket) -> None:
        await ws.accept()
        try:
            while True:
                await ws.send_text(await ws.receive_text())
        except fastapi.WebSocketDisconnect:
            pass

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
    """
)

PROXY = textwrap.dedent(
    """
    import sys, fastapi, uvicorn
    from denv.server.ingress.proxy import mount_ingress
    from denv.server.ingress.routes import IngressTable
    app = fastapi.FastAPI()
    table = IngressTable()
    mount_ingress(app, table)
    table.register(sys.argv[3], "127.0.0.1", int(sys.argv[2]))
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
                access_log=False)
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server on port {port} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port} after {timeout_s:g} s")


def alternate(
    n: int, direct: Callable[[], Callable[[], None]], proxied: Callable[[], Callable[[], None]]
) -> tuple[float, float]:
    """Median seconds of one call, direct and proxied, in alternating batches of 100."""
    steps = {"direct": direct(), "proxied": proxied()}
    times: dict[str, list[float]] = {"direct": [], "proxied": []}
    for step in steps.values():
        for _ in range(100):  # warm up
            step()
    while len(times["proxied"]) < n:
        for side, step in steps.items():
            for _ in range(100):
                start = time.perf_counter()
                step()
                times[side].append(time.perf_counter() - start)
    return statistics.median(times["direct"]), statistics.median(times["proxied"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=3000, help="round trips per side and kind")
    args = parser.parse_args()

    import httpx
    from openenv.core.generic_client import GenericEnvClient
    from websockets.sync.client import connect

    up_port, proxy_port, token = free_port(), free_port(), secrets.token_urlsafe(24)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    upstream = subprocess.Popen([sys.executable, "-c", UPSTREAM, str(up_port)], env=env)
    proxy = subprocess.Popen(
        [sys.executable, "-c", PROXY, str(proxy_port), str(up_port), token], env=env
    )
    try:
        wait_listening(up_port, upstream)
        wait_listening(proxy_port, proxy)
        direct = f"http://127.0.0.1:{up_port}"
        proxied = f"http://127.0.0.1:{proxy_port}/ingress/{token}"

        def ws_echo(base: str) -> Callable[[], Callable[[], None]]:
            def make() -> Callable[[], None]:
                url = base.replace("http", "ws", 1) + "/echo"
                ws = stack.enter_context(connect(url, compression=None))

                def step() -> None:
                    ws.send("x" * 64)
                    ws.recv()

                return step

            return make

        def openenv_step(base: str) -> Callable[[], Callable[[], None]]:
            def make() -> Callable[[], None]:
                client = stack.enter_context(GenericEnvClient(base_url=base).sync())
                client.reset()
                return lambda: client.step({"message": "hello"}) and None

            return make

        def http_get(base: str) -> Callable[[], Callable[[], None]]:
            def make() -> Callable[[], None]:
                client = stack.enter_context(httpx.Client(trust_env=False))

                def step() -> None:
                    client.get(base + "/health").raise_for_status()

                return step

            return make

        kinds = [
            ("WebSocket echo (64 B)", ws_echo),
            ("OpenEnv step over WebSocket", openenv_step),
            ("HTTP GET /health", http_get),
        ]
        print(f"{args.n} round trips per side, median; load average {os.getloadavg()[0]:.1f}")
        for name, kind in kinds:
            with ExitStack() as stack:
                d, p = alternate(args.n, kind(direct), kind(proxied))
                print(
                    f"{name:30s} direct {d * 1e6:7.0f} us   via ingress {p * 1e6:7.0f} us"
                    f"   added {(p - d) * 1e6:6.0f} us"
                )
    finally:
        for proc in (proxy, upstream):
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
