"""The server's SQLite file and its one connection (``Store`` runs its queries on it).

One connection shared by all threads behind a lock held only for the SQL itself, never across a
Docker call; the file and its -wal and -shm files are the owner's only. Writes wake the
watchers (the console's tree is pushed when something changes, not polled); lease renewals
write quietly (``_run_quietly``), since they change no env or version.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from denv.server.db_schema import create_and_migrate

log = logging.getLogger(__name__)


class Database:
    """One SQLite file (WAL, owner only) behind a lock: what ``Store``'s queries run on.
    Safe to call from any thread."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Owner only, before SQLite writes a byte (it gives its -wal and -shm files the
        # database's mode); an older database is tightened too.
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        for suffix in ("", "-wal", "-shm"):
            with suppress(FileNotFoundError):
                os.chmod(f"{path}{suffix}", 0o600)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.RLock()
        self._watchers: list[Callable[[], None]] = []
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA busy_timeout=5000")
            create_and_migrate(self._db)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """Several statements as one; keep Docker calls out of it."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        self._changed()

    def watch(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the writing thread; keep it short) after every write: the
        console's tree is pushed when something changes, not polled."""
        with self._lock:
            self._watchers.append(callback)

    def unwatch(self, callback: Callable[[], None]) -> None:
        with self._lock, suppress(ValueError):
            self._watchers.remove(callback)

    def _changed(self) -> None:
        with self._lock:
            watchers = list(self._watchers)
        for callback in watchers:
            try:
                callback()
            except Exception:  # a watcher whose loop has closed must not fail a write
                log.debug("a store watcher failed", exc_info=True)

    def _all(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return list(self._db.execute(sql, args).fetchall())

    def _run(self, sql: str, args: tuple[Any, ...] = ()) -> int:
        with self._lock:
            count = self._db.execute(sql, args).rowcount
        if count:
            self._changed()
        return count

    def _run_quietly(self, sql: str, args: tuple[Any, ...] = ()) -> int:
        with self._lock:
            return int(self._db.execute(sql, args).rowcount)
