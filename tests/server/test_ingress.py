"""The ingress proxy in front of a real upstream, both served by uvicorn on loopback.

Nothing is mocked: the upstream is a FastAPI app with HTTP and WebSocket routes, the proxy
is ``mount_ingress`` on its own FastAPI app, and the clients are httpx, websockets and a
real OpenEnv client.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import fastapi
import httpx
import pytest
import uvicorn
from fastapi.responses import JSONResponse, Response, StreamingResponse
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as ws_connect

from denv.server.ingress.pings import PingAwareProtocol
from denv.server.ingress.proxy import mount_ingress, new_token
from denv.server.ingress.routes import IngressTable
from denv.server.ingress.websocket import idle_reason
from denv.server.ingress.wire import REDACT

# ---------------------------------------------------------------------------- servers


class ServerThread:
    """A uvicorn server on 127.0.0.1:<free port>, in a thread of this process."""

    def __init__(self, app: Any, ws: Any = "auto") -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False, ws=ws)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


@dataclass
class UpstreamState:
    gate: threading.Event = field(default_factory=threading.Event)
    cancelled: threading.Event = field(default_factory=threading.Event)
    closes: dict[str, tuple[int, str]] = field(default_factory=dict)


def upstream_app(state: UpstreamState) -> fastapi.FastAPI:
    app = fastapi.FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "healthy"}

    @app.api_route(
        "/echo/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]
    )
    async def echo(request: fastapi.Request) -> Response:
        body = b""
        async for chunk in request.stream():
            body += chunk
        headers: dict[str, list[str]] = {}
        for k, v in request.headers.items():
            headers.setdefault(k, []).append(v)
        payload = {
            "method": request.method,
            "raw_path": request.scope["raw_path"].decode(),
            "query": request.scope["query_string"].decode(),
            "headers": headers,
            "body_len": len(body),
            "body_sha256": hashlib.sha256(body).hexdigest(),
            "body": body.decode("latin-1") if len(body) < 1024 else None,
        }
        response = JSONResponse(payload)
        response.headers.append("set-cookie", "a=1")
        response.headers.append("set-cookie", "b=2")
        return response

    @app.get("/download")
    async def download(size: int) -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            sent = 0
            while sent < size:
                n = min(65536, size - sent)
                yield bytes([sent % 251]) * n
                sent += n

        return StreamingResponse(chunks(), media_type="application/octet-stream")

    @app.get("/gate")
    async def gate() -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"first\n"
            await asyncio.to_thread(state.gate.wait, 30)
            yield b"second\n"

        return StreamingResponse(chunks())

    @app.get("/forever")
    async def forever() -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            try:
                yield b"tick\n"
                while True:
                    await asyncio.sleep(0.05)
                    yield b"tick\n"
            finally:
                state.cancelled.set()

        return StreamingResponse(chunks())

    @app.get("/redirect")
    async def redirect(request: fastapi.Request, absolute: bool = False) -> Response:
        host = request.headers["host"]
        location = f"http://{host}/health" if absolute else "/health"
        return Response(status_code=302, headers={"location": location})

    @app.websocket("/ws")
    async def ws(websocket: fastapi.WebSocket) -> None:
        offered = websocket.scope.get("subprotocols") or []
        await websocket.accept(subprotocol=offered[0] if offered else None)
        key = websocket.query_params.get("id", "")
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    state.closes[key] = (message.get("code", 0), message.get("reason") or "")
                    return
                text = message.get("text")
                if text is not None and text.startswith("close:"):
                    _, code, reason = text.split(":", 2)
                    await websocket.close(int(code), reason)
                    return
                if text is not None:
                    await websocket.send_text(text)
                else:
                    await websocket.send_bytes(message["bytes"])
        except fastapi.WebSocketDisconnect as exc:
            state.closes[key] = (exc.code, exc.reason or "")

    return app


@dataclass
class Rig:
    table: IngressTable
    proxy_port: int
    upstream_port: int
    state: UpstreamState
    token: str

    def base(self, token: str | None = None) -> str:
        return f"http://127.0.0.1:{self.proxy_port}/ingress/{token or self.token}"

    def ws_base(self, token: str | None = None) -> str:
        return f"ws://127.0.0.1:{self.proxy_port}/ingress/{token or self.token}"


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    state = UpstreamState()
    table = IngressTable()
    proxy = fastapi.FastAPI()
    mount_ingress(proxy, table)
    with ServerThread(upstream_app(state)) as upstream, ServerThread(proxy) as front:
        token = new_token()
        table.register(token, "127.0.0.1", upstream.port)
        yield Rig(table, front.port, upstream.port, state, token)


@pytest.fixture
def http(rig: Rig) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=rig.base(), timeout=30, trust_env=False) as client:
        yield client


def wait_for(predicate: Any, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def assert_error(response: httpx.Response, status: int, code: str, token: str) -> None:
    assert response.status_code == status
    body = response.json()
    assert body["code"] == code
    assert body["request_id"].startswith("req_") and len(body["request_id"]) == 30
    assert body["message"]
    assert token not in response.text


# ---------------------------------------------------------------------------- table


def test_table_register_resolve_unregister() -> None:
    table = IngressTable()
    token = new_token()
    assert len(token) >= 32
    assert table.resolve(token) is None
    table.register(token, "10.0.0.2", 8000)
    assert table.resolve(token) == ("10.0.0.2", 8000)
    assert table.resolve(token[:-1]) is None
    assert table.resolve(token + "x") is None
    table.unregister(token)
    table.unregister(token)  # idempotent
    assert table.resolve(token) is None
    with pytest.raises(ValueError, match="new_token"):
        table.register("short", "10.0.0.2", 8000)
    with pytest.raises(ValueError, match="new_token"):
        table.register("a/b" * 12, "10.0.0.2", 8000)
    with pytest.raises(ValueError, match="port"):
        table.register(new_token(), "10.0.0.2", 0)


# ---------------------------------------------------------------------------- HTTP


def test_health_through_base_url_with_and_without_trailing_slash(rig: Rig) -> None:
    with httpx.Client(trust_env=False) as client:
        for url in (rig.base() + "/health", rig.base() + "//health"):
            response = client.get(url)
            assert response.status_code == 200, url
            assert response.json() == {"status": "healthy"}


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
def test_methods_path_and_query_are_forwarded(http: httpx.Client, method: str) -> None:
    response = http.request(method, "/echo/a%2Fb/c", params={"x": "1", "y": " z&"})
    assert response.status_code == 200
    body = response.json()
    assert body["method"] == method
    assert body["raw_path"] == "/echo/a%2Fb/c"
    assert body["query"] == "x=1&y=+z%26"


def test_head_has_headers_and_no_body(http: httpx.Client) -> None:
    response = http.head("/echo/x")
    assert response.status_code == 200
    assert response.content == b""
    assert int(response.headers["content-length"]) > 0


def test_headers_hop_by_hop_host_and_api_key(rig: Rig, http: httpx.Client) -> None:
    response = http.get(
        "/echo/h",
        headers={
            "X-Custom": "kept",
            "Connection": "keep-alive, X-Drop-Me",
            "X-Drop-Me": "gone",
            "Keep-Alive": "timeout=5",
            "Authorization": "Bearer dak_secret",
            "Cookie": "session=1",
        },
    )
    headers = response.json()["headers"]
    assert headers["x-custom"] == ["kept"]
    assert "x-drop-me" not in headers
    assert "keep-alive" not in headers
    assert "authorization" not in headers  # a denv API key never reaches the env
    assert headers["cookie"] == ["session=1"]
    assert headers["host"] == [f"127.0.0.1:{rig.upstream_port}"]
    assert headers["x-forwarded-host"] == [f"127.0.0.1:{rig.proxy_port}"]
    assert headers["x-forwarded-for"] == ["127.0.0.1"]
    assert headers["x-forwarded-proto"] == ["http"]
    other = http.get("/echo/h", headers={"Authorization": "Bearer env-own-token"})
    assert other.json()["headers"]["authorization"] == ["Bearer env-own-token"]
    assert response.headers.get_list("set-cookie") == ["a=1", "b=2"]


def test_cookies_set_for_one_client_never_reach_another(rig: Rig) -> None:
    # /echo answers with Set-Cookie: a pooled client with a cookie jar would replay it.
    with httpx.Client(base_url=rig.base(), trust_env=False) as first:
        assert first.get("/echo/c1").headers.get_list("set-cookie") == ["a=1", "b=2"]
    second = httpx.get(rig.base() + "/echo/c2", trust_env=False)
    assert "cookie" not in second.json()["headers"]


def test_request_bodies_buffered_and_streamed(http: httpx.Client) -> None:
    small = b"hello \x00 world"
    body = http.post("/echo/b", content=small).json()
    assert (body["body_len"], body["body"]) == (len(small), small.decode("latin-1"))

    sized = bytes(range(256)) * (3 * 4096)  # 3 MiB with a Content-Length: streamed
    body = http.put("/echo/b", content=sized).json()
    assert body["body_sha256"] == hashlib.sha256(sized).hexdigest()
    assert body["headers"]["content-length"] == [str(len(sized))]

    parts = [bytes([i]) * 100_000 for i in range(80)]  # 8 MB, chunked
    body = http.post("/echo/b", content=iter(parts)).json()
    assert body["body_sha256"] == hashlib.sha256(b"".join(parts)).hexdigest()
    assert "transfer-encoding" in body["headers"]


def test_large_response_streams_intact(http: httpx.Client) -> None:
    size = 8 * 1024 * 1024 + 17
    digest = hashlib.sha256()
    received = 0
    with http.stream("GET", "/download", params={"size": size}) as response:
        for chunk in response.iter_raw():
            digest.update(chunk)
            received += len(chunk)
    expected = hashlib.sha256()
    sent = 0
    while sent < size:
        n = min(65536, size - sent)
        expected.update(bytes([sent % 251]) * n)
        sent += n
    assert received == size
    assert digest.hexdigest() == expected.hexdigest()


def test_response_is_streamed_not_buffered(rig: Rig, http: httpx.Client) -> None:
    rig.state.gate.clear()
    with http.stream("GET", "/gate") as response:
        lines = response.iter_lines()
        # The upstream holds its second chunk until we open the gate: reading the first
        # proves the proxy forwards chunks as they come.
        assert next(lines) == "first"
        rig.state.gate.set()
        assert next(lines) == "second"


def test_client_disconnect_cancels_upstream_stream(rig: Rig, http: httpx.Client) -> None:
    rig.state.cancelled.clear()
    with http.stream("GET", "/forever") as response:
        assert next(response.iter_lines()) == "tick"
    wait_for(rig.state.cancelled.is_set, "the upstream stream to be cancelled")


def test_redirects_point_back_through_ingress(rig: Rig, http: httpx.Client) -> None:
    prefix = f"/ingress/{rig.token}"
    for absolute in (False, True):
        response = http.get("/redirect", params={"absolute": absolute})
        assert response.status_code == 302
        assert response.headers["location"] == f"{prefix}/health"


def test_unknown_token_is_404_error_without_the_token(rig: Rig) -> None:
    unknown = new_token()
    with httpx.Client(trust_env=False) as client:
        for method in ("GET", "POST", "DELETE"):
            response = client.request(method, rig.base(unknown) + "/health", content=b"x")
            assert_error(response, 404, "not_found", unknown)
        assert_error(client.get(rig.base(unknown)), 404, "not_found", unknown)
    with pytest.raises(InvalidStatus) as info:
        ws_connect(rig.ws_base(unknown) + "/ws", open_timeout=10).close()
    assert info.value.response.status_code == 404
    assert b'"not_found"' in (info.value.response.body or b"")


def test_upstream_down_is_502_error(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    token = new_token()
    rig.table.register(token, "127.0.0.1", free_port())
    caplog.set_level(logging.DEBUG)
    try:
        with httpx.Client(trust_env=False) as client:
            response = client.post(rig.base(token) + "/reset", json={})
        assert_error(response, 502, "internal", token)
        assert "not answering" in response.json()["message"]
        with pytest.raises(InvalidStatus) as info:
            ws_connect(rig.ws_base(token) + "/ws", open_timeout=10).close()
        assert info.value.response.status_code == 502
    finally:
        rig.table.unregister(token)
    # The client libraries (httpx, websockets) log their own URL; the server side must not.
    server_side = [r for r in caplog.records if r.name.startswith(("denv", "uvicorn"))]
    assert server_side, "expected the proxy to log the failure"
    assert not [r for r in server_side if token in r.getMessage()]


def test_log_redaction_of_uvicorn_lines() -> None:
    token = new_token()
    access = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5", "GET", f"/ingress/{token}/health?x=1", "1.1", 200),
        None,
    )
    ws = logging.LogRecord(
        "uvicorn.error",
        logging.INFO,
        __file__,
        1,
        '%s - "WebSocket %s" [accepted]',
        ("127.0.0.1:5", f"/ingress/{token}/ws"),
        None,
    )
    shown = f"/ingress/sha256:{hashlib.sha256(token.encode()).hexdigest()[:8]}/"
    for record, n_args in ((access, 5), (ws, 2)):
        assert REDACT.filter(record)
        assert token not in record.getMessage()
        assert shown in record.getMessage()
        # uvicorn's own formatters unpack the arguments: they keep their number
        assert isinstance(record.args, tuple) and len(record.args) == n_args


# ---------------------------------------------------------------------------- WebSocket


def test_websocket_text_and_binary_echo_with_subprotocol(rig: Rig) -> None:
    with ws_connect(rig.ws_base() + "/ws", subprotocols=["denv.v1", "other"]) as ws:  # type: ignore[list-item]
        assert ws.subprotocol == "denv.v1"
        ws.send("hello")
        assert ws.recv() == "hello"
        blob = bytes(range(256)) * 4000
        ws.send(blob)
        assert ws.recv() == blob
        ws.send("")
        assert ws.recv() == ""


def test_websocket_upstream_close_code_reaches_client(rig: Rig) -> None:
    with ws_connect(rig.ws_base() + "/ws") as ws:
        ws.send("close:4001:upstream-bye")
        with pytest.raises(ConnectionClosed) as info:
            ws.recv()
    assert info.value.rcvd is not None
    assert (info.value.rcvd.code, info.value.rcvd.reason) == (4001, "upstream-bye")


def test_websocket_client_close_code_reaches_upstream(rig: Rig) -> None:
    key = new_token()
    with ws_connect(rig.ws_base() + f"/ws?id={key}") as ws:
        ws.send("ping")
        assert ws.recv() == "ping"
        ws.close(4002, "client-bye")
    wait_for(lambda: key in rig.state.closes, "the upstream to see the close")
    assert rig.state.closes[key] == (4002, "client-bye")


def test_an_idle_websocket_is_closed_on_both_sides_and_pings_keep_one_open() -> None:
    # The proxy as denv serve runs it (the ping-aware protocol), with a short idle timeout.
    idle_s = 0.6
    state, table = UpstreamState(), IngressTable()
    proxy = fastapi.FastAPI()
    mount_ingress(proxy, table, ws_idle_timeout_s=idle_s)
    with (
        ServerThread(upstream_app(state)) as upstream,
        ServerThread(proxy, ws=PingAwareProtocol) as front,
    ):
        token, key = new_token(), new_token()
        table.register(token, "127.0.0.1", upstream.port)
        url = f"ws://127.0.0.1:{front.port}/ingress/{token}/ws"
        with (
            ws_connect(f"{url}?id={key}", ping_interval=None) as idle,
            pytest.raises(ConnectionClosed) as info,
        ):
            idle.recv(timeout=10)
        assert info.value.rcvd is not None
        expected = (1001, idle_reason(idle_s))
        assert (info.value.rcvd.code, info.value.rcvd.reason) == expected
        wait_for(lambda: key in state.closes, "the env's side to be closed")
        assert state.closes[key] == expected
        # pings alone keep a socket open past the timeout; a message after that goes through
        with ws_connect(url, ping_interval=idle_s / 4) as pinging:
            time.sleep(idle_s * 2.5)
            pinging.send("still here")
            assert pinging.recv(timeout=10) == "still here"


def test_concurrent_clients_get_their_own_answers(rig: Rig) -> None:
    def http_client(i: int) -> int:
        with httpx.Client(base_url=rig.base(), trust_env=False, timeout=30) as client:
            for j in range(20):
                payload = f"http-{i}-{j}-{new_token()}"
                assert client.post("/echo/c", content=payload).json()["body"] == payload
        return 20

    def ws_client(i: int) -> int:
        with ws_connect(rig.ws_base() + "/ws") as ws:
            for j in range(50):
                payload = f"ws-{i}-{j}-{new_token()}"
                ws.send(payload)
                assert ws.recv() == payload
        return 50

    with ThreadPoolExecutor(32) as pool:
        futures = [pool.submit(http_client, i) for i in range(16)]
        futures += [pool.submit(ws_client, i) for i in range(16)]
        checked = sum(f.result() for f in futures)
    print(f"ingress concurrency: {checked} unique payloads from 32 clients, 0 crossed")


# ---------------------------------------------------------------------------- OpenEnv


def test_openenv_client_through_ingress() -> None:
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State
    from openenv.core.generic_client import GenericEnvClient

    class EchoAction(Action):  # type: ignore[misc]
        message: str

    class EchoObservation(Observation):  # type: ignore[misc]
        echoed: str = ""

    class EchoEnv(Environment[EchoAction, EchoObservation, State]):  # type: ignore[misc]
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self._state = State(episode_id="e0", step_count=0)

        def reset(
            self, seed: int | None = None, episode_id: str | None = None, **kw: Any
        ) -> EchoObservation:
            self._state = State(episode_id=episode_id or "e1", step_count=0)
            return EchoObservation(echoed="", done=False, reward=0.0)

        def step(
            self, action: EchoAction, timeout_s: float | None = None, **kw: Any
        ) -> EchoObservation:
            self._state.step_count += 1
            return EchoObservation(echoed=action.message, reward=float(len(action.message)))

        @property
        def state(self) -> State:
            return self._state

    env_app = create_app(
        EchoEnv, EchoAction, EchoObservation, env_name="echo", max_concurrent_envs=4
    )
    table = IngressTable()
    proxy = fastapi.FastAPI()
    mount_ingress(proxy, table)
    with ServerThread(env_app) as env_server, ServerThread(proxy) as front:
        token = new_token()
        table.register(token, "127.0.0.1", env_server.port)
        base = f"http://127.0.0.1:{front.port}/ingress/{token}"
        with httpx.Client(trust_env=False) as http:
            assert http.get(base + "/health").status_code == 200
        with GenericEnvClient(base_url=base + "/").sync() as env:
            reset = env.reset()
            assert reset.observation["echoed"] == ""
            for i in range(5):
                result = env.step({"message": f"m{i}"})
                assert result.observation["echoed"] == f"m{i}"
                assert result.reward == float(len(f"m{i}"))
            assert env.state()["step_count"] == 5
