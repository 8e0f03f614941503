"""The fork verb: ``POST /v1/envs/{id}/fork``. Live (the env's server process copied into
each child) where the env and the request allow it, else (``kind: auto``) or when asked, a
volume fork (a snapshot of the env's volumes, children booted or taken from warm spares
from it); live children that do not fit on their parent's node spill to a volume fork of
their version on other nodes. Where the node can save the env's sandbox (gVisor), a volume
fork of ``kind: auto`` saves it too, and its children resume from that checkpoint (their
server's memory as it was) instead of booting."""

from __future__ import annotations

import contextlib
import logging
import time

from denv.server.errors import ApiError, invalid
from denv.server.lifecycle.env_records import EnvOptions
from denv.server.lifecycle.holds import Hold
from denv.server.lifecycle.live.spill import live_share, spill_note
from denv.server.lifecycle.parts import Verb
from denv.server.lifecycle.requests import EnvsCreate
from denv.server.lifecycle.shown import EnvShown, Made
from denv.server.node.errors import NodeError, Refused
from denv.server.node.seam import Checkpoint
from denv.server.records import UP, EnvRecord, EnvStatus, VersionRecord

log = logging.getLogger(__name__)

# A fork of kind auto that cannot be live (the env's server runs threads of its own, or the
# children ask for an egress or env of their own) is a volume fork instead.
AUTO_VOLUME_CODES = frozenset({"fork_unsafe", "live_unsupported"})


