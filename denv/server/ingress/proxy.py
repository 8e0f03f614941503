"""Ingress: the proxy that reaches an egress-deny env's port at ``/ingress/<token>/...``.

An env on a deny network publishes no port; the server reaches it by its container IP on
the env's internal network and forwards HTTP (every method, bodies streamed both ways)
and WebSocket traffic (``websocket``) to it. The token in the path is the capability:
whoever holds the URL reaches the env, and nobody can guess it (192 random bits).

    table = IngressTable()
    mount_ingress(app, table)
    token = new_token()
    table.register(token, "172.30.0.2", 8000)
    # OpenEnv clients use http://127.0.0.1:7711/ingress/<token> as their base URL:
    # GET <base>/health, WebSocket <base>/ws, POST <base>/reset, <base>/mcp ...

Tokens are never stored (an env's token is derived from the server's secret, and the
database keeps only digests: ``denv.server.tokens``), logged or echoed. The route table
(``ingress.routes``) keys its dict by the token's SHA-256 digest, so a lookup's timing
cannot be steered towards a registered token, and a dict hit is an exact match of the
digest: nothing is left to compare. ``mount_ingress`` also redacts ``/ingress/<token>``
from uvicorn's access and WebSocket log lines (``denv.redaction``: a prefix of the digest).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import fastapi
import httpcore
import httpx
from starlette.routing import Route, WebSocketRoute

from denv.server.config import DEFAULT_INGRESS_READ_TIMEOUT_S, DEFAULT_WS_IDLE_TIMEOUT_S
from denv.server.errors import RETRY_AFTER_S
from denv.server.ingress.idle import CLOSE_IDLE_WAIT_S, close_idle_to
from denv.server.ingress.relay import RelayBackend, split_address
from denv.server.ingress.routes import IngressTable
from denv.server.ingress.websocket import proxy_websocket, reject_websocket
from denv.server.ingress.wire import (
    NOT_FOUND_MESSAGE,
    Receive,
    Scope,
    Send,
    error_body,
    forward_headers,
    header,
    install_log_redaction,
    no_relay_key_message,
    response_headers,
    send_error,
    split_target,
    upstream_down_message,
)
from denv.server.lifecycle.fairness import Fairness, throttled
from denv.server.tokens import TOKEN_BYTES  # 192 bits; the contract asks for at least 128

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0
# Every read from the env has a timeout (the server's --ingress-read-timeout, default
# DEFAULT_INGRESS_READ_TIMEOUT_S): generous, since an env's step may legitimately take long
# and MCP keeps SSE streams open, but an env that goes silent mid-response no longer holds
# the connection for ever. A client that leaves cancels the upstream request (_watch_disconnect).
WRITE_TIMEOUT_S = 300.0  # an env that stops reading an upload
KEEPALIVE_EXPIRY_S = 4.0  # below uvicorn's 5 s keep-alive, so pooled connections are live
MAX_KEEPALIVE_CONNECTIONS = 256
BUFFER_BODY_MAX = 1 << 20  # request bodies up to 1 MiB are read whole; larger ones stream
_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})


def new_token() -> str:
    """A fresh ingress token: 192 random bits, URL-safe base64 (32 characters)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


class IngressUpstreamBroke(Exception):
    """The env's service broke the connection after its response had started."""


class _ClientDisconnected(Exception): ...


