"""Readiness probes: is an OpenEnv server behind a base URL usable by a client?

An OpenEnv client needs two things from a server: `GET /health` answering 200
and a WebSocket upgrade on `/ws`. The server's own health check proves the
first inside the env's network; these probes prove both along the path the
client takes (the ingress proxy, or a published port).

Each probe returns `None` when the check passed, or a short reason when it did
not, so a caller can retry and report the last reason.
"""

from __future__ import annotations

import inspect
import ipaddress
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httpx

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


def probe_health(http: httpx.Client, base_url: str) -> str | None:
    """`GET <base_url>/health`; None when it answers 200."""
    try:
        response = http.get(base_url.rstrip("/") + "/health")
    except httpx.TransportError as exc:
        return f"GET /health failed: {type(exc).__name__}: {exc}"
    if response.status_code == 200:
        return None
    return f"GET /health answered {response.status_code}"


def no_websocket(base_url: str, timeout_s: float) -> None:
    """The WebSocket probe of a provider whose service is plain HTTP: nothing to check."""
    return None


def _connect_kwargs(url: str) -> dict[str, Any]:
    from websockets.sync.client import connect

    # websockets >= 15 reads proxy settings from the environment; a loopback
    # server must never be reached through a proxy.
    if is_loopback(url) and "proxy" in inspect.signature(connect).parameters:
        return {"proxy": None}
    return {}


def probe_websocket(base_url: str, timeout_s: float) -> str | None:
    """Open an OpenEnv session on `<base_url>/ws`, then end it; None when that worked.

    The probe sends OpenEnv's `close` message and waits for the server to close
    the socket, which it does after destroying the session: a server that
    allows one session at a time is free again when this returns.
    """
    from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
    from websockets.sync.client import connect

    url = websocket_url(base_url)
    try:
        with connect(
            url, open_timeout=timeout_s, close_timeout=timeout_s, **_connect_kwargs(url)
        ) as ws:
            ws.send(json.dumps({"type": "close"}))
            try:
                frame = ws.recv(timeout=timeout_s)
            except (ConnectionClosed, TimeoutError):
                return None
            return _session_error(frame)
    except InvalidStatus as exc:
        return f"WebSocket upgrade on /ws answered {exc.response.status_code}"
    except (OSError, InvalidHandshake, ConnectionClosed) as exc:
        return f"WebSocket upgrade on /ws failed: {type(exc).__name__}: {exc}"


def _session_error(frame: str | bytes) -> str | None:
    """The reason in an OpenEnv error frame (capacity, factory error), if it is one."""
    try:
        message = json.loads(frame)
    except ValueError:
        return None
    if isinstance(message, dict) and message.get("type") == "error":
        data = message.get("data") or {}
        return f"/ws refused a session: {data.get('message', 'unknown error')}"
    return None


def child_probe(start: str, probe: WebSocketProbe) -> WebSocketProbe:
    """The WebSocket readiness probe for a child started `start`: none for a live child.

    A live child's first WebSocket session continues the parent's session (the launcher
    hands it the parent's Environment); a probe session would take it and end it. The
    server answers a live fork only once each child serves, so health is enough.
    """
    return no_websocket if start == "live" else probe
