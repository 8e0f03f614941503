"""What the server's parts share: config, store, node, ingress and worker threads."""

from __future__ import annotations

import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from .config import START_WORKERS, ServerConfig
from .fairness import Fairness
from .guard import HostGuardWatch
from .ingress_keys import IngressKeys
from .node import Node
from .store import Store


class IngressRoutes(Protocol):
    """The part of ``denv.server.ingress.IngressTable`` the server calls."""

    def register(self, token: str, host: str, port: int, owner: str = "") -> None: ...

    def unregister(self, token: str) -> None: ...

    def resolve(self, token: str) -> tuple[str, int] | None: ...


@dataclass
class Context:
    config: ServerConfig
    store: Store
    node: Node
    ingress: IngressRoutes
    pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(START_WORKERS, thread_name_prefix="denv-env")
    )
    changed: threading.Condition = field(default_factory=threading.Condition)
    stopping: threading.Event = field(default_factory=threading.Event)
    host_guard: HostGuardWatch = field(default_factory=HostGuardWatch)
    # Derives each env's ingress tokens; the server's is kept in <state_dir>/ingress_key.
    ingress_keys: IngressKeys = field(default_factory=IngressKeys.ephemeral)
    quota_lock: threading.Lock = field(default_factory=threading.Lock)
    _locks: defaultdict[str, threading.Lock] = field(
        default_factory=lambda: defaultdict(threading.Lock)
    )
    _locks_guard: threading.Lock = field(default_factory=threading.Lock)
    fair: Fairness = field(init=False)  # what each API key holds at once

    def __post_init__(self) -> None:
        self.fair = Fairness(self.config)

    def env_lock(self, env_id: str) -> threading.Lock:
        """Serialises the making and the removing of one env's resources (never global)."""
        with self._locks_guard:
            return self._locks[env_id]

    def notify(self) -> None:
        """Wake the waiters of ``wait``: some env changed status."""
        with self.changed:
            self.changed.notify_all()
