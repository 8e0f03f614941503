"""The WebSocket half of the ingress proxy (OpenEnv clients speak WebSocket at ``/ws``).

The client's upgrade is accepted only once the env's service has accepted ours, with the
subprotocol it chose; a rejection is relayed with its status and body. Text and binary
frames are pumped both ways; when one side closes, the other is closed with the same code
and reason (codes that cannot be sent on the wire are mapped: an abnormal end of the env's
side becomes 1014 "bad gateway", of the client's side 1001 "going away").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.typing import Subprotocol

from denv.server.ingress.wire import (
    NOT_FOUND_MESSAGE,
    Headers,
    Receive,
    Resolve,
    Scope,
    Send,
    error_body,
    forward_headers,
    header,
    split_target,
    upstream_down_message,
)

log = logging.getLogger(__name__)

OPEN_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 5.0
MAX_MESSAGE_BYTES = 64 << 20  # a message from the env above this closes the socket (1009)

_NO_STATUS = 1005
_ABNORMAL = 1006
_GOING_AWAY = 1001
_BAD_GATEWAY = 1014


def _sendable(code: int | None, fallback: int) -> int:
    """A close code that may be put in a close frame (RFC 6455 7.4)."""
    if code is None or code == _NO_STATUS:
        return 1000
    if code == _ABNORMAL:
        return fallback
    if (1000 <= code <= 1014 and code not in (1004, 1005, 1006)) or 3000 <= code <= 4999:
        return code
    return fallback


async def _reject(send: Send, scope: Scope, status: int, headers: Headers, body: bytes) -> None:
    """Refuse the client's upgrade with an HTTP answer, when the server can send one."""
    if "websocket.http.response" in scope.get("extensions", {}):
        await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008})


reject_websocket = _reject  # for the proxy's own refusals (ingress: too many connections)


async def _reject_error(send: Send, scope: Scope, status: int, code: str, message: str) -> None:
    headers, body = error_body(scope, code, message)
    await _reject(send, scope, status, headers, body)


async def proxy_websocket(resolve: Resolve, scope: Scope, receive: Receive, send: Send) -> None:
    """Proxy one WebSocket connection to the env that the path's token names."""
    if (await receive())["type"] != "websocket.connect":
        return
    token, path = split_target(scope)
    target = resolve(token)
    if target is None:
        await _reject_error(send, scope, 404, "not_found", NOT_FOUND_MESSAGE)
        return
    host, port = target
    upstream = await _open_upstream(scope, send, host, port, path)
    if upstream is None:
        return
    try:
        await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
    except Exception:
        await upstream.close(_GOING_AWAY)
        raise
    await _pump(upstream, receive, send)


async def _open_upstream(
    scope: Scope, send: Send, host: str, port: int, path: str
) -> ClientConnection | None:
    query = scope.get("query_string", b"")
    uri = f"ws://{host}:{port}{path}" + (f"?{query.decode('latin-1')}" if query else "")
    headers = [
        (k.decode("latin-1"), v.decode("latin-1"))
        for k, v in forward_headers(scope, host, port, websocket=True)
    ]
    agent = header(scope["headers"], b"user-agent")
    offered = [Subprotocol(s) for s in scope.get("subprotocols", [])]
    try:
        return await connect(
            uri,
            subprotocols=offered or None,
            additional_headers=headers,
            user_agent_header=agent.decode("latin-1") if agent else None,
            compression=None,  # loopback/bridge hop: deflate would only cost CPU
            proxy=None,
            open_timeout=OPEN_TIMEOUT_S,
            close_timeout=CLOSE_TIMEOUT_S,
            ping_interval=None,  # the client's pings are answered by the server side
            max_size=MAX_MESSAGE_BYTES,
        )
    except InvalidStatus as exc:
        # The env's service refused the upgrade: the client sees its status and body.
        response = exc.response
        kept = [
            (k.lower().encode("latin-1"), v.encode("latin-1"))
            for k, v in response.headers.raw_items()
            if k.lower() in ("content-type", "retry-after", "www-authenticate")
        ]
        body = bytes(response.body or b"")
        kept.append((b"content-length", str(len(body)).encode()))
        await _reject(send, scope, response.status_code, kept, body)
        return None
    except (OSError, TimeoutError, InvalidHandshake) as exc:
        log.info("ingress: env's port %d not answering WebSocket (%s)", port, type(exc).__name__)
        await _reject_error(send, scope, 502, "internal", upstream_down_message(port))
        return None


async def _client_to_upstream(receive: Receive, upstream: ClientConnection) -> tuple[int, str]:
    """Forward the client's frames; return its close code and reason when it leaves."""
    while True:
        message = await receive()
        kind = message["type"]
        if kind == "websocket.receive":
            text = message.get("text")
            await upstream.send(text if text is not None else message.get("bytes") or b"")
        elif kind == "websocket.disconnect":
            return int(message.get("code", 1000)), str(message.get("reason") or "")


async def _upstream_to_client(upstream: ClientConnection, send: Send) -> None:
    """Forward the env's frames until it closes."""
    try:
        async for data in upstream:
            if isinstance(data, str):
                await send({"type": "websocket.send", "text": data})
            else:
                await send({"type": "websocket.send", "bytes": data})
    except ConnectionClosed:
        pass


async def _pump(upstream: ClientConnection, receive: Receive, send: Send) -> None:
    inbound = asyncio.create_task(_client_to_upstream(receive, upstream))
    outbound = asyncio.create_task(_upstream_to_client(upstream, send))
    client_close: tuple[int, str] | None = None
    try:
        await asyncio.wait({inbound, outbound}, return_when=asyncio.FIRST_COMPLETED)
        if inbound.done() and not inbound.cancelled() and inbound.exception() is None:
            client_close = inbound.result()
    finally:
        for task in (inbound, outbound):
            task.cancel()
        results = await asyncio.gather(inbound, outbound, return_exceptions=True)
        _log_unexpected(results)
        if client_close is not None:
            # The client left: close the env's side with the client's code.
            code, reason = client_close
            await upstream.close(_sendable(code, _GOING_AWAY), reason)
        else:
            # The env's side closed (or failed): close the client with its code.
            await upstream.close(_GOING_AWAY)
            code = _sendable(upstream.close_code, _BAD_GATEWAY)
            reason = upstream.close_reason or ""
            with contextlib.suppress(OSError, RuntimeError):  # the client may be gone
                await send({"type": "websocket.close", "code": code, "reason": reason})


def _log_unexpected(results: Iterable[Any]) -> None:
    for result in results:
        if isinstance(result, BaseException) and not isinstance(
            result, (asyncio.CancelledError, ConnectionClosed, OSError)
        ):
            log.warning("ingress: WebSocket pump failed: %r", result)
