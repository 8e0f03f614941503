"""No ingress token and no API key in the server's logs: server.log and its console.

The logging is the real ``denv serve`` set-up (``setup_logging``: server.log and stderr at
DEBUG) and the server is uvicorn with ``denv serve``'s ``log_config=None``, plus its access
log switched on, in front of the ingress proxy (``mount_ingress``, the server's error
handlers) and a real upstream with HTTP and WebSocket routes (tests/server/test_ingress.py).
Requests carry the token in their path and the API key in ``Authorization``, ``X-API-Key``
and a query parameter; one makes the proxy fail unexpectedly, so the server's error log
and a traceback hold the request's path; a WebSocket of the host form
(``<label>.localhost``, ``HostIngress``) puts the token's label in its DEBUG-logged ``Host``
header. Then the file and the console are read: neither holds the token, its label or the
key, and the token's redacted form (``/ingress/sha256:<8 hex>``) is there on uvicorn's
access and WebSocket lines and on the error's line (``sha256:<8 hex>.localhost`` in the
host form's header).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastapi
import httpx
import pytest
import uvicorn
from test_ingress import UpstreamState, upstream_app
from websockets.sync.client import connect as ws_connect

from denv.ingress_host import host_label
from denv.redaction import RedactSecrets, redact
from denv.server.errors import install_error_handlers
from denv.server.ingress.hosts import HostIngress
from denv.server.ingress.proxy import mount_ingress, new_token
from denv.server.ingress.routes import IngressTable
from denv.server.serve_cli import setup_logging

KEY = "dak_" + secrets.token_urlsafe(32)
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")


def shown(token: str) -> str:
    return f"/ingress/sha256:{hashlib.sha256(token.encode()).hexdigest()[:8]}"


class ServeThread:
    """uvicorn as ``denv serve`` runs it (no log config of its own: a config would set
    uvicorn's loggers up again), access log on."""

    def __init__(self, app: Any) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        config = uvicorn.Config(app, log_config=None, access_log=True, lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> ServeThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "no uvicorn"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


@pytest.fixture
def fresh_logging() -> Iterator[None]:
    """Logging as in a fresh process: uvicorn's loggers with no handlers of their own (other
    tests' uvicorn servers configured them); the root logger's handlers back afterwards."""
    root = logging.getLogger()
    saved_root = (root.handlers[:], root.level)
    saved = {n: logging.getLogger(n) for n in UVICORN_LOGGERS}
    kept = {n: (lg.handlers[:], lg.level, lg.propagate) for n, lg in saved.items()}
    for lg in saved.values():
        lg.handlers, lg.level, lg.propagate = [], logging.NOTSET, True
    try:
        yield
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers, root.level = saved_root
        for n, lg in saved.items():
            lg.handlers, lg.level, lg.propagate = kept[n]


@pytest.mark.usefixtures("fresh_logging")
def test_no_token_and_no_key_reach_server_log_or_console(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    setup_logging(tmp_path, "DEBUG")  # here: the console handler writes to this phase's capsys
    table = IngressTable()
    front = fastapi.FastAPI()
    install_error_handlers(front)
    mount_ingress(front, table)
    front.add_middleware(HostIngress, proxy=front.state.denv_ingress, bases={"localhost"})
    token, unknown, broken = new_token(), new_token(), new_token()
    label = host_label(token)
    assert label is not None
    credentials = {"Authorization": f"Bearer {KEY}", "X-API-Key": KEY}
    with ServeThread(upstream_app(UpstreamState())) as upstream, ServeThread(front) as srv:
        table.register(token, "127.0.0.1", upstream.port)
        table.register(broken, "bad\x00host", upstream.port)  # an error the proxy never expects
        base = f"127.0.0.1:{srv.port}/ingress"
        with httpx.Client(trust_env=False, timeout=30, headers=credentials) as http:
            health = http.get(f"http://{base}/{token}/health", params={"api_key": KEY})
            assert health.status_code == 200 and health.json() == {"status": "healthy"}
            echo = http.post(f"http://{base}/{token}/echo/x?token={KEY}", content=b"hi")
            assert echo.json()["raw_path"] == "/echo/x"  # what the client gets is unchanged
            assert echo.json()["query"] == f"token={KEY}"
            assert http.get(f"http://{base}/{unknown}/health").status_code == 404
            assert http.get(f"http://{base}/{broken}/health").status_code == 500
        with ws_connect(f"ws://{base}/{token}/ws?id=1", additional_headers=credentials) as ws:
            ws.send("hello")
            assert ws.recv() == "hello"
        hosted = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        with ws_connect(f"ws://{label}.localhost:{srv.port}/ws", sock=hosted) as ws:
            ws.send("host form")
            assert ws.recv() == "host form"
    for handler in logging.getLogger().handlers:
        handler.flush()
    log_text = (tmp_path / "server.log").read_text()
    console = capsys.readouterr().err
    for where, text in (("server.log", log_text), ("console", console)):
        assert '"GET ' + shown(token) + "/health?api_key=***" in text, where  # access log
        assert f'"WebSocket {shown(token)}/ws?id=1" [accepted]' in text, where
        assert f"unexpected error in GET {shown(broken)}/health" in text, where
        assert "Traceback" in text, where
        assert shown(unknown) in text, where
        assert "authorization: ***" in text.lower(), where  # the handshake, at DEBUG
        assert f"Host: {shown(token).removeprefix('/ingress/')}.localhost" in text, where
        leaked = [s for s in (token, label, unknown, broken, KEY, KEY[4:]) if s in text]
        assert not leaked, (where, [line for line in text.splitlines() if "ingress" in line])


def test_redact_is_idempotent_and_keeps_what_is_no_secret() -> None:
    token = new_token()
    line = f'127.0.0.1:5 - "GET /ingress/{token}/ws?token=abc&step=2 HTTP/1.1" 200'
    once = redact(line)
    assert once == f'127.0.0.1:5 - "GET {shown(token)}/ws?token=***&step=2 HTTP/1.1" 200'
    assert redact(once) == once
    assert redact(f"< Authorization: Bearer {KEY}") == "< Authorization: ***"
    assert redact(f"key {KEY} given") == "key dak_*** given"
    label = host_label(token)
    hosted = f"< Host: {label}.localhost:7711"
    assert redact(hosted) == f"< Host: {shown(token).removeprefix('/ingress/')}.localhost:7711"
    assert redact(redact(hosted)) == redact(hosted)
    assert redact("a.b.example.com, denv.server.ingress.proxy") == (
        "a.b.example.com, denv.server.ingress.proxy"
    )
    assert redact("--max-envs-per-key 64; /v1/envs?limit=5") == (
        "--max-envs-per-key 64; /v1/envs?limit=5"
    )


def test_a_token_split_over_arguments_or_in_an_object_is_redacted() -> None:
    token = new_token()
    split = logging.LogRecord("x", logging.INFO, __file__, 1, "%s/%s", ("/ingress", token), None)
    as_url = logging.LogRecord(
        "x", logging.INFO, __file__, 1, "at %s", (httpx.URL(f"http://h/ingress/{token}/a"),), None
    )
    for record in (split, as_url):
        assert RedactSecrets().filter(record)
        assert token not in record.getMessage() and shown(token) in record.getMessage()
