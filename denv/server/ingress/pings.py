"""uvicorn's WebSocket protocol, telling the app when the client last pinged, and closing
cleanly when the server stops.

ASGI has no event for a ping: the server answers it and the app never hears of it. The
ingress proxy's idle timeout (``ingress.websocket``) counts a client's pings as activity,
since that is what keepalive pings are for: OpenEnv's clients send one every 20 s (the
websockets library's default too) to keep an open session through proxies with idle
timeouts, and a session must never be cut while its client is alive.

Pongs do not count: uvicorn pings every client itself (``ws_ping_interval``), and every
client's library answers on its own, so a socket that a live process forgot would never
look idle. A peer that is gone answers no ping, and uvicorn closes it after its
``ws_ping_timeout``.

When the server stops, uvicorn closes each open WebSocket with 1012 and no reason, and
answers one still in its handshake (the ingress opening its env's side) 500. Here an open
one gets 1012 ("service restart": reconnect later) with ``STOP_REASON``, which the ingress
passes on to the env's side, and a handshake gets 503 with it.

``denv serve`` runs uvicorn with ``ws=PingAwareProtocol``; each WebSocket's scope then holds
a ``LastPing`` under ``scope["extensions"][PINGS]``. Without it (another server) only
messages count.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

__all__ = ["PINGS", "STOP_CODE", "STOP_REASON", "LastPing", "PingAwareProtocol", "last_ping"]

PINGS = "denv.ws.pings"
STOP_CODE = 1012  # service restart (RFC 6455's registry): the client may come back later
STOP_REASON = "the denv server is stopping: reconnect once it is back"


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

    def shutdown(self) -> None:
        """The server stops: 1012 with ``STOP_REASON`` to an open WebSocket, 503 with it to one
        in its handshake; otherwise (a close already sent) as uvicorn does."""
        if self.close_sent or (self.initial_response is not None and not self.handshake_complete):
            super().shutdown()
            return
        self.stop_keepalive()
        if self.handshake_complete:
            disconnect = {"type": "websocket.disconnect", "code": STOP_CODE, "reason": STOP_REASON}
            self.queue.put_nowait(disconnect)  # type: ignore[arg-type]
            self.conn.send_close(STOP_CODE, STOP_REASON)
        else:
            self.conn.send_response(self.conn.reject(503, STOP_REASON))
        self.close_sent = True
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.transport.close()
