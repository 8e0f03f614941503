"""The API key never shows: not in an error's str or repr, not in repr(Denv), not in any log line.

Every error type is triggered with a known key. For status errors a small real HTTP server on
loopback does the worst a server could: it echoes the caller's Authorization header into the
message, the details and the body. The denv server never does that, which is why a stand-in is
needed to prove the client redacts anyway; it is a real socket, so httpx and httpcore log at
DEBUG as they would in use. Timeout and ConnectionFailed come from real loopback sockets too.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

import pytest
from facade_fakes import ENV_ID, KEY, REQUEST_ID, SERVER, Sleeps

from denv import (
    Conflict,
    ConnectionFailed,
    Denv,
    DenvConfigError,
    DenvError,
    InvalidRequest,
    NotFound,
    RateLimited,
    ServerError,
    Timeout,
    Unauthorized,
)


class _EchoKey(BaseHTTPRequestHandler):
    """Answers every request with the status and code in its path, echoing the key."""

    def _answer(self) -> None:
        _, status, code = unquote(self.path).rsplit("/", 2)
        auth = self.headers["authorization"]
        assert KEY in auth  # the key was really sent, so its absence below means something
        body = {
            "code": code,
            "message": f"rejected {auth}",
            "request_id": REQUEST_ID,
            "details": {"header": auth, auth: "as a key too"},
        }
        data = json.dumps(body).encode()
        self.send_response(int(status))
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("retry-after", "0")
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def echo_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EchoKey)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _assert_no_key(*texts: str) -> None:
    for text in texts:
        assert KEY not in text
        assert KEY[4:] not in text  # not even without its prefix


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)  # every logger: denv, httpx, httpcore
    # Named too: a logger's own level (the CLI quiets httpx/httpcore) would drop records.
    for name in ("httpx", "httpcore"):
        caplog.set_level(logging.DEBUG, logger=name)
    return caplog


@pytest.mark.parametrize(
    ("status", "code", "cls"),
    [
        (401, "unauthorized", Unauthorized),
        (404, "not_found", NotFound),
        (409, "conflict", Conflict),
        (422, "invalid_request", InvalidRequest),
        (429, "rate_limited", RateLimited),
        (503, "engine_unavailable", ServerError),
    ],
)
def test_status_errors_never_show_the_key(
    status: int, code: str, cls: type, echo_server: str, logs: pytest.LogCaptureFixture
) -> None:
    # The generated client's get_env takes the path segment as given: it carries status and code.
    denv = Denv(echo_server, KEY, _sleep=Sleeps())
    with denv, pytest.raises(cls) as info:
        denv.get_env(f"{ENV_ID}/{status}/{code}")
    exc = info.value
    assert "dak_***" in exc.message  # the echo is there, redacted
    _assert_no_key(str(exc), repr(exc), repr(exc.body), repr(exc.details), repr(exc.args))
    _assert_no_key(repr(denv), str(denv), logs.text)
    assert any(r.name.startswith("httpcore") for r in logs.records)  # logging did happen


def test_timeout_never_shows_the_key(silent_server: str, logs: pytest.LogCaptureFixture) -> None:
    with Denv(silent_server, KEY, timeout_s=0.3) as denv, pytest.raises(Timeout) as info:
        denv.get_env(ENV_ID)
    _assert_no_key(str(info.value), repr(info.value), repr(info.value.__cause__), logs.text)


def test_connection_failed_never_shows_the_key(
    closed_port_url: str, logs: pytest.LogCaptureFixture
) -> None:
    denv = Denv(closed_port_url, KEY, max_retries=1, _sleep=Sleeps())
    with denv, pytest.raises(ConnectionFailed) as info:
        denv.health()
    _assert_no_key(str(info.value), repr(info.value), repr(info.value.__cause__), logs.text)
    assert "retry 1 of 1" in logs.text  # the retry was logged, without the key


def test_config_error_never_shows_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("denv.client.local.read_local_server", lambda state_dir=None: None)
    monkeypatch.setenv("DENV_API_KEY", KEY)
    with pytest.raises(DenvConfigError) as info:
        Denv().health()
    _assert_no_key(str(info.value), repr(info.value))


def test_the_generated_client_inside_does_not_show_the_key_either() -> None:
    denv = Denv(SERVER, KEY)
    _assert_no_key(repr(denv), repr(vars(denv)))  # before the first call...
    _assert_no_key(repr(denv), repr(denv._api), repr(vars(denv)))  # ...and after
    # httpx masks the Authorization header in its own reprs.
    _assert_no_key(repr(denv._api.get_httpx_client().headers))
    denv.close()


def test_a_key_in_any_error_message_is_redacted() -> None:
    exc = DenvError(f"bad key {KEY}", code="unauthorized")
    assert str(exc) == "[unauthorized] bad key dak_***"
