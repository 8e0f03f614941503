"""uvicorn's WebSocket protocol, telling the app when the client last pinged.

ASGI has no event for a ping: the server answers it and the app never hears of it. The
ingress proxy's idle timeout (``ingress.websocket``) counts a client's pings as activity,
since that is what keepalive pings are for: OpenEnv's clients send one every 20 s (the
websockets library's default too) to keep an open session through proxies with idle
timeouts, and a session must never be cut while its client is alive.

Pongs do not count: uvicorn pings every client itself (``ws_ping_interval``), and every
client's library answers on its own, so a socket that a live process forgot would never
look idle. A peer that is gone answers no ping, and uvicorn closes it after its
``ws_ping_timeout``.

``denv serve`` runs uvicorn with ``ws=PingAwareProtocol``; each WebSocket's scope then holds
a ``LastPing`` under ``scope["extensions"][PINGS]``. Without it (another server) only
messages count.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

__all__ = ["PINGS", "LastPing", "PingAwareProtocol", "last_ping"]

PINGS = "denv.ws.pings"


class LastPing:
    """When (the event loop's clock) the client last sent a ping; 0.0: never."""

    __slots__ = ("at",)

    def __init__(self) -> None:
        self.at = 0.0


def last_ping(scope: Any) -> LastPing | None:
    """The ``LastPing`` of a WebSocket's scope, or None under a server that keeps none."""
    found = (scope.get("extensions") or {}).get(PINGS)
    return found if isinstance(found, LastPing) else None


class PingAwareProtocol(WebSocketsSansIOProtocol):
    """uvicorn's default WebSocket protocol, stamping each ping of the client."""

    _pings: LastPing | None = None

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None:  # None: the handshake was refused before the app ran
            self._pings = LastPing()
            scope["extensions"][PINGS] = self._pings  # the app's task has not run yet

    def handle_ping(self) -> None:
        super().handle_ping()
        if self._pings is not None:
            self._pings.at = self.loop.time()
