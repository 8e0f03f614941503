"""What the server's parts share: config, store, node, ingress and worker threads."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from denv.server.config import START_WORKERS, ServerConfig
from denv.server.db import Store
from denv.server.lifecycle.fairness import Fairness
from denv.server.lifecycle.holds import Holds
from denv.server.lifecycle.pins import Pins
from denv.server.locks import NamedLocks
from denv.server.node.abilities import EVERYTHING, Abilities
from denv.server.node.seam import Node
from denv.server.tokens import IngressKeys


class HostGuard(Protocol):
    """What the lifecycle asks of the host guard (``denv.server.net.host_guard``)."""

    def egress_unsafe(self) -> str | None: ...

    def status(self) -> dict[str, Any]: ...


class IngressRoutes(Protocol):
    """The part of ``denv.server.ingress.routes.IngressTable`` the server calls."""

    def register(self, token: str, host: str, port: int, owner: str = "") -> None: ...

    def unregister(self, token: str) -> None: ...

    def resolve(self, token: str) -> tuple[str, int] | None: ...

    def close_idle(self, host: str) -> None: ...


@dataclass
class Context:
    config: ServerConfig
    store: Store
    node: Node
    ingress: IngressRoutes
    host_guard: HostGuard
    abilities: Abilities = EVERYTHING  # what the node's sandboxes cannot do (its runtime's)
    workers: ThreadPoolExecutor = field(  # env starts, adopts and destroys run here
        default_factory=lambda: ThreadPoolExecutor(START_WORKERS, thread_name_prefix="denv-env")
    )
    changed: threading.Condition = field(default_factory=threading.Condition)
    stopping: threading.Event = field(default_factory=threading.Event)
    # Derives each env's ingress tokens; the server's is kept in <state_dir>/ingress_key.
    ingress_keys: IngressKeys = field(default_factory=IngressKeys.ephemeral)
    quota_lock: threading.Lock = field(default_factory=threading.Lock)
    holds: Holds = field(default_factory=Holds)  # envs admitted, not yet recorded (quota)
    _locks: NamedLocks = field(default_factory=NamedLocks)
    fair: Fairness = field(init=False)  # the slots each API key has in use
    pins: Pins = field(default_factory=Pins)  # versions requests in flight start envs from

    def __post_init__(self) -> None:
        self.fair = Fairness(self.config)

    def env_lock(self, env_id: str) -> threading.Lock:
        """Serialises the making and the removing of one env's resources (never global)."""
        return self._locks(env_id)

    def notify(self) -> None:
        """Wake the waiters of ``wait``: some env changed status."""
        with self.changed:
            self.changed.notify_all()
