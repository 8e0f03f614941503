"""Warm pools: booted spares of an env's configuration, handed to forks in milliseconds.

A spare (``spares``) is an env booted before anyone asked for it, its volume mount points
still empty. A fork or create-from-version of a warm-safe version takes one and mounts the
child's overlay on those mount points: it appears inside the running containers at once
(``rslave``), and the env is ready without a boot.

A spare already carries the id of the env it will become (``env_`` + ULID), so its network,
containers, labels and volume dirs follow the naming of every env; until it is taken no
record of it is stored, so reconcile removes the spares a stopped server left behind as
orphans. Pools are keyed by everything that shapes a booted container (image digests,
commands, env vars, ports and volume paths of every service, egress), refill on their own
worker threads, stay within a count and a memory bound, and are reaped when idle or when
every env that asked for one is gone. One pool's record, its back-off and the room for one
more spare are ``pool``'s; this module is every pool of a server and their upkeep.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor

from denv.server import ids
from denv.server.config import (
    MIB,
    WARM_BOOT_WORKERS,
    WARM_MAX_FAILURES,
    WARM_REFILL_DELAY_S,
)
from denv.server.lifecycle.context import Context
from denv.server.lifecycle.fairness import over_quota
from denv.server.lifecycle.pools.pool import (
    Pool,
    fits,
    pop_nearest,
    retry_delay,
    spare_memory,
)
from denv.server.lifecycle.pools.spares import PoolOf, Spare, boot_spare
from denv.server.lifecycle.shown import PoolShown
from denv.server.node.seam import Cancelled

log = logging.getLogger(__name__)


class WarmPools:
    """Every pool of one server. Thread-safe; no Docker call is made under its lock."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._lock = threading.Lock()
        self._pools: dict[str, Pool] = {}
        self._boots = ThreadPoolExecutor(WARM_BOOT_WORKERS, thread_name_prefix="denv-warm")
        self._closed = False
        self._dropped: list[Pool] = []  # pools dropped by shutdown, to fail their claims
        self._removing: set[str] = set()  # spares no pool holds, their removal on a worker

    # what envs ask for and take
    def ask(self, env_ids: list[str], of: PoolOf, n: int, owner: str = "") -> None:
        """Keep ``n`` spares of this configuration while any of ``env_ids`` lives."""
        if n <= 0 or not of.warm:
            return
        with self._lock:
            if self._closed:
                return
            pool = self._pools.setdefault(of.key, Pool(of.key, of.blueprint))
            for env_id in env_ids:
                pool.owners[env_id] = n
                pool.keys[env_id] = owner
            pool.last_used = time.monotonic()
            pool.failures = 0
            self._refill()

    def check_spares(self, owner: str, of: PoolOf, n: int) -> None:
        """429 ``quota_exceeded`` when asking ``n`` spares of this configuration would take
        ``owner`` past ``--max-spares-per-key``; a key counts, in each pool, the most spares
        one of its envs asked for."""
        cap = self.ctx.config.max_spares_per_key
        if not cap or n <= 0 or not of.warm:
            return
        key = of.key
        with self._lock:
            asked = {
                k: max((m for e, m in p.owners.items() if p.keys.get(e) == owner), default=0)
                for k, p in self._pools.items()
            }
        total = sum(asked.values()) - asked.get(key, 0) + max(asked.get(key, 0), n)
        if total > cap:
            raise over_quota(
                "spares",
                f"this API key's envs would ask for {total} warm spares, the server's limit "
                f"is {cap} (--max-spares-per-key): ask for fewer (warm), or delete envs "
                "whose pools you no longer need",
                cap,
            )

    def available(self, of: PoolOf) -> int:
        """Spares of this configuration that a request could take now (idle or booting and
        not yet claimed): what admission counts against a cluster's room."""
        if not of.warm:
            return 0
        with self._lock:
            pool = self._pools.get(of.key)
            return 0 if pool is None else len(pool.idle) + len(pool.unclaimed())

    def take(self, of: PoolOf, count: int) -> list[tuple[str, Future[Spare | None]]]:
        """Spares for up to ``count`` children of ``version``: (env id, its spare when booted).

        Idle spares come first (their futures are done); then spares still booting, which
        are ahead of a cold start begun now (the future gives None if the boot fails).
        None of either when the version is not warm-safe.
        """
        if not of.warm:
            return []
        taken: list[tuple[str, Future[Spare | None]]] = []
        # On a cluster, spares on the nodes that hold the version's layers go first: the
        # others must fetch the layers before their late mount.
        near = set(self.ctx.node.layer_nodes(of.layers)) if of.layers else set()
        with self._lock:
            pool = self._pools.get(of.key)
            if pool is None:
                return []
            pool.last_used = time.monotonic()
            while pool.idle and len(taken) < count:
                spare = pop_nearest(pool.idle, near)
                done: Future[Spare | None] = Future()
                done.set_result(spare)
                taken.append((spare.env_id, done))
            if taken and pool.refill_after < time.monotonic():
                # Booting replacements at once would take the CPU from the children's
                # first requests, the moment a fork is meant to be fast.
                pool.refill_after = time.monotonic() + WARM_REFILL_DELAY_S
                timer = threading.Timer(WARM_REFILL_DELAY_S + 0.01, self._refill_now)
                timer.daemon = True
                timer.start()
            for env_id in pool.unclaimed()[: count - len(taken)]:
                pool.claims[env_id] = Future()
                taken.append((env_id, pool.claims[env_id]))
            self._refill()
        return taken

    def give_back(self, of: PoolOf, taken: list[tuple[str, Future[Spare | None]]]) -> None:
        """Return what :meth:`take` gave when the request failed before using it."""
        gone = []
        with self._lock:
            pool = None if self._closed else self._pools.get(of.key)
            for env_id, fut in taken:
                if pool is not None and pool.claims.get(env_id) is fut:
                    del pool.claims[env_id]  # its boot goes on, to the pool
                elif not fut.done():  # a claim of a pool dropped meanwhile: nobody takes it
                    fut.add_done_callback(self._remove_when_booted)
                elif (spare := fut.result()) is not None:
                    if pool is not None:
                        pool.idle.appendleft(spare)
                    else:
                        gone.append(env_id)
        self._destroy_later(gone)

    def _remove_when_booted(self, booted: Future[Spare | None]) -> None:
        spare = booted.result()
        if spare is not None:
            self._destroy_later([spare.env_id])

    def expedite(self, env_id: str) -> None:
        """A claimed spare still booting: give the containers it has the default CPU weight."""
        self.ctx.node.prioritize(env_id, [])

    def release(self, env_id: str) -> None:
        """An env is gone: pools only it asked for go too."""
        gone: list[str] = []
        with self._lock:
            for key, pool in list(self._pools.items()):
                pool.keys.pop(env_id, None)
                if pool.owners.pop(env_id, None) is not None and not pool.owners:
                    gone += self._drop(key)
        if gone:
            log.info("warm: reaping %d spare(s): the envs that asked for them are gone", len(gone))
        self._destroy_later(gone)

    def usage(self) -> tuple[int, int]:
        """Spares of every pool (booting ones included) and their memory in bytes: what
        zygotes count beside them against the same limits."""
        with self._lock:
            count = sum(len(p.idle) + len(p.unclaimed()) for p in self._pools.values())
            return count, spare_memory(self._pools.values())

    # background upkeep
    def reap(self) -> None:
        """Drop idle pools and dead spares, and refill (the reaper calls this)."""
        if not self._pools:
            return
        states = self.ctx.node.states()
        gone: list[str] = []
        idle_s = self.ctx.config.warm_idle_s
        with self._lock:
            for key, pool in list(self._pools.items()):
                if time.monotonic() - pool.last_used > idle_s:
                    log.info("warm: pool %s unused for %.0fs: reaping it", key, idle_s)
                    gone += self._drop(key)
                    continue
                for spare in list(pool.idle):
                    if any(states.get(c) != "running" for c in spare.booted.containers.values()):
                        log.warning("warm: spare %s stopped; replacing it", spare.env_id)
                        pool.idle.remove(spare)
                        gone.append(spare.env_id)
            self._refill()
        self._destroy_later(gone)

    def shutdown(self) -> None:
        """Remove every spare (clean server exit); boots in flight stop and remove theirs.

        Spares already dropped (their env deleted, their pool reaped) whose removal a worker
        has yet to finish are removed here too: the server does not wait for its workers,
        and its process ends when this returns."""
        with self._lock:
            self._closed = True
            gone = [x for key in list(self._pools) for x in self._drop(key)]
            gone += sorted(self._removing.difference(gone))
        self._boots.shutdown(wait=False, cancel_futures=True)
        for dropped in self._dropped:
            for fut in dropped.claims.values():
                if not fut.done():
                    fut.set_result(None)
        with ThreadPoolExecutor(8, thread_name_prefix="denv-warm-stop") as pool:
            list(pool.map(self.destroy, gone))
        self._boots.shutdown(wait=True)

    def status(self, env_id: str) -> PoolShown:
        """The pool ``env_id`` asked for, as the contract's WarmPool (state ``none`` if none)."""
        with self._lock:
            pool = next((p for p in self._pools.values() if env_id in p.owners), None)
            if pool is None:
                return PoolShown(env_id, "none")
            ready, booting, error = len(pool.idle), len(pool.unclaimed()), pool.error
            if ready >= pool.target:
                state = "ready"
            elif pool.failures >= WARM_MAX_FAILURES and pool.retry_at > time.monotonic():
                state = "stalled"
                left = pool.retry_at - time.monotonic()
                error = f"{error} (the pool tries again in {left:.0f} s)"
            elif booting or pool.refill_after > time.monotonic() or self._fits(pool):
                state = "filling"
            else:
                state = "stalled"
                error = (
                    "no room for another spare: the server's warm limits (--warm-max-spares, "
                    "--warm-max-memory, --warm-min-free-memory) or the host's free memory"
                )
            return PoolShown(env_id, state, pool.target, ready, booting, pool.failures, error)

    # internals (the _locked ones run under self._lock)
    def _drop(self, key: str) -> list[str]:
        pool = self._pools.pop(key)
        if self._closed:
            self._dropped.append(pool)
        for env_id in pool.unclaimed():  # nobody will take it: its boot stops
            self.ctx.node.cancel(env_id)
        return [s.env_id for s in pool.idle]  # booting ones see the pool gone and remove theirs

    def _fits(self, pool: Pool) -> bool:
        return fits(self._pools.values(), pool, self.ctx.config)

    def _refill_now(self) -> None:
        with self._lock:
            self._refill()

    def _refill(self) -> None:
        if self._closed or self.ctx.stopping.is_set():
            return
        for pool in self._pools.values():
            if pool.refill_after > time.monotonic():
                continue
            while len(pool.idle) + len(pool.unclaimed()) < pool.target:
                backing_off = (
                    pool.failures >= WARM_MAX_FAILURES and time.monotonic() < pool.retry_at
                )
                if backing_off or not self._fits(pool):
                    break
                env_id = ids.new_id("env")
                pool.booting[env_id] = time.monotonic()
                self._boots.submit(self._boot, pool, env_id)

    def _boot(self, pool: Pool, env_id: str) -> None:
        spare: Spare | None = None
        try:
            spare = boot_spare(self.ctx.node, pool.blueprint, env_id, pool.key)
            spare.memory = self.ctx.node.memory_bytes(list(spare.booted.containers.values()))
        except Cancelled:
            pass
        except Exception as exc:
            log.warning("warm: booting a spare of pool %s failed: %s", pool.key, exc)
            with self._lock:
                pool.failures += 1
                pool.error = str(exc)
                if pool.failures >= WARM_MAX_FAILURES:  # try again later, never give up
                    wait = retry_delay(pool.failures)
                    pool.retry_at = time.monotonic() + wait
                    log.warning("warm: pool %s: next boot in %.0f s", pool.key, wait)
        if spare is None:
            self.destroy(env_id)  # before a claimant starts cold under this id
        with self._lock:
            pool.booting.pop(env_id, None)
            claim = pool.claims.pop(env_id, None)
            keep = not self._closed and self._pools.get(pool.key) is pool
            keep = spare is not None and claim is None and keep and len(pool.idle) < pool.target
            if spare is not None and keep:
                pool.idle.append(spare)
                pool.memory = max(pool.memory, spare.memory)
                pool.failures, pool.error = 0, None
                log.info(
                    "warm: spare %s ready in pool %s (%d/%d, %d MiB)",
                    env_id,
                    pool.key,
                    len(pool.idle),
                    pool.target,
                    spare.memory // MIB,
                )
            self._refill()
        if claim is not None and _deliver(claim, spare):
            return
        if spare is not None and not keep:
            self.destroy(env_id)

    def _destroy_later(self, env_ids: list[str]) -> None:
        """Remove spares on a worker thread; until each is removed, ``shutdown`` knows it."""
        with self._lock:
            later = not self._closed  # past shutdown's sweep nobody would wait for a worker
            if later:
                self._removing.update(env_ids)
        for env_id in env_ids:
            if not (later and self._submit(env_id)):
                self._remove(env_id)

    def _submit(self, env_id: str) -> bool:
        try:
            self.ctx.workers.submit(self._remove, env_id)
        except RuntimeError:  # the server is stopping: the caller removes it now
            return False
        return True

    def _remove(self, env_id: str) -> None:
        self.destroy(env_id)
        with self._lock:
            self._removing.discard(env_id)

    def destroy(self, env_id: str) -> None:
        """Remove a spare's containers, network and volume dirs (found by its labels)."""
        try:
            self.ctx.node.teardown(env_id, [])
        except Exception:
            log.exception(
                "warm: removing spare %s failed (reconcile removes it at restart)", env_id
            )


def _deliver(claim: Future[Spare | None], spare: Spare | None) -> bool:
    """Hand a booted spare to the env that claimed it; False when shutdown had already
    failed the claim (nobody will take the spare: its boot removes it)."""
    try:
        claim.set_result(spare)
    except InvalidStateError:
        return False
    return True