class Forks(Verb):
    """Forks of one server; each call blocks (routes run it in a thread)."""

    def fork(self, owner: str, env_id: str, opts: EnvsCreate) -> Made:
        """One snapshot of the env, ``opts.count`` children started from it."""
        rec = self.views.owned_env(owner, env_id)
        if opts.live is not False:
            raise invalid(
                "live is for creating envs from a version; a fork's kind says how it forks "
                "(volume, live or auto)",
                "live",
            )
        opts = opts.model_copy(update={"lease_id": self.leases.holding(owner, opts.lease_id)})
        parent = self.ctx.store.get_version(rec.version_id)
        # One admission for the fork, whatever it becomes: the key's quota held once and
        # carried to the children it records (live, spilled, or a volume fork instead).
        with self.admit.hold(owner, opts.count) as hold:
            admitted = self.admit.fork(hold, rec, parent, opts)
            spill: str | None = None  # every child spills: its parent's node has no room
            if admitted.live:
                assert parent is not None  # the admission's (not_live)
                live_n = live_share(self.ctx, rec, opts)  # the rest spill (a cluster's cap)
                if live_n:
                    try:
                        with self.ctx.pins.pin(owner):
                            some = opts.model_copy(update={"count": live_n})
                            version, children = self.live.fork(hold, rec, parent, some)
                    except ApiError as exc:
                        # auto: live where the env allows it. A server running threads of
                        # its own (the gate saw them before any child existed) gets a
                        # volume fork instead.
                        if opts.kind != "auto" or exc.code not in AUTO_VOLUME_CODES:
                            raise
                        log.info(
                            "fork of %s (auto): %s; a volume fork instead", env_id, exc.message
                        )
                    else:
                        return self._live(hold, rec, version, children, opts, live_n)
                else:
                    spill = spill_note(rec, 0, opts.count)
                admitted = self.admit.volume_fork(hold, rec, parent, opts, rec.egress)
            t0 = time.perf_counter()
            with self.ctx.pins.pin(owner):  # the fork's version, until its children are recorded
                saved = None if spill or admitted.warm else self._checkpoint(rec, parent, opts)
                try:
                    version = self.versions.snapshot(rec, {}, "fork")
                    t1 = time.perf_counter()
                    if spill:  # a spilled child forks live too
                        admitted.live = "auto"
                    restore = saved.image if saved else ""
                    recs = self.envs.create(admitted, version, EnvOptions.of(opts, spill, restore))
                except BaseException:
                    if saved:
                        self._drop(saved)
                    raise
        if saved:  # let go of it once every child has resumed from it
            self.ctx.workers.submit(self._drop_when_started, saved, recs)
        t2 = time.perf_counter()
        envs = self.views.wait_all(recs, opts.wait, opts.wait_timeout_s)
        log.info(
            "fork env %s into %d (%d warm%s): snapshot %.1f ms, create %.1f ms, wait %.1f ms",
            rec.id,
            len(recs),
            sum(r.start == "warm" for r in recs),
            f", from a checkpoint of {saved.bytes / 1e6:.1f} MB" if saved else "",
            (t1 - t0) * 1000,
            (t2 - t1) * 1000,
            (time.perf_counter() - t2) * 1000,
        )
        return Made(envs, self.views.version(version))

    def _checkpoint(
        self, rec: EnvRecord, parent: VersionRecord | None, opts: EnvsCreate
    ) -> Checkpoint | None:
        """The env's sandbox saved for its children to resume from, where the node can
        (``Abilities.checkpoint``) and the fork is ``auto``; None: its children boot. One
        service only: a compose env's other services would boot again beside a server
        whose memory still holds the parent's connections to them."""
        if self.ctx.abilities.checkpoint is not None or opts.kind != "auto" or parent is None:
            return None
        container = rec.runtime.containers.get(rec.agent_service)
        if len(parent.services) != 1 or not container:
            return None
        if rec.status not in (EnvStatus.RUNNING, EnvStatus.HEALTHY):
            return None
        if rec.runtime.agent_ip:  # the ingress's idle connections to it: they cannot be saved
            self.ctx.ingress.close_idle(rec.runtime.agent_ip)
        try:
            return self.ctx.node.checkpoint(rec.id, container)
        except NodeError as exc:  # CheckpointUnsupported, a lost node: they boot
            log.info("fork of %s: its sandbox was not saved (%s); children boot", rec.id, exc)
            return None

    def _drop_when_started(self, saved: Checkpoint, recs: list[EnvRecord]) -> None:
        """Let go of ``saved`` once every child has resumed from it (its containers run: ``UP``)
        or failed, or gone."""
        deadline = time.monotonic() + max(r.spec.wait_timeout_s for r in recs)
        try:
            for child in recs:  # they start together: one deadline for them all
                self.envs.wait(child.id, UP, max(0.0, deadline - time.monotonic()))
        finally:
            self._drop(saved)

    def _drop(self, saved: Checkpoint) -> None:
        try:
            self.ctx.node.drop_checkpoint(saved.env_id, saved.image)
        except NodeError as exc:  # its node is lost, say: a later checkpoint sweeps it
            log.info("checkpoint %s of %s stays for now: %s", saved.image, saved.env_id, exc)

    def _live(
        self,
        hold: Hold,
        rec: EnvRecord,
        version: VersionRecord,
        children: list[EnvRecord],
        opts: EnvsCreate,
        live_n: int,
    ) -> Made:
        """A live fork's answer: its ``live_n`` children copied on ``rec``'s node, and the
        rest (a cluster's cap) spilled to other nodes (``_spill``), held by ``hold``."""
        views = self.views.copies(children)  # in the parent's container, running
        if live_n < opts.count:
            views += self._spill(hold, rec, version, children, opts, live_n)
        return Made(views, self.views.version(version))

    def _spill(
        self,
        hold: Hold,
        rec: EnvRecord,
        version: VersionRecord,
        children: list[EnvRecord],
        opts: EnvsCreate,
        live_n: int,
    ) -> list[EnvShown]:
        """The children of a live fork that did not fit on its parent's node: a volume fork
        of the live children's version, placed on other nodes (``spill``), each booted live
        (``auto``) so that it forks live in turn, held by what is left of the fork's
        ``hold``. When they cannot be started, nothing of the fork is left: its live
        children and version go too."""
        owner = hold.owner
        rest = opts.model_copy(update={"count": opts.count - live_n})
        note = spill_note(rec, live_n, opts.count)
        try:
            with self.ctx.pins.pin(owner, version.id):
                admitted = self.admit.started(hold, version, rec.egress, "auto", rest.env)
                recs = self.envs.create(admitted, version, EnvOptions.of(rest, note))
        except BaseException:
            for child in children:
                self.envs.delete(child.id)
            with contextlib.suppress(ApiError, Refused):
                self.versions.delete(owner, version.id)
            raise
        log.info("fork of %s: %d live, %d spilled to a volume fork", rec.id, live_n, len(recs))
        return self.views.wait_all(recs, rest.wait, rest.wait_timeout_s)
