"""A WebSocket open through ingress when the server stops: closed with 1012 and a reason;
one still in its handshake: 503 with the same reason.

uvicorn alone closes each open WebSocket with 1012 and no reason when its server stops; a
client then cannot tell a stopping server from a broken one. ``ingress.pings`` gives the
close its reason. The test runs its own server (it stops it), with the real OpenEnv echo
env behind an egress-deny env, and a real WebSocket client on the env's ingress URL.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest
from conftest import docker_engine, start_server, stop
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from denv.server.ingress.pings import STOP_CODE, STOP_REASON

pytestmark = pytest.mark.e2e

IMAGE = "denv-echo-env:latest"
STANDIN = "denv-http-standin:latest"


def test_a_stopping_server_closes_ingress_websockets_with_a_reason(tmp_path: Path) -> None:
    docker_engine(IMAGE)
    with start_server(tmp_path / "state") as srv:
        headers = {"Authorization": f"Bearer {srv.key}"}
        with httpx.Client(base_url=srv.url, headers=headers, timeout=180, trust_env=False) as c:
            res = c.post("/v1/sandboxes", json={"image": IMAGE, "ports": [8000]})
            assert res.status_code == 201, res.text
            (endpoint,) = res.json()["endpoints"]
        assert endpoint["via"] == "ingress"
        url = str(endpoint["url"]).rstrip("/").replace("http", "ws", 1) + "/ws"
        with connect(url, open_timeout=30) as ws:
            ws.send(json.dumps({"type": "reset", "data": {}}))
            assert json.loads(ws.recv(timeout=30))["type"] != "error"  # a live session
            stop(srv.proc)  # SIGTERM, as `denv stop` and a service manager send
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=30)
        assert closed.value.rcvd is not None, "the connection ended without a close frame"
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (STOP_CODE, STOP_REASON)


# An env whose service answers HTTP but never answers a WebSocket upgrade: a client's
# handshake through ingress then stays in flight (the ingress accepts the client's only once
# the env's service accepted its own), which `GET /seen` reports.
HANGS_ON_UPGRADE = """
import http.server, threading, time
seen = threading.Event()
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.headers.get("Upgrade"):
            seen.set()
            time.sleep(3600)
        body = b"1" if seen.is_set() else b"0"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.ThreadingHTTPServer(("", 8000), Handler).serve_forever()
"""


def test_a_handshake_in_flight_when_the_server_stops_gets_503_with_the_reason(
    tmp_path: Path,
) -> None:
    docker_engine(STANDIN)
    with start_server(tmp_path / "state") as srv:
        headers = {"Authorization": f"Bearer {srv.key}"}
        with httpx.Client(base_url=srv.url, headers=headers, timeout=180, trust_env=False) as c:
            body = {"image": STANDIN, "command": ["python3", "-c", HANGS_ON_UPGRADE]}
            res = c.post("/v1/sandboxes", json={**body, "ports": [8000]})
            assert res.status_code == 201, res.text
            (endpoint,) = res.json()["endpoints"]
        base = str(endpoint["url"]).rstrip("/")
        outcome: list[BaseException | None] = []

        def handshake() -> None:
            try:
                with connect(base.replace("http", "ws", 1) + "/ws", open_timeout=30):
                    outcome.append(None)
            except BaseException as exc:  # what the client saw is the test's finding
                outcome.append(exc)

        client = threading.Thread(target=handshake, daemon=True)
        client.start()
        deadline = time.monotonic() + 8  # well inside the ingress's 10 s to open upstream
        while httpx.get(f"{base}/seen", timeout=5, trust_env=False).text != "1":
            assert time.monotonic() < deadline, "the env's service never saw the upgrade"
            time.sleep(0.1)
        stop(srv.proc)  # SIGTERM with the client's handshake in flight
        client.join(30)
    (seen,) = outcome
    assert isinstance(seen, InvalidStatus), f"the handshake ended with {seen!r}, not a 503"
    assert seen.response.status_code == 503
    assert STOP_REASON in seen.response.body.decode(), seen.response.body
