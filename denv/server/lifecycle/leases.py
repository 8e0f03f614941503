"""Leases: the envs a client makes live only while the client does.

A client opens one lease (``POST /v1/leases``), creates and forks envs with its id, and
renews it every few seconds from a background thread. When renewals stop for the lease's
``timeout_s`` (the process was SIGKILLed or OOM-killed, paused, or its machine or network is
gone), the lease *expires*; a client that exits cleanly *closes* it. Either way the server
deletes every env the lease holds, which drops the warm pools only they asked for (their
spares go too), and each env's record says why (``deletion``). ``ttl_s`` still bounds every
env; a detached env (no lease) lives until its ttl or a delete.

The rule runs on its own loop (``end_due_forever``), a second at a time: one indexed query
finds leases past their expiry, a second finds the envs of every ended lease, so an env
created under a lease in the instant it expired is found on the next pass. Leases are rows
of the server's database, like envs: they outlive a restart, and the control plane of a
cluster keeps them the same way (its node agents never see one). A server that starts gives
every open lease its timeout again, since no client could renew while it was down.

    leases = Leases(ctx, envs)
    lease = leases.open(owner, timeout_s=None)        # the server's default timeout
    leases.renew(owner, lease.id)                     # 409 once it has ended
    leases.close(owner, lease.id)                     # its envs are deleted now
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from denv.server import ids
from denv.server.config import LEASE_DELETE_WORKERS, LEASE_KEEP_S
from denv.server.db import iso, iso_at, now
from denv.server.errors import ApiError, not_found
from denv.server.lifecycle.context import Context
from denv.server.lifecycle.envs import Envs
from denv.server.lifecycle.fairness import over_quota
from denv.server.lifecycle.shown import LeaseShown
from denv.server.records import EnvDeletion, EnvRecord, LeaseRecord, LeaseState

log = logging.getLogger(__name__)
FORGET_EVERY = 600  # passes of the rule between two clean-ups of long-ended leases


def deletion_of(lease_id: str, state: LeaseState, timeout_s: float | None) -> EnvDeletion:
    """Why an env of an ended lease was deleted, in the words its record keeps."""
    if state == "closed":
        return EnvDeletion(
            reason="lease_closed",
            message=f"its client closed lease {lease_id} (a clean exit, or close())",
            at=iso(now()),
        )
    waited = f"{timeout_s:g} s" if timeout_s else "its timeout"
    return EnvDeletion(
        reason="lease_expired",
        message=(
            f"lease {lease_id} expired: no renewal for {waited} (its client was killed, "
            "paused, or cut off from the server). Detach envs to keep them past their client"
        ),
        at=iso(now()),
    )


def too_many_leases(held: int, cap: int) -> ApiError:
    """429 ``quota_exceeded``: the key has as many open leases as the server allows."""
    return over_quota(
        "leases",
        f"this API key has {held} open leases, the server's limit is {cap} "
        "(--max-leases-per-key): each client (Denv, AsyncDenv, DenvProvider) holds one until "
        "it closes or stops renewing it; close clients you no longer use (close(), or a "
        "with block), or ask the operator to raise the limit",
        cap,
    )


class Leases:
    """Every lease of one server. Each call blocks (routes run it on a thread)."""

    def __init__(self, ctx: Context, envs: Envs) -> None:
        self.ctx = ctx
        self.envs = envs
        self._draining = threading.Event()

    # the API's operations
    def open(self, owner: str, timeout_s: float | None) -> LeaseRecord:
        t = time.time()
        timeout = float(timeout_s or self.ctx.config.lease_timeout_s)
        lease = LeaseRecord(
            id=ids.new_id("lse"),
            owner=owner,
            timeout_s=timeout,
            expires_at=t + timeout,
            created_at=t,
        )
        cap = self.ctx.config.max_leases_per_key
        if not self.ctx.store.leases.insert_capped(lease, cap):
            raise too_many_leases(self.ctx.store.leases.count_open(owner, t), cap)
        return lease

    def get_owned(self, owner: str, lease_id: str) -> LeaseRecord:
        lease = self.ctx.store.leases.get(lease_id) if ids.is_id(lease_id, "lse") else None
        if lease is None or lease.owner != owner:
            raise not_found("lease", lease_id)
        return lease

    def view(self, lease: LeaseRecord) -> LeaseShown:
        return LeaseShown(lease, self.ctx.store.leases.count_envs(lease.id))

    def renew(self, owner: str, lease_id: str) -> LeaseRecord:
        lease = self.get_owned(owner, lease_id)
        if not self.ctx.store.leases.renew(lease.id, time.time()):
            raise self._ended(self.get_owned(owner, lease_id))
        return self.get_owned(owner, lease_id)

    def holding(self, owner: str, lease_id: str | None) -> str | None:
        """The lease new envs are created under, checked before anything is written: 404
        when it is not this key's, 409 once it has ended. None: they are detached."""
        if lease_id is None:
            return None
        lease = self.get_owned(owner, lease_id)
        if lease.state != "open":
            raise self._ended(lease)
        return lease.id

    def close(self, owner: str, lease_id: str) -> None:
        """End the lease; its envs are deleted now, on a worker thread, so that a client
        exiting with hundreds of envs is not held up (nor timed out) by their teardown.
        Closing an ended lease changes nothing."""
        lease = self.get_owned(owner, lease_id)
        if self.ctx.store.leases.end(lease.id, "closed", time.time()):
            log.info("lease %s closed by its client", lease.id)
        # A server that is stopping refuses the work: its next start's pass does it.
        with contextlib.suppress(RuntimeError):
            self.ctx.workers.submit(self._end_due_logged)

    def _end_due_logged(self) -> None:
        try:
            self.end_due()
        except Exception:
            log.exception("deleting the envs of a closed lease failed")

    def detach(self, rec: EnvRecord) -> None:
        """``rec`` no longer belongs to its lease: it stays when the lease ends."""
        if rec.lease_id is not None:
            self.ctx.store.set_lease(rec.id, None)
            log.info("env %s detached from lease %s", rec.id, rec.lease_id)

    def drain(self) -> None:
        """The server is stopping: it refuses new connections, renewals too, while requests in
        flight finish. No lease expires from now on in this process; the next start gives
        each open lease its timeout again (``restart_grace``). Closed leases still end."""
        self._draining.set()

    # the rule
    def end_due(self) -> int:
        """Expire leases past their time (unless the server drains), then delete the envs of
        every ended lease (in parallel: a trainer's hundreds of envs go in seconds). Returns
        how many."""
        store = self.ctx.store
        due = [] if self._draining.is_set() else store.leases.due(time.time())
        for lease_id in due:
            if store.leases.end(lease_id, "expired", time.time()):
                log.warning("lease %s expired: deleting its envs", lease_id)
        doomed = store.leases.envs_of_ended()
        if not doomed:
            return 0
        timeouts: dict[str, float | None] = {}
        for _, lease_id, _, _ in doomed:
            if lease_id not in timeouts:
                lease = store.leases.get(lease_id)
                timeouts[lease_id] = lease.timeout_s if lease else None
        with ThreadPoolExecutor(LEASE_DELETE_WORKERS, thread_name_prefix="denv-lease") as pool:
            list(
                pool.map(
                    lambda d: self.envs.delete(d[0], deletion_of(d[1], d[2], timeouts[d[1]])),
                    doomed,
                )
            )
        log.info("leases: deleted %d env(s) of ended leases", len(doomed))
        return len(doomed)

    def restart_grace(self) -> None:
        """A server start: open leases get their timeout again (no client could renew while
        the server was down)."""
        self.ctx.store.leases.extend_open(time.time())

    @staticmethod
    def _ended(lease: LeaseRecord) -> ApiError:
        when = iso_at(lease.ended_at) if lease.ended_at is not None else "earlier"
        how = (
            f"expired at {when}: no renewal for {lease.timeout_s:g} s (was the client paused, "
            "or cut off from the server?)"
            if lease.state == "expired"
            else f"was closed at {when}"
        )
        return ApiError(
            409,
            "conflict",
            f"lease {lease.id} {how}; the server deleted the envs it held. Open a new lease "
            "(a new client) for new envs",
            {"lease_id": lease.id, "state": lease.state, "ended_at": when},
        )


async def end_due_forever(leases: Leases, interval_s: float) -> None:
    """Run the rule every ``interval_s`` (on a thread: it deletes envs); now and then,
    forget leases that ended long ago."""
    passes = 0
    while True:
        await asyncio.sleep(interval_s)
        try:
            await asyncio.to_thread(leases.end_due)
            passes += 1
            if passes % FORGET_EVERY == 0:
                before = time.time() - LEASE_KEEP_S
                await asyncio.to_thread(leases.ctx.store.leases.forget_ended, before)
        except Exception:
            log.exception("lease pass failed")
