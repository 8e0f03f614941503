"""The WebSocket half of the ingress proxy (OpenEnv clients speak WebSocket at ``/ws``).

The client's upgrade is accepted only once the env's service has accepted ours, with the
subprotocol it chose; a rejection is relayed with its status and body. Text and binary
frames are pumped both ways; when one side closes, the other is closed with the same code
and reason (codes that cannot be sent on the wire are mapped: an abnormal end of the env's
side becomes 1014 "bad gateway", of the client's side 1001 "going away").

A WebSocket with no message either way and no ping from its client for ``idle_timeout_s``
(``denv serve --ws-idle-timeout``) is closed on both sides with 1001 and a reason naming the
flag, which frees its ingress slot. A client's ping counts (``ingress.pings``: that is what
keepalive pings are for), so a live OpenEnv session, which pings every 20 s, is never cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterable
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.typing import Subprotocol

from denv.server.ingress.pings import LastPing, last_ping
from denv.server.ingress.relay import RelayError, open_socket, split_address
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
    no_relay_key_message,
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


def idle_reason(idle_timeout_s: float) -> str:
    """The close reason of a WebSocket cut for idling (at most 123 bytes on the wire)."""
    return f"idle for {idle_timeout_s:g} s: no message and no ping (denv serve --ws-idle-timeout)"


class _Activity:
    """When a message last passed either way (the event loop's clock), and the client's
    pings as the server saw them (None: a server that does not report them)."""

    def __init__(self, pings: LastPing | None) -> None:
        self.at = asyncio.get_running_loop().time()
        self.pings = pings

    def touch(self) -> None:
        self.at = asyncio.get_running_loop().time()

    def last(self) -> float:
        return max(self.at, self.pings.at) if self.pings is not None else self.at


async def proxy_websocket(
    resolve: Resolve,
    scope: Scope,
    receive: Receive,
    send: Send,
    idle_timeout_s: float = 0.0,
    relay_key: bytes | None = None,
) -> None:
    """Proxy one WebSocket connection to the env that the path's token names; close it
    after ``idle_timeout_s`` without a message or a client's ping (0: never). An env behind
    a node relay is reached through it with ``relay_key`` (``ingress.relay``)."""
    if (await receive())["type"] != "websocket.connect":
        return
    token, path = split_target(scope)
    target = resolve(token)
    if target is None:
        await _reject_error(send, scope, 404, "not_found", NOT_FOUND_MESSAGE)
        return
    address, port = target
    host, relay = split_address(address)
    sock = None
    if relay is not None:
        if relay_key is None:
            await _reject_error(send, scope, 502, "internal", no_relay_key_message(relay))
            return
        try:
            sock = await open_socket(relay_key, relay, host, port)
        except (OSError, TimeoutError) as exc:  # a RelayError is one
            why = str(exc) if isinstance(exc, RelayError) else type(exc).__name__
            log.info("ingress: env's port %d not reachable through its relay (%s)", port, why)
            await _reject_error(send, scope, 502, "internal", upstream_down_message(port))
            return
    upstream = await _open_upstream(scope, send, host, port, path, sock)
    if upstream is None:
        return
    try:
        await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
    except Exception:
        await upstream.close(_GOING_AWAY)
        raise
    await _pump(upstream, receive, send, _Activity(last_ping(scope)), idle_timeout_s)


async def _open_upstream(
    scope: Scope, send: Send, host: str, port: int, path: str, sock: socket.socket | None = None
) -> ClientConnection | None:
    """The WebSocket to the env (over ``sock``, connected through a relay, when given)."""
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
            **({"sock": sock} if sock is not None else {}),  # type: ignore[arg-type]
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
        _close(sock)
        await _reject(send, scope, response.status_code, kept, body)
        return None
    except (OSError, TimeoutError, InvalidHandshake) as exc:
        _close(sock)
        log.warning(
            "ingress: env's port %d at %s not answering WebSocket (%s: %s)",
            port,
            host,
            type(exc).__name__,
            exc,
        )
        await _reject_error(send, scope, 502, "internal", upstream_down_message(port))
        return None
    except BaseException:
        _close(sock)
        raise


def _close(sock: socket.socket | None) -> None:
    if sock is not None:
        sock.close()  # a no-op when the connection's transport closed it already


async def _client_to_upstream(
    receive: Receive, upstream: ClientConnection, activity: _Activity
) -> tuple[int, str]:
    """Forward the client's frames; return its close code and reason when it leaves."""
    while True:
        message = await receive()
        kind = message["type"]
        if kind == "websocket.receive":
            activity.touch()
            text = message.get("text")
            await upstream.send(text if text is not None else message.get("bytes") or b"")
        elif kind == "websocket.disconnect":
            return int(message.get("code", 1000)), str(message.get("reason") or "")


async def _upstream_to_client(upstream: ClientConnection, send: Send, activity: _Activity) -> None:
    """Forward the env's frames until it closes."""
    try:
        async for data in upstream:
            activity.touch()
            if isinstance(data, str):
                await send({"type": "websocket.send", "text": data})
            else:
                await send({"type": "websocket.send", "bytes": data})
    except ConnectionClosed:
        pass


async def _idle(activity: _Activity, idle_timeout_s: float) -> None:
    """Return once nothing has passed for ``idle_timeout_s`` (never when it is 0)."""
    if idle_timeout_s <= 0:
        await asyncio.Event().wait()
    loop = asyncio.get_running_loop()
    while (left := activity.last() + idle_timeout_s - loop.time()) > 0:
        await asyncio.sleep(left)


async def _pump(
    upstream: ClientConnection,
    receive: Receive,
    send: Send,
    activity: _Activity,
    idle_timeout_s: float,
) -> None:
    inbound = asyncio.create_task(_client_to_upstream(receive, upstream, activity))
    outbound = asyncio.create_task(_upstream_to_client(upstream, send, activity))
    idle = asyncio.create_task(_idle(activity, idle_timeout_s))
    client_close: tuple[int, str] | None = None
    idled = False
    try:
        await asyncio.wait({inbound, outbound, idle}, return_when=asyncio.FIRST_COMPLETED)
        if inbound.done() and not inbound.cancelled() and inbound.exception() is None:
            client_close = inbound.result()
        idled = idle.done() and not idle.cancelled() and idle.exception() is None
    finally:
        for task in (inbound, outbound, idle):
            task.cancel()
        results = await asyncio.gather(inbound, outbound, idle, return_exceptions=True)
        _log_unexpected(results)
        if client_close is None and idled:
            await _close_idle(upstream, send, idle_timeout_s)
        elif client_close is not None:
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


async def _close_idle(upstream: ClientConnection, send: Send, idle_timeout_s: float) -> None:
    """Close both sides of an idle WebSocket: 1001, with a reason naming the flag."""
    reason = idle_reason(idle_timeout_s)
    log.info("ingress: closing a WebSocket %s", reason)
    await upstream.close(_GOING_AWAY, reason)
    with contextlib.suppress(OSError, RuntimeError):  # the client may be gone
        await send({"type": "websocket.close", "code": _GOING_AWAY, "reason": reason})


def _log_unexpected(results: Iterable[Any]) -> None:
    for result in results:
        if isinstance(result, BaseException) and not isinstance(
            result, (asyncio.CancelledError, ConnectionClosed, OSError)
        ):
            log.warning("ingress: WebSocket pump failed: %r", result)
