"""The queue in front of the Docker Engine: a few calls at once, the quietest API key first.

dockerd makes networks, containers and their network namespaces mostly one at a time, and
every call in flight takes CPU from the boots it serves; so do the mounts and filesystems of
volumes, which go through the same queue. Without a queue, a key with 16 envs
starting and 8 deleting has two dozen calls in flight, and another key's one create waits
behind all of them (measured: a network create 0.07 s idle, 1.05 s under such a flood; a
container start 0.8 s, 3.5 s). Here at most ``slots`` calls that make or remove something run
at once; a call that finds them taken waits, and the next slot goes to the waiting call
whose key has the fewest calls in flight (then the oldest), so a key's one call overtakes
another key's twentieth. One more slot is kept for keys with no call in flight: a key that
makes one env at a time does not wait for a busy key's slow call to end.

    queue = EngineQueue(2)
    with queue.slot(owner):
        engine.start(cid)
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

ENGINE_SLOTS = 2  # Docker calls that make or remove something, in flight at once
QUIET_KEY_SLOTS = 1  # more, for a key with no call in flight


class EngineQueue:
    """At most ``slots`` holders at once, handed out fairly between keys. Thread-safe."""

    def __init__(self, slots: int = ENGINE_SLOTS) -> None:
        self.slots = slots
        self._cond = threading.Condition()
        self._busy: Counter[str] = Counter()  # key -> calls in flight
        self._waiting: dict[int, str] = {}  # ticket -> key, oldest first
        self._tickets = itertools.count()

    @contextmanager
    def slot(self, owner: str) -> Iterator[None]:
        """Hold one slot for ``owner`` (``""``: no key, e.g. a spare or an orphan's cleanup)."""
        with self._cond:
            ticket = next(self._tickets)
            self._waiting[ticket] = owner
            try:
                while not self._may_go(ticket, owner):
                    self._cond.wait()
            finally:
                del self._waiting[ticket]
            self._busy[owner] += 1
            self._cond.notify_all()  # a slot may be left: the next in line may take it
        try:
            yield
        finally:
            with self._cond:
                self._busy[owner] -= 1
                if self._busy[owner] <= 0:
                    del self._busy[owner]
                self._cond.notify_all()

    def in_flight(self, owner: str) -> int:
        with self._cond:
            return self._busy[owner]

    def _may_go(self, ticket: int, owner: str) -> bool:
        """Next in line, and a slot free; a key with no call in flight may also take the one
        slot kept for such keys, so it never waits for another key's slow call to end."""
        if self._next() != ticket:
            return False
        spare = QUIET_KEY_SLOTS if not self._busy[owner] else 0
        return sum(self._busy.values()) < self.slots + spare

    def _next(self) -> int:
        """The waiting ticket served next: its key has the fewest calls in flight, then the
        oldest."""
        return min(self._waiting, key=lambda t: (self._busy[self._waiting[t]], t))
