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

Each call in flight also slows the others down: on this 2-core machine a container start
takes 0.23 s alone, 0.27 s beside one other start and 0.36 s beside two
(`bench/results/flood.md`). So while a key makes an env (``active``, the whole boot, its
calls and the time between them), a key making more envs at once starts no new call: its
calls in flight end, and the lighter key's boot runs alone at the engine. A call yields for
at most ``YIELD_MAX_S``, counted from its first yield (not from when it joined the queue: a
flooding key's calls have mostly waited that long for its own calls already), so a stream
of lighter keys cannot starve it; work of no key (spares, cleanups) is never yielded to.

The yield starts no new call, but the calls a heavier key began before the lighter key's
boot still run beside it (a client making one env after another leaves the engine between
two of them). So while a lighter key has worked on an env within ``RECENT_S``, a heavier key
has at most ``SHARED_KEY_SLOTS`` (one) call in flight: the next boot overlaps one of its
calls, not two. Alone, a key has every slot: its bursts keep their speed (measured in
`bench/results/flood.md`, "One call in flight for the heavier key...").

    queue = EngineQueue(2)
    with queue.active(owner):  # the whole boot
        with queue.slot(owner):
            engine.start(cid)
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

ENGINE_SLOTS = 2  # Docker calls that make or remove something, in flight at once
QUIET_KEY_SLOTS = 1  # more, for a key with no call in flight
YIELD_MAX_S = 3.0  # how long a call waits, at most, for lighter keys' boots
SHARED_KEY_SLOTS = 1  # calls in flight, at most, of a key heavier than one seen lately
RECENT_S = 2.0  # how long a key that worked on an env counts as seen


class EngineQueue:
    """At most ``slots`` holders at once, handed out fairly between keys. Thread-safe."""

    def __init__(self, slots: int = ENGINE_SLOTS) -> None:
        self.slots = slots
        self._cond = threading.Condition()
        self._busy: Counter[str] = Counter()  # key -> calls in flight
        self._active: Counter[str] = Counter()  # key -> envs it is making (``active``)
        self._waiting: dict[int, str] = {}  # ticket -> its key; oldest first
        self._yielding: dict[int, float] = {}  # ticket -> when it first yielded
        self._seen: dict[str, float] = {}  # key -> when its ``active`` count last changed
        self._tickets = itertools.count()

    @contextmanager
    def slot(self, owner: str) -> Iterator[None]:
        """Hold one slot for ``owner`` (``""``: no key, e.g. a spare or an orphan's cleanup)."""
        with self._cond:
            ticket = next(self._tickets)
            self._waiting[ticket] = owner
            try:
                while self._next() != ticket:
                    self._cond.wait(YIELD_MAX_S)  # a yield ends by time, not by a notify
            finally:
                del self._waiting[ticket]
                self._yielding.pop(ticket, None)
            self._busy[owner] += 1
            self._cond.notify_all()  # a slot may be left: the next in line may take it
        try:
            yield
        finally:
            self._done(self._busy, owner)

    @contextmanager
    def active(self, owner: str) -> Iterator[None]:
        """``owner`` is making an env, between its calls too: keys making more envs at once
        start no new call until it is done (or they waited ``YIELD_MAX_S``)."""
        with self._cond:
            self._active[owner] += 1
            self._seen[owner] = time.monotonic()
        try:
            yield
        finally:
            self._done(self._active, owner)

    def _done(self, counts: Counter[str], owner: str) -> None:
        """One less of ``owner``'s in ``counts``; the waiting calls look again."""
        with self._cond:
            counts[owner] -= 1
            if counts[owner] <= 0:
                del counts[owner]
            if counts is self._active:
                self._seen[owner] = time.monotonic()
            self._cond.notify_all()

    def in_flight(self, owner: str) -> int:
        with self._cond:
            return self._busy[owner]

    def _next(self) -> int | None:
        """The waiting ticket served next, among those with room: its key has the fewest
        calls in flight, then the oldest."""
        now = time.monotonic()
        ready = [t for t in self._waiting if self._room(t, now)]
        return min(ready, key=lambda t: (self._busy[self._waiting[t]], t), default=None)

    def _room(self, ticket: int, now: float) -> bool:
        """A slot free for the ticket's key: one of ``slots``, or the one kept for keys with
        no call in flight; no more than ``SHARED_KEY_SLOTS`` in flight for the key while a
        lighter key is about; and no lighter key making an env, unless the ticket has
        yielded for ``YIELD_MAX_S`` already."""
        key = self._waiting[ticket]
        total = sum(self._busy.values())
        if total >= self.slots + (0 if self._busy[key] else QUIET_KEY_SLOTS):
            return False
        if self._busy[key] >= SHARED_KEY_SLOTS and self._lighter_seen(key, now):
            return False
        if not self._lighter_active(key):
            return True
        return now - self._yielding.setdefault(ticket, now) >= YIELD_MAX_S

    def _lighter_seen(self, key: str, now: float) -> bool:
        """A key working on fewer envs than ``key`` is, now or within ``RECENT_S`` (work of
        no key does not count)."""
        mine = self._active[key]
        for k, t in list(self._seen.items()):
            if k in ("", key):
                continue
            if k not in self._active and now - t >= RECENT_S:
                del self._seen[k]
            elif self._active[k] < mine:
                return True
        return False

    def _lighter_active(self, key: str) -> bool:
        """Another key is making fewer envs than ``key`` is (work of no key does not count)."""
        mine = self._active[key]
        return any(n < mine for k, n in self._active.items() if k not in ("", key))
