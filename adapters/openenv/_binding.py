"""What a DenvProvider is bound to: its settings, its env, and its connection to the server.

A `Binding` is the provider's state, kept in one object so that the operations
(`_operations`) and their sync and async runners read and change it the same way, never
through the provider's private fields. A provider holds one; each child of a fork gets one
of its own that shares the parent's connection.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

from ._config import ProviderConfig
from ._connection import Connection, open_connection
from ._readiness import WebSocketProbe

if TYPE_CHECKING:
    from denv import Env

T = TypeVar("T")


class Binding:
    """One provider's state. `lock` guards changes made from several threads at once.

    `env_id`, `base_url`, `start`: the env it runs (None when none); `origin`: what that
    env was started from, for messages; `ready_timeout_s`: the start's `wait_timeout` for the
    next readiness wait; `healthy_at_bind`: the server already reported the env healthy (a
    fork that waited), so readiness needs no long-poll; `awaited`: bound by an `*_async`
    call, so a stop from a coroutine never blocks its loop. `ws_probe`: the WebSocket
    readiness check (`DenvProvider.ws_probe`).
    """

    def __init__(
        self, config: ProviderConfig, ws_probe: WebSocketProbe, connection: Connection | None
    ) -> None:
        self.config = config
        self.ws_probe = ws_probe
        self.lock = threading.RLock()
        self.env_id: str | None = None
        self.base_url: str | None = None
        self.start: str | None = None
        self.origin = ""
        self.ready_timeout_s: float | None = None
        self.healthy_at_bind = False
        self.awaited = False
        self._connection = connection

    # -- the connection --------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Whether the connection is open (`connection()` would not block to open it)."""
        return self._connection is not None

    def connection(self) -> Connection:
        """The connection to the server, opened on first use (which may find or start the
        local server: blocking work)."""
        with self.lock:
            if self._connection is None:
                config = self.config
                self._connection = open_connection(config.server, config.api_key, config.detach)
            return self._connection

    def look(self, read: Callable[[Connection], T]) -> T:
        """``read(connection)``, leaving the binding as connected as it was: a provider bound
        to nothing that is asked its server (which may mean finding the local one) does not
        hold a connection, and the lease in it, for that."""
        with self.lock:
            if self._connection is not None:
                return read(self._connection)
            try:
                return read(self.connection())
            finally:
                self.disconnect()

    @contextmanager
    def released_on_failure(self) -> Iterator[None]:
        """A start or readiness wait that fails and leaves this binding bound to no env lets
        go of the connection, as a stop does: the lease it opened closes instead of renewing
        until the process exits."""
        try:
            yield
        except BaseException:
            if self.env_id is None:
                self.disconnect()
            raise

    def disconnect(self) -> None:
        """Let go of the connection (a later start opens a new one)."""
        with self.lock:
            connection, self._connection = self._connection, None
        if connection is not None:
            connection.release()

    def child(self, ws_probe: WebSocketProbe) -> Binding:
        """A binding with these settings, sharing this connection, bound to no env yet."""
        return Binding(self.config, ws_probe, self.connection().share())

    # -- the env ---------------------------------------------------------------------------------

    def require_unbound(self) -> None:
        if self.env_id is not None:
            raise RuntimeError(
                f"this DenvProvider already runs env {self.env_id}: call stop_container() "
                "first, or use another DenvProvider"
            )

    def bind(self, env: Env, url: str, origin: str, awaited: bool) -> None:
        """Bind to `env`, reached at `url` (checked usable by the caller)."""
        with self.lock:
            self.env_id, self.base_url, self.origin = env.id, url, origin
            self.start = str(env.start)
            # Already healthy on the server (a fork that waited): no long-poll needed.
            self.healthy_at_bind = str(env.status) == "healthy"
            self.awaited = self.awaited or awaited

    def unbind(self, env_id: str) -> None:
        """Forget `env_id` (deleted), unless another env has been bound since."""
        with self.lock:
            if self.env_id == env_id:
                self.env_id = self.base_url = self.start = None

    def hand_over(self) -> Binding:
        """A binding that takes over this one's env and connection (to stop them elsewhere);
        this one is left bound to nothing."""
        with self.lock:
            heir = Binding(self.config, self.ws_probe, self._connection)
            heir.env_id, heir.base_url, heir.start = self.env_id, self.base_url, self.start
            heir.origin = self.origin
            self.env_id = self.base_url = self.start = self._connection = None
        return heir