class IngressProxy:
    """The raw ASGI endpoint behind the ingress routes (HTTP here, WebSocket in websocket.py)."""

    def __init__(
        self,
        table: IngressTable,
        fair: Fairness | None = None,
        read_timeout_s: float = DEFAULT_INGRESS_READ_TIMEOUT_S,
        ws_idle_timeout_s: float = DEFAULT_WS_IDLE_TIMEOUT_S,
        relay_key: bytes | None = None,
    ) -> None:
        self.table = table
        self.relay_key = relay_key  # the cluster's: proves the control plane to node relays
        self.fair = fair  # caps each key's open connections
        self.ws_idle_timeout_s = ws_idle_timeout_s  # 0: none
        self._timeouts = {
            "timeout": {
                "connect": CONNECT_TIMEOUT_S,
                "read": read_timeout_s or None,  # 0: none
                "write": WRITE_TIMEOUT_S,
                "pool": None,
            }
        }
        # Upstream pools of the running event loop: None for envs reached directly, else
        # one per node relay ("host:port"), since two nodes' envs may share addresses.
        self._transports: dict[str | None, httpx.AsyncHTTPTransport] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        table.holds_connections(self.close_idle)

    def transport(self, relay: str | None = None) -> httpx.AsyncHTTPTransport:
        """The pooled upstream transport of the running event loop (to envs behind
        ``relay``, a node relay's "host:port", when given).

        httpx's connection pool without an ``AsyncClient`` around it: a client would keep a
        cookie jar shared by every caller (one client's cookies sent with another's
        requests), and its redirect, auth and hook layers are work the proxy must not do.
        """
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._transports = loop, {}
        found = self._transports.get(relay)
        if found is None:
            limits = httpx.Limits(
                max_connections=None,  # long polls to one env must not starve another
                max_keepalive_connections=MAX_KEEPALIVE_CONNECTIONS,
                keepalive_expiry=KEEPALIVE_EXPIRY_S,
            )
            # trust_env=False: never send a container IP through a configured proxy
            found = httpx.AsyncHTTPTransport(limits=limits, trust_env=False)
            if relay is not None:
                assert self.relay_key is not None
                # httpx takes no network backend: its pool is replaced by the same pool
                # over one that opens each connection through the node's relay.
                found._pool = httpcore.AsyncConnectionPool(
                    max_connections=limits.max_connections,
                    max_keepalive_connections=limits.max_keepalive_connections,
                    keepalive_expiry=limits.keepalive_expiry,
                    network_backend=RelayBackend(self.relay_key, relay),
                )
            self._transports[relay] = found
        return found

    def close_idle(self, host: str) -> None:
        """From another thread: close the idle pooled connections to ``host`` (envs reached
        directly), waiting up to ``CLOSE_IDLE_WAIT_S``."""
        loop, transport = self._loop, self._transports.get(None)
        if loop is None or transport is None or loop.is_closed():
            return
        done = asyncio.run_coroutine_threadsafe(close_idle_to(transport, host), loop)
        with contextlib.suppress(Exception):
            done.result(CLOSE_IDLE_WAIT_S + 1.0)

    async def aclose(self) -> None:
        """Close the pooled upstream connections."""
        transports, self._transports = self._transports, {}
        for transport in transports.values():
            await transport.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return
        owner = self.table.owner(split_target(scope)[0])
        if self.fair is not None and owner and not self.fair.try_acquire(owner, "ingress"):
            await _refuse_busy(scope, receive, send, self.fair.in_use(owner, "ingress"))
            return
        try:
            if scope["type"] == "websocket":
                await proxy_websocket(
                    self.table.resolve,
                    scope,
                    receive,
                    send,
                    self.ws_idle_timeout_s,
                    self.relay_key,
                )
            else:
                await self._http(scope, receive, send)
        finally:
            if self.fair is not None and owner:
                self.fair.release(owner, "ingress")

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        token, path = split_target(scope)
        target = self.table.resolve(token)
        if target is None:
            await send_error(send, scope, 404, "not_found", NOT_FOUND_MESSAGE)
            return
        task = asyncio.current_task()
        assert task is not None
        disconnected = asyncio.Event()
        watchers: list[asyncio.Task[None]] = []

        def body_read() -> None:
            # From now on receive() only reports a disconnect: watch for it and cancel.
            watchers.append(asyncio.create_task(_watch_disconnect(receive, task, disconnected)))

        try:
            await self._forward(scope, receive, send, target, path, body_read)
        except asyncio.CancelledError:
            if not disconnected.is_set():
                raise
            task.uncancel()  # the client went away: nothing is left to answer
        except _ClientDisconnected:
            pass
        finally:
            for watcher in watchers:
                watcher.cancel()

    async def _forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        target: tuple[str, int],
        path: str,
        body_read: Callable[[], None],
    ) -> None:
        address, port = target
        host, relay = split_address(address)
        if relay is not None and self.relay_key is None:
            body_read()
            await send_error(send, scope, 502, "internal", no_relay_key_message(relay))
            return
        headers = forward_headers(scope, host, port, websocket=False)
        content: bytes | AsyncIterator[bytes] | None
        length = header(scope["headers"], b"content-length")
        if length is not None and length.isdigit() and int(length) <= BUFFER_BODY_MAX:
            content = await _read_body(receive)
            body_read()
        elif length is not None or header(scope["headers"], b"transfer-encoding") is not None:
            content = _stream_body(receive, body_read)
        else:
            content = None
            body_read()
        query = scope.get("query_string", b"")
        url = f"http://{host}:{port}{path}" + (f"?{query.decode('latin-1')}" if query else "")
        response = await self._open(scope, send, url, headers, content, port, relay)
        if response is None:
            return
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": response_headers(response.headers.raw, scope, host, port),
                }
            )
            try:
                async for chunk in response.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except httpx.ReadTimeout:
                raise IngressUpstreamBroke(
                    f"the env's service on port {port} sent nothing for "
                    f"{self._timeouts['timeout']['read']} s mid-response (the server's "
                    "--ingress-read-timeout)"
                ) from None
            except httpx.TransportError as exc:
                # Too late for a 502: abort, so the client sees a broken response, not a short one.
                raise IngressUpstreamBroke(
                    f"the env's service on port {port} broke the connection mid-response "
                    f"({type(exc).__name__})"
                ) from None
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()

    async def _open(
        self,
        scope: Scope,
        send: Send,
        url: str,
        headers: list[tuple[bytes, bytes]],
        content: bytes | AsyncIterator[bytes] | None,
        port: int,
        relay: str | None = None,
    ) -> httpx.Response | None:
        """Send the request upstream; on failure answer 502 and return None."""
        transport = self.transport(relay)
        method = str(scope["method"])
        # A pooled connection that the env's server closed just as it was reused fails with
        # RemoteProtocolError before any response: retry once when that cannot repeat work.
        retries = 1 if method in _IDEMPOTENT and not isinstance(content, AsyncIterator) else 0
        while True:
            request = httpx.Request(
                method, url, headers=headers, content=content, extensions=self._timeouts
            )
            try:
                return await transport.handle_async_request(request)
            except httpx.RemoteProtocolError as exc:
                if retries > 0:
                    retries -= 1
                    continue
                failure: Exception = exc
            except httpx.TransportError as exc:
                failure = exc
            except _ClientDisconnected:
                raise
            log.info("ingress: env's port %d not answering (%s)", port, failure)
            await send_error(send, scope, 502, "internal", upstream_down_message(port))
            return None


