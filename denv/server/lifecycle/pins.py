"""Pins: the versions a request in flight is about to start envs from, which the collector
(``collect``) must leave alone.

A fork records its version before its children exist, and a create from a version looks it
up before its envs are recorded: in between, nothing in the database says the version is
needed. A request holds a pin for that time: of its key, from its start (every version the
key records meanwhile is covered), and of the version it starts from, if it names one. The
collector marks versions deleted under the pins' lock, so a pin taken after a version was
marked sees it deleted (the request answers 404), and one taken before keeps it.

    with ctx.pins.pin(owner, version_id):
        ...   # look the version up again, record envs from it
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from denv.server.db import now


@dataclass(frozen=True)
class _Pin:
    owner: str
    since: datetime
    version_id: str | None


class Pins:
    """The pins of one server. Safe to call from any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._pins: list[_Pin] = []

    @contextmanager
    def pin(self, owner: str, version_id: str | None = None) -> Iterator[None]:
        with self.lock:
            pin = _Pin(owner, now(), version_id)
            self._pins.append(pin)
        try:
            yield
        finally:
            with self.lock:
                self._pins.remove(pin)

    def protects(self, version_id: str, owner: str, created_at: str) -> bool:
        """Whether a request in flight may still start envs from this version (call with
        ``lock`` held)."""
        if not self._pins:
            return False
        made = datetime.fromisoformat(created_at)
        return any(
            p.version_id == version_id or (p.owner == owner and p.since <= made) for p in self._pins
        )
