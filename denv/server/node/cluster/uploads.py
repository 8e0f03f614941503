"""The cluster node's background work: layers and images saved into the object store.

A snapshot returns before its layers are stored, and an image found on a member is saved
once, later; both run on one small pool that the node's ``stop`` ends, so that nothing
starts uploading while the server shuts down.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

UPLOAD_WORKERS = 4


class Uploads:
    """The pool uploads run on. ``stopped`` is read and set under the cluster's lock (the
    members' lock, given here), so an upload is either submitted before ``stop`` or never."""

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock
        self.stopped = False
        self._workers = ThreadPoolExecutor(UPLOAD_WORKERS, thread_name_prefix="denv-upload")

    def submit(self, fn: Callable[..., None], *args: Any) -> Future[None]:
        """``fn(*args)`` in the background; the caller checked ``stopped`` under the lock."""
        return self._workers.submit(fn, *args)

    def stop(self) -> None:
        """No upload starts after this (those queued are cancelled by ``shutdown``)."""
        with self._lock:
            self.stopped = True

    def shutdown(self) -> None:
        self._workers.shutdown(wait=False, cancel_futures=True)