async def _refuse_busy(scope: Scope, receive: Receive, send: Send, held: int) -> None:
    """429 with Retry-After: the env's key holds as many ingress connections as it may."""
    err = throttled("ingress", held, held)
    headers, body = error_body(scope, err.code, err.message)
    headers.append((b"retry-after", str(RETRY_AFTER_S).encode()))
    if scope["type"] == "websocket":
        if (await receive())["type"] == "websocket.connect":
            await reject_websocket(send, scope, 429, headers, body)
        return
    await send({"type": "http.response.start", "status": 429, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientDisconnected
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _stream_body(receive: Receive, body_read: Callable[[], None]) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientDisconnected
        body = message.get("body", b"")
        if body:
            yield body
        if not message.get("more_body", False):
            body_read()
            return


async def _watch_disconnect(
    receive: Receive, task: asyncio.Task[Any], disconnected: asyncio.Event
) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            disconnected.set()
            task.cancel()
            return


def mount_ingress(
    app: fastapi.FastAPI,
    table: IngressTable,
    fair: Fairness | None = None,
    read_timeout_s: float = DEFAULT_INGRESS_READ_TIMEOUT_S,
    ws_idle_timeout_s: float = DEFAULT_WS_IDLE_TIMEOUT_S,
    relay_key: bytes | None = None,
) -> None:
    """Add the ingress routes to ``app``: HTTP (every method) and WebSocket; with
    ``relay_key`` (a cluster's), envs behind node relays too (``ingress.relay``).

    Routes ``/ingress/{token}`` and ``/ingress/{token}/{path:path}`` are raw ASGI endpoints
    (no body parsing, no dependency injection), placed first in the router and left out of
    the OpenAPI schema. The pooled upstream connections close with the app's lifespan. An auth
    middleware must let ``/ingress/`` through: the token is the credential.
    """
    proxy = IngressProxy(table, fair, read_timeout_s, ws_idle_timeout_s, relay_key)
    app.router.routes[0:0] = [
        Route("/ingress/{token}", proxy, include_in_schema=False),
        Route("/ingress/{token}/{path:path}", proxy, include_in_schema=False),
        WebSocketRoute("/ingress/{token}", proxy),
        WebSocketRoute("/ingress/{token}/{path:path}", proxy),
    ]
    app.state.denv_ingress = proxy
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[Any]:
        async with inner(a) as state:
            try:
                yield state
            finally:
                await proxy.aclose()

    app.router.lifespan_context = lifespan
    install_log_redaction()
