"""Readiness probes: is an OpenEnv server behind a base URL usable by a client?

An OpenEnv client needs two things from a server: `GET /health` answering 200
and a WebSocket upgrade on `/ws`. The server's own health check proves the
first inside the env's network; these probes prove both along the path the
client takes (the ingress proxy, or a published port), without opening an
OpenEnv session: a session is the client's (an env may allow only one).

Each probe returns `None` when the check passed, or a short reason when it did
not, so a caller can retry and report the last reason.
"""

from __future__ import annotations

import asyncio
import inspect
import ipaddress
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

#: A WebSocket probe: (base URL, timeout in seconds) -> None when ready, else why not.
WebSocketProbe = Callable[[str, float], "str | None"]


def is_loopback(url: str) -> bool:
    """True when `url` points at this machine (so no HTTP proxy should be used)."""
    host = urlsplit(url).hostname
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def websocket_url(base_url: str) -> str:
    """The OpenEnv session endpoint of a base URL: `http(s)://x/y` -> `ws(s)://x/y/ws`."""
    base = base_url.rstrip("/")
    if base.startswith("https://"):
        base = "wss://" + base[len("https://") :]
    elif base.startswith("http://"):
        base = "ws://" + base[len("http://") :]
    return base + "/ws"


def no_websocket(base_url: str, timeout_s: float) -> None:
    """The WebSocket probe of a provider whose service is plain HTTP: nothing to check."""
    return None


#: OpenEnv's message that ends a session; the server then closes the socket.
_CLOSE = json.dumps({"type": "close"})


def _connect_kwargs(url: str, timeout_s: float, connect: Callable[..., Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"open_timeout": timeout_s, "close_timeout": timeout_s}
    # websockets >= 15 reads proxy settings from the environment; a loopback
    # server must never be reached through a proxy.
    if is_loopback(url) and "proxy" in inspect.signature(connect).parameters:
        kwargs["proxy"] = None
    return kwargs


#: The session a probe asks to attach to on `/ws`: one no server has. OpenEnv (0.10 and
#: later) then answers with an error frame naming it and closes, without making a session:
#: an env that allows one session at a time (and may take long to build its environment)
#: keeps that session for the client's own first `reset()`.
PROBE_SESSION_ID = "denv-readiness-probe"


def probe_url(base_url: str) -> str:
    """The URL a WebSocket probe connects to: `/ws`, attaching to `PROBE_SESSION_ID`."""
    return f"{websocket_url(base_url)}?session_id={PROBE_SESSION_ID}"


def probe_websocket(base_url: str, timeout_s: float) -> str | None:
    """A WebSocket upgrade on `<base_url>/ws` that opens no OpenEnv session; None when the
    server's `/ws` answered.

    The probe asks to attach to a session that does not exist (`PROBE_SESSION_ID`): the
    server's answer, an error frame naming it, proves the upgrade reached the app's `/ws`
    along the client's path. An OpenEnv that does not know attaching opens a session
    instead: the probe then sends OpenEnv's `close` message and waits for the server to
    close the socket, which it does after destroying the session.
    """
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    url = probe_url(base_url)
    try:
        with connect(url, **_connect_kwargs(url, timeout_s, connect)) as ws:
            ws.send(_CLOSE)
            try:
                frame = ws.recv(timeout=timeout_s)
            except (ConnectionClosed, TimeoutError):
                return None
            return _session_error(frame)
    except Exception as exc:
        return _upgrade_failure(exc)


async def probe_websocket_async(base_url: str, timeout_s: float) -> str | None:
    """`probe_websocket` on the asyncio client, for the provider's `*_async` methods."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    url = probe_url(base_url)
    try:
        async with connect(url, **_connect_kwargs(url, timeout_s, connect)) as ws:
            await ws.send(_CLOSE)
            try:
                frame = await asyncio.wait_for(ws.recv(), timeout_s)
            except (ConnectionClosed, TimeoutError):
                return None
            return _session_error(frame)
    except Exception as exc:
        return _upgrade_failure(exc)


def _upgrade_failure(exc: Exception) -> str:
    """Why a WebSocket session could not be opened; an error no probe expects is raised."""
    from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

    if isinstance(exc, InvalidStatus):
        return f"WebSocket upgrade on /ws answered {exc.response.status_code}"
    if isinstance(exc, OSError | InvalidHandshake | ConnectionClosed):
        return f"WebSocket upgrade on /ws failed: {type(exc).__name__}: {exc}"
    raise exc


def _session_error(frame: str | bytes) -> str | None:
    """The reason in an OpenEnv error frame (capacity, factory error), if it is one; None
    for the answer a probe asks for (no session named `PROBE_SESSION_ID`)."""
    try:
        message = json.loads(frame)
    except ValueError:
        return None
    if isinstance(message, dict) and message.get("type") == "error":
        data = message.get("data") or {}
        said = str(data.get("message", "unknown error"))
        if PROBE_SESSION_ID in said:
            return None
        return f"/ws refused a session: {said}"
    return None


def child_probe(start: str, probe: WebSocketProbe) -> WebSocketProbe:
    """The WebSocket readiness probe for a child started `start`: none for a live child.

    A live child's first WebSocket session continues the parent's session (the launcher
    hands it the parent's Environment); a probe session would take it and end it. The
    server answers a live fork only once each child serves, so health is enough.
    """
    return no_websocket if start == "live" else probe
