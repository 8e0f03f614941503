"""Quota holds: envs admitted but not yet recorded, counted as if they were.

Admission checks the key's env quota and its starting cap once, and in the same step (under
``Context.quota_lock``) holds the envs it let through: a concurrent request of the same key
then sees them, so the check at admission is the only one. The hold is handed over when the
envs are recorded (``Hold.recorded``, in the same lock as the insert) and whatever is left
of it is let go when the request ends (``with``: refused later, failed, or fewer recorded).

    with admission.hold(owner, 4) as hold:   # 429 here, or the four are held
        ...                                  # more checks, the version written
        envs.create(admitted, ...)           # inserts them and calls hold.recorded(4)
"""

from __future__ import annotations

import threading
from collections import Counter
from types import TracebackType


class Holds:
    """The envs held per API key on one server. Its counts change under ``quota_lock``."""

    def __init__(self) -> None:
        self._held: Counter[str] = Counter()

    def held(self, owner: str) -> int:
        return self._held[owner]

    def take(self, lock: threading.Lock, owner: str, count: int) -> Hold:
        """Hold ``count`` envs of ``owner`` (``lock`` is held by the caller)."""
        self._held[owner] += count
        return Hold(self, lock, owner, count)

    def _release(self, owner: str, count: int) -> None:
        self._held[owner] -= count
        if self._held[owner] <= 0:
            del self._held[owner]


class Hold:
    """``count`` envs of one key held until they are recorded or the request ends."""

    def __init__(self, holds: Holds, lock: threading.Lock, owner: str, count: int) -> None:
        self._holds, self._lock = holds, lock
        self.owner, self.count = owner, count

    def recorded(self, n: int) -> None:
        """``n`` of the held envs are in the store now (call it holding ``quota_lock``)."""
        n = min(n, self.count)
        self.count -= n
        self._holds._release(self.owner, n)

    def release(self) -> None:
        """Let go of what is still held (the request ended)."""
        with self._lock:
            self.recorded(self.count)

    def __enter__(self) -> Hold:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
