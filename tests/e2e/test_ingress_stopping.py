"""A WebSocket open through ingress when the server stops: closed with 1012 and a reason.

uvicorn alone closes each open WebSocket with 1012 and no reason when its server stops; a
client then cannot tell a stopping server from a broken one. ``ingress.pings`` gives the
close its reason. The test runs its own server (it stops it), with the real OpenEnv echo
env behind an egress-deny env, and a real WebSocket client on the env's ingress URL.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from conftest import docker_engine, start_server, stop
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from denv.server.ingress.pings import STOP_CODE, STOP_REASON

pytestmark = pytest.mark.e2e

IMAGE = "denv-echo-env:latest"


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
