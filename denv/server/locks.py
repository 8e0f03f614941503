"""Locks by name (an env's, a layer's) that last only while someone holds or waits for them.

A server makes thousands of envs a day, each with its own lock; a plain dict of them would
keep one lock per env it ever ran. Here a name's lock is kept while a caller holds a
reference to it (a ``with`` block holds it, and so does a caller waiting to acquire it), so
every caller in between gets the same lock, and once none does it goes.

    locks = NamedLocks()
    with locks("env_01..."):
        ...
"""

from __future__ import annotations

import threading
import weakref


class NamedLocks:
    """One lock per name, for as long as it is in use. Safe to call from any thread."""

    def __init__(self) -> None:
        self._locks: weakref.WeakValueDictionary[str, threading.Lock] = (
            weakref.WeakValueDictionary()
        )
        self._mutex = threading.Lock()

    def __call__(self, name: str) -> threading.Lock:
        with self._mutex:
            lock = self._locks.get(name)
            if lock is None:
                lock = threading.Lock()
                self._locks[name] = lock
            return lock

    def __len__(self) -> int:
        """Names whose lock is in use."""
        return len(self._locks)
