"""Zygotes: one idle, booted live root per (API key, configuration), copied into new envs.

A live create (``POST /v1/sandboxes`` with ``live: true`` or ``auto``) of a configuration
that has a zygote is answered by a live copy of it (``LiveForks.from_zygote``): a new env
with a fresh OpenEnv session in milliseconds, no boot. The first live create of a
configuration boots as before; once its env serves live, a zygote of that configuration
boots behind it (one more boot, once, not on the path of any request).

A zygote is an env record of its own whose owner is the key's id behind
:data:`ZYGOTE_OWNER` (``zygote:<key>``). So it is never listed as the key's env, never
counted in the key's env quota or starting cap, and never found by another key; its version
is recorded the same way. Nothing ever opens a session on it: its ingress token is known to
no client, and its copies forget it had no session (their first session is a new one). It
is kept within the warm pools' limits (``--warm-max-spares`` counts zygotes beside spares,
``--warm-max-memory`` and ``--warm-min-free-memory`` their memory), and on a cluster it
and its copies count as envs of its node (a zygote whose node has no room for a create's
copies is deleted: the create boots where there is room, and leaves the next one there).
It is reaped after ``--warm-idle-minutes`` without a copy, and deleted at server exit and
at start (a zygote left by a server that stopped is deleted by the next one). Deleting a
zygote ends its process only: its copies run in its container, which stays until the last
of them is gone. What a zygote imports before its first copy is ``preload``'s.

    zygotes = Zygotes(ctx, envs, versions, live_forks)
    recs = zygotes.copy(admitted, planned, opts, single=True)  # or None: boot
    zygotes.leave_behind(owner, version, egress, env_id)  # after a create that booted
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from denv.server import ids
from denv.server.config import MIB, WARM_MEMORY_GUESS
from denv.server.db import iso, now
from denv.server.errors import ApiError
from denv.server.lifecycle.admission import Admitted
from denv.server.lifecycle.context import Context
from denv.server.lifecycle.env_records import EnvOptions
from denv.server.lifecycle.envs import Envs
from denv.server.lifecycle.live.forks import LiveForks
from denv.server.lifecycle.live.preload import preload
from denv.server.lifecycle.pools.pool import mem_available
from denv.server.lifecycle.pools.spares import pool_of
from denv.server.lifecycle.requests import EnvsCreate
from denv.server.lifecycle.versions import Versions
from denv.server.node.errors import Refused
from denv.server.records import (
    FINAL,
    READY,
    EnvDeletion,
    EnvRecord,
    EnvStatus,
    VersionRecord,
)

log = logging.getLogger(__name__)

ZYGOTE_OWNER = "zygote:"  # + the key's owner id: the owner of a zygote's env and version
ZYGOTE_TTL_S = 7 * 86400  # idle reaping comes first; this only bounds a forgotten one
ZYGOTE_BOOT_TIMEOUT_S = 120.0
SETTLE_WAIT_S = 10.0  # a create waits this long for a zygote that serves to be ready to copy


def zygote_owner(owner: str) -> str:
    return ZYGOTE_OWNER + owner


def is_zygote(rec: EnvRecord) -> bool:
    return rec.owner.startswith(ZYGOTE_OWNER)


@dataclass
class Zygote:
    env_id: str
    version_id: str
    last_used: float = field(default_factory=time.monotonic)
    memory: int = 0  # bytes, measured once it served (before any copy ran in its container)


Key = tuple[str, str]  # (owner, the warm pool key of its configuration[@ a stored version])
Of = dict[str, str] | None  # a create from a stored version: its env vars; None: a sandbox


class Zygotes:
    """The zygotes of one server. Thread-safe; no Docker call is made under its lock."""

    def __init__(self, ctx: Context, envs: Envs, versions: Versions, live: LiveForks) -> None:
        self.ctx = ctx
        self.envs = envs
        self.versions = versions
        self.live = live
        self._lock = threading.Lock()
        self._zygotes: dict[Key, Zygote] = {}
        self._booting: set[Key] = set()
        self._not_live: set[Key] = set()  # configurations whose server cannot be copied
        # A zygote on its way (about to boot: no env yet; booting; preloading): its env, and
        # an event set once it is there to copy or will not be.
        self._pending: dict[Key, tuple[str, threading.Event]] = {}
        self._no_preload: set[Key] = set()  # a preload started a thread: boot them bare
        self._boots = ThreadPoolExecutor(2, thread_name_prefix="denv-zygote")
        self._closed = False

    @property
    def enabled(self) -> bool:
        return self.ctx.config.zygotes and not self._closed

    @staticmethod
    def key(owner: str, version: VersionRecord, egress: str, of: Of = None) -> Key:
        """A sandbox's configuration (its implicit version's, whatever its id), or with
        ``of`` (a create from a stored version: its env vars) the version itself: its /work
        is what the zygote booted on."""
        if of is None:
            return owner, pool_of(version, egress, {}, owner).key
        return owner, f"{pool_of(version, egress, of, owner).key}@{version.id}"

    def take(
        self, owner: str, version: VersionRecord, egress: str, of: Of = None
    ) -> EnvRecord | None:
        """The record of ``owner``'s ready zygote of this configuration, or None."""
        if not self.enabled:
            return None
        key = self.key(owner, version, egress, of)
        with self._lock:
            zygote = self._zygotes.get(key)
            pending = self._pending.get(key)
        if zygote is None and pending is not None:
            # Its zygote is booting (it has less of its boot left than a new one would) or
            # serves and preloads: wait for it rather than boot one env more.
            env_id, settled = pending
            booted = self.ctx.store.get_env(env_id) if env_id else None
            if not env_id or (booted is not None and booted.status not in FINAL):
                serves = booted is not None and booted.status in READY
                settled.wait(SETTLE_WAIT_S if serves else ZYGOTE_BOOT_TIMEOUT_S)
                with self._lock:
                    zygote = self._zygotes.get(key)
        with self._lock:
            if zygote is None:
                return None
            zygote.last_used = time.monotonic()
        rec = self.ctx.store.get_env(zygote.env_id)
        if rec is None or rec.runtime.live is None or rec.status not in READY:
            return None
        if not self.ctx.node.live_alive(rec.runtime.live):
            self.drop(owner, version, egress, "its server process ended", of)
            return None
        return rec

    def copy(
        self,
        admitted: Admitted,
        version: VersionRecord,
        opts: EnvsCreate,
        single: bool,
        of: Of = None,
    ) -> list[EnvRecord] | None:
        """``opts.count`` new envs copied from the admitted key's zygote of this
        configuration, or None: no zygote, or its copy failed (the zygote is then deleted,
        and the create boots). ``version``: the create's implicit version (recorded here),
        or with ``of`` the stored version the create starts from. ``single``: one env asked
        for, which boots rather than answer failed."""
        owner, egress = admitted.owner, admitted.egress
        zygote = self.take(owner, version, egress, of)
        if zygote is None:
            return None
        room = self.ctx.node.room_beside(zygote.id)  # its copies run on its node
        if room is not None and room < opts.count:
            # Its node is full (a cluster's cap): the create boots on a node with room, and
            # leaves this configuration's next zygote there.
            why = f"its node has room for {room} of {opts.count} copies"
            log.info("zygote: %s: %s; booting", zygote.id, why)
            self.drop(owner, version, egress, why, of)
            return None
        try:
            if of is None:
                made, recs = self.live.from_zygote(admitted.hold, zygote, version, opts)
            else:
                made, recs = self.live.from_zygote_of_version(admitted.hold, zygote, version, opts)
        except (ApiError, Refused) as exc:
            log.warning("zygote: copying %s failed (%s); booting", zygote.id, exc.message)
            self.drop(owner, version, egress, exc.message, of)
            return None
        if single and recs[0].status == EnvStatus.FAILED:
            why = recs[0].error.message if recs[0].error else "failed"
            self.envs.delete(recs[0].id)
            if made.id != version.id or of is None:  # a version of its own goes with it
                with contextlib.suppress(ApiError, Refused):
                    self.versions.delete(owner, made.id)
            self.drop(owner, version, egress, f"its copy failed: {why}", of)
            return None
        return recs

    def drop(
        self, owner: str, version: VersionRecord, egress: str, why: str, of: Of = None
    ) -> None:
        """Delete the zygote of this configuration (a copy of it failed: boot the next)."""
        with self._lock:
            zygote = self._zygotes.pop(self.key(owner, version, egress, of), None)
        if zygote is not None:
            self._delete(zygote, why)

    def leave_behind(
        self, owner: str, version: VersionRecord, egress: str, env_id: str, of: Of = None
    ) -> None:
        """Boot a zygote of this configuration once ``env_id`` (just created by booting)
        serves live; nothing when it does not, or when one exists or is booting. ``of``:
        ``env_id`` was created from the stored ``version`` with these env vars."""
        if not self.enabled or owner.startswith(ZYGOTE_OWNER):
            return
        key = self.key(owner, version, egress, of)
        with self._lock:
            if key in self._zygotes or key in self._booting or key in self._not_live:
                return
            self._booting.add(key)
        try:
            self._boots.submit(self._boot_after, key, owner, version, egress, env_id, of)
        except RuntimeError:  # shut down meanwhile
            with self._lock:
                self._booting.discard(key)

    def _boot_after(
        self,
        key: Key,
        owner: str,
        version: VersionRecord,
        egress: str,
        env_id: str,
        of: Of = None,
    ) -> None:
        try:
            first = self.envs.wait(env_id, READY | FINAL, ZYGOTE_BOOT_TIMEOUT_S)
            if first.status not in READY:
                return  # failed or deleted: the next create tries again
            if first.runtime.live is None:  # auto, and its server cannot be copied
                with self._lock:
                    self._not_live.add(key)
                return
            settled = threading.Event()
            with self._lock:
                self._pending[key] = ("", settled)
            if not self._fits():
                log.info("zygote: no room for a zygote of %s (the warm limits)", key[1])
                return
            self._boot(key, owner, version, egress, of, first, settled)
        except Exception:
            log.exception("zygote: booting the zygote of %s failed", key[1])
        finally:
            with self._lock:
                self._booting.discard(key)
                pending = self._pending.pop(key, None)
            if pending is not None:
                pending[1].set()

    def _boot(
        self,
        key: Key,
        owner: str,
        version: VersionRecord,
        egress: str,
        of: Of,
        first: EnvRecord,
        settled: threading.Event,
    ) -> None:
        zowner = zygote_owner(owner)
        # The zygote's own record of the version (a stored version's layers: its /work).
        zversion = self.versions.add(
            replace(version, id=ids.new_id("ver"), owner=zowner, labels={}, created_at=iso(now()))
        )
        with self.envs.admit.hold(zowner, 1) as hold:
            admitted = self.envs.admit.started(hold, zversion, egress, True, dict(of or {}))
            start = EnvOptions({}, ZYGOTE_TTL_S, ZYGOTE_BOOT_TIMEOUT_S, use_spares=False)
            [rec] = self.envs.create(admitted, zversion, start)
        zygote = Zygote(rec.id, zversion.id)
        with self._lock:
            self._pending[key] = (rec.id, settled)
        try:
            self._settle(key, zygote, rec.id, first)
        except BaseException:
            self._delete(zygote, "its set-up failed")  # never kept, so never reaped
            raise

    def _settle(self, key: Key, zygote: Zygote, env_id: str, first: EnvRecord) -> None:
        """Once the zygote serves: its preload, then it is there to copy."""
        done = self.envs.wait(env_id, READY | FINAL, ZYGOTE_BOOT_TIMEOUT_S + 30)
        if done.status not in READY or done.runtime.live is None:
            why = done.error.message if done.error else done.status.value
            log.warning("zygote: %s of %s did not come up live: %s", env_id, key[1], why)
            self._delete(zygote, "its boot failed")
            return
        if key not in self._no_preload and not preload(self.ctx, done, first):
            with self._lock:
                self._no_preload.add(key)
            self._delete(zygote, "a module it preloaded started a thread (the next boots bare)")
            return
        zygote.memory = self.ctx.node.memory_bytes(list(done.runtime.containers.values()))
        with self._lock:
            keep = not self._closed and key not in self._zygotes
            if keep:
                zygote.last_used = time.monotonic()  # idle from now, not from its boot
                self._zygotes[key] = zygote
        if not keep:
            self._delete(zygote, "the server is stopping")
            return
        log.info("zygote: %s ready for %s (%d MiB)", env_id, key[1], zygote.memory // MIB)

    def _fits(self) -> bool:
        """Within the warm pools' limits, zygotes counted beside spares."""
        cfg = self.ctx.config
        spares, spare_memory = self.envs.warm.usage()
        with self._lock:
            count = len(self._zygotes) + len(self._booting) - 1  # this one is in _booting
            memory = sum(z.memory for z in self._zygotes.values())
        if spares + count + 1 > cfg.warm_max_spares:
            return False
        room = self.ctx.node.room()  # a zygote counts as an env on its node (a cluster's cap)
        if room is not None and room < 1:
            return False
        need = WARM_MEMORY_GUESS
        if cfg.warm_max_memory_mb and spare_memory + memory + need > cfg.warm_max_memory_mb * MIB:
            return False
        return mem_available() - need >= cfg.warm_min_free_mb * MIB

    # upkeep
    def reap(self) -> None:
        """Delete zygotes idle past ``--warm-idle-minutes`` and those that stopped."""
        idle_s = self.ctx.config.warm_idle_s
        gone: list[tuple[Zygote, str]] = []
        with self._lock:
            items = list(self._zygotes.items())
        for key, zygote in items:
            rec = self.ctx.store.get_env(zygote.env_id)
            if time.monotonic() - zygote.last_used > idle_s:
                why = f"no create copied it for {idle_s:.0f} s"
            elif rec is None or rec.status not in READY or rec.runtime.live is None:
                why = "it stopped"
            elif not self.ctx.node.live_alive(rec.runtime.live):
                why = "its server process ended"
            else:
                continue
            with self._lock:
                if self._zygotes.get(key) is zygote:
                    del self._zygotes[key]
                    gone.append((zygote, why))
        for zygote, why in gone:
            self._delete(zygote, why)

    def shutdown(self) -> None:
        """Delete every zygote (clean server exit); boots in flight delete theirs."""
        with self._lock:
            self._closed = True
            gone = list(self._zygotes.values())
            self._zygotes.clear()
        self._boots.shutdown(wait=False, cancel_futures=True)
        for zygote in gone:
            self._delete(zygote, "the server is stopping")

    def delete_stored(self) -> None:
        """At start: delete the zygotes a server that stopped left in the store."""
        for rec in self.ctx.store.existing_envs():
            if is_zygote(rec):
                self._delete(Zygote(rec.id, rec.version_id), "the server restarted")

    def _delete(self, zygote: Zygote, why: str) -> None:
        log.info("zygote: deleting %s: %s", zygote.env_id, why)
        deletion = EnvDeletion(reason="server", message=f"zygote: {why}", at=iso(now()))
        try:
            self.envs.delete(zygote.env_id, deletion)
        except Exception:
            log.exception("zygote: deleting %s failed", zygote.env_id)
            return
        rec = self.ctx.store.get_env(zygote.env_id)
        if rec is not None:
            with contextlib.suppress(Exception):  # e.g. already gone
                self.versions.delete(rec.owner, zygote.version_id)

    def count(self) -> int:
        with self._lock:
            return len(self._zygotes)
