"""A client's lease: what it creates lives while the client does.

A `Denv` or `AsyncDenv` opens one lease on the server at its first create, sends its id with
every create and fork, and renews it from one background thread (per client, not per env).
When the renewals stop (the process was SIGKILLed, paused, or lost its network for longer
than the lease's timeout, 15 s by default), the server deletes every env the lease holds;
`close()`, and the interpreter's exit, close the lease, which deletes them at once.

The renewals run on a daemon thread with an HTTP client of its own, for `AsyncDenv` too:
they go on while the event loop is busy (a long synchronous step in a coroutine), and they
never touch the loop. A failed renewal is tried again half a second later until the lease's
time is up; a renewal the server refuses (the lease ended) stops the thread, and the client's
next create raises `LeaseExpired`.
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import Any

import httpx
from denv_api_client.client import AuthenticatedClient

from . import _config
from . import _operations as ops
from ._operations import Call
from .errors import DenvError, LeaseExpired, NotFound, Unauthorized

log = logging.getLogger("denv")

#: Renewals per lease timeout: a third of it between two, so one lost renewal costs nothing.
RENEWALS_PER_TIMEOUT = 3
#: Seconds before a failed renewal (no answer, a 5xx) is tried again.
RETRY_S = 0.5

_open: set[LeaseKeeper] = set()
_open_lock = threading.Lock()


class LeaseKeeper:
    """Renews one lease until it is closed, the server refuses it, or the process ends.

    `http` is the keeper's own sync client (built by the client from its settings); the
    keeper closes it.
    """

    def __init__(self, lease_id: str, timeout_s: float, http: httpx.Client, api: Any) -> None:
        self.lease_id = lease_id
        self.timeout_s = timeout_s
        self.every_s = timeout_s / RENEWALS_PER_TIMEOUT
        self._http = http
        self._api: AuthenticatedClient = api
        self._lost: LeaseExpired | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._renew_forever, name=f"denv-lease-{lease_id[-6:]}", daemon=True
        )
        with _open_lock:
            _open.add(self)
        self._thread.start()

    @property
    def lost(self) -> LeaseExpired | None:
        """Why the lease is gone (the server said it ended), or None while it is held."""
        return self._lost

    def check(self) -> str:
        """The lease's id, to send with a create; `LeaseExpired` once the server ended it."""
        if self._lost is not None:
            raise self._lost
        return self.lease_id

    def note(self, exc: LeaseExpired) -> None:
        """A call of the client found the lease ended: stop renewing it."""
        if exc.lease_id == self.lease_id and self._lost is None:
            self._lost = exc
            self._stop.set()

    def _send(self, call: Call[Any]) -> Any:
        res = call.operation.sync_detailed(*call.args, client=self._api, **call.kwargs)
        return call.result(res)

    def renew(self) -> bool:
        """One renewal; False when it did not reach the server (try again soon)."""
        try:
            self._send(ops.renew_lease(self.lease_id))
            return True
        except LeaseExpired as exc:
            self._lose(exc)
        except (NotFound, Unauthorized) as exc:  # a server that forgot it, or a key revoked
            self._lose(LeaseExpired(exc.message, status=409, code=exc.code, details={}))
        except DenvError as exc:
            log.info("denv: renewing lease %s failed (%s); trying again", self.lease_id, exc)
        except Exception as exc:  # the client closed under an in-flight renewal
            if not self._stop.is_set():
                log.warning("denv: renewing lease %s failed: %r", self.lease_id, exc)
        return False

    def _lose(self, exc: LeaseExpired) -> None:
        self._lost = exc
        self._stop.set()
        log.warning("denv: %s", exc.message)

    def _renew_forever(self) -> None:
        wait = self.every_s
        while not self._stop.wait(wait):
            wait = self.every_s if self.renew() else min(RETRY_S, self.every_s)

    def close(self) -> None:
        """Close the lease (the server deletes its envs now) and stop renewing it. A lease
        the server cannot be told about expires on its own within its timeout."""
        with _open_lock:
            if self not in _open:
                return
            _open.discard(self)
        self._stop.set()
        if self._lost is None:
            try:
                self._send(ops.close_lease(self.lease_id))
            except DenvError as exc:
                log.warning(
                    "denv: could not close lease %s (%s): its envs are deleted when it "
                    "expires, within %g s",
                    self.lease_id,
                    exc,
                    self.timeout_s,
                )
        self._thread.join(timeout=_config.CONNECT_TIMEOUT_S)
        self._http.close()


@atexit.register
def _close_all() -> None:
    """At the interpreter's exit (normal, or from an uncaught exception), close every lease
    still open: a script that never closed its client leaves nothing running."""
    with _open_lock:
        keepers = list(_open)
    for keeper in keepers:
        keeper.close()


def renew_timeout_s(timeout_s: float) -> float:
    """The per-request timeout of a keeper's client (a renewal answers in milliseconds): one
    stuck on a dead connection gives way to the next try well before the lease's time is up,
    so a blip of up to about half the timeout costs nothing (2.5 s for the default 15 s: the
    tries after a failed one come at 5, 8, 11 and 14 s)."""
    return max(1.0, min(_config.DEFAULT_TIMEOUT_S, timeout_s / (2 * RENEWALS_PER_TIMEOUT)))
