"""The server's operations behind the contract: create, fork, snapshot, deploy, and the rest.

Routes (``routes``) parse HTTP and call one method here on a worker thread; what it returns
is the contract's JSON. Here ownership is checked (another key's resources are 404), counts
and quotas are enforced, and the work is handed to ``envs`` (lifecycle) and ``versions``;
they reach the machine only through the node seam (``node``).

    service = Service(ctx)
    out = service.fork(owner, "env_...", EnvsCreate(count=4))   # {"version", "envs"}
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from denv.server import ids
from denv.server.db import iso, now
from denv.server.errors import ApiError, invalid, not_found
from denv.server.lifecycle.admission import Admitted
from denv.server.lifecycle.collect import Collector
from denv.server.lifecycle.context import Context
from denv.server.lifecycle.envs import Envs, Start
from denv.server.lifecycle.leases import Leases
from denv.server.lifecycle.live.forks import LiveForks
from denv.server.lifecycle.live.spill import live_share, spill_note
from denv.server.lifecycle.live.zygotes import Zygotes
from denv.server.lifecycle.pools.spares import pool_of
from denv.server.lifecycle.reconcile import reconcile
from denv.server.lifecycle.render import env_json, version_json, version_layers
from denv.server.lifecycle.requests import EnvsCreate, SandboxCreate, WaitFor
from denv.server.lifecycle.versions import Versions
from denv.server.node.errors import Refused, Unavailable
from denv.server.records import (
    ALL,
    FINAL,
    READY,
    UP,
    EnvDeletion,
    EnvRecord,
    EnvStatus,
    VersionRecord,
)

log = logging.getLogger(__name__)

WAIT_MARGIN_S = 30.0
# A fork of kind auto that cannot be live (the env's server runs threads of its own, or the
# children ask for an egress or env of their own) is a volume fork instead.
AUTO_VOLUME_CODES = frozenset({"fork_unsafe", "live_unsupported"})
WAIT_UNTIL: dict[str, frozenset[EnvStatus]] = {  # what a wait for each condition returns at
    "none": ALL,
    "running": UP | FINAL,
    "healthy": READY | FINAL,
    "deleted": frozenset({EnvStatus.DELETED}),
}


class Service:
    """Every operation of one server; each call blocks (routes run it in a thread)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.envs = Envs(ctx)
        self.versions = Versions(ctx)
        self.live = LiveForks(ctx, self.versions)
        self.leases = Leases(ctx, self.envs)
        self.collector = Collector(ctx, self.versions)
        self.zygotes = Zygotes(ctx, self.envs, self.versions, self.live)
        self.admit = self.envs.admit  # everything that can refuse, before anything is written

    # the server's life
    def reconcile(self) -> None:
        self.zygotes.delete_stored()
        reconcile(self.ctx, self.envs)
        self.leases.restart_grace()

    def shutdown(self) -> None:
        """Stop boots in flight and remove every warm spare (clean server exit)."""
        self.ctx.stopping.set()
        self.zygotes.shutdown()  # their processes first: their containers may hold envs
        self.ctx.node.stop()
        self.ctx.workers.shutdown(wait=False, cancel_futures=True)
        self.envs.warm.shutdown()

    def engine_version(self) -> str:
        return self.ctx.node.engine_version()

    # envs
    def owned_env(self, owner: str, env_id: str) -> EnvRecord:
        rec = self.ctx.store.get_env(env_id) if ids.is_id(env_id, "env") else None
        if rec is None or rec.owner != owner:
            raise not_found("env", env_id)
        return rec

    def states(self, env_id: str | None = None) -> dict[str, str] | None:
        try:
            return self.ctx.node.states(env_id)
        except Unavailable:
            return None  # engine down: report services as missing, do not fail envs

    def env_view(self, rec: EnvRecord, states: dict[str, str] | None) -> dict[str, Any]:
        if states is not None:
            rec = self.envs.observe(rec, states)
        version = self.ctx.store.get_version(rec.version_id, include_deleted=True)
        return env_json(
            rec, version, states or {}, self.ctx.config.public_url(), self.ctx.ingress_keys
        )

    def version_view(self, rec: VersionRecord) -> dict[str, Any]:
        return version_json(rec, self.ctx.node.layer_storage(version_layers(rec)))

    def get_env(self, owner: str, env_id: str) -> dict[str, Any]:
        rec = self.owned_env(owner, env_id)
        return self.env_view(rec, self._env_states(rec))

    def _env_states(self, rec: EnvRecord) -> dict[str, str] | None:
        """The states of the containers of ``rec`` (a live child: its group's container)."""
        return self.states(rec.runtime.live.group if rec.runtime.live else rec.id)

    def list_envs(
        self,
        owner: str,
        limit: int,
        cursor: str | None,
        status: EnvStatus | None,
        version_id: str | None,
        include_deleted: bool = False,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """A page of envs, newest first, and the cursor of the next (None at the end).

        Deleted envs only with `include_deleted` (or when `status` asks for them)."""
        recs = self.ctx.store.list_envs(
            owner, limit + 1, cursor, status, version_id, include_deleted
        )
        states = self.states()
        items = [self.env_view(r, states) for r in recs[:limit]]
        return items, recs[limit - 1].id if len(recs) > limit else None

    def delete_env(self, owner: str, env_id: str) -> None:
        self.envs.delete(self.owned_env(owner, env_id).id)

    def wait_env(self, owner: str, env_id: str, until: str, timeout_s: float) -> dict[str, Any]:
        rec = self.owned_env(owner, env_id)
        done = self.envs.wait(rec.id, WAIT_UNTIL[until], timeout_s)
        return self.env_view(done, self._env_states(done))

    def detach_env(self, owner: str, env_id: str) -> dict[str, Any]:
        """``POST /v1/envs/{id}/detach``: the env stays when its lease ends."""
        rec = self.owned_env(owner, env_id)
        self.leases.detach(rec)
        return self.get_env(owner, env_id)

    # leases
    def open_lease(self, owner: str, timeout_s: float | None) -> dict[str, Any]:
        return self.leases.view(self.leases.open(owner, timeout_s))

    def get_lease(self, owner: str, lease_id: str) -> dict[str, Any]:
        return self.leases.view(self.leases.get_owned(owner, lease_id))

    def renew_lease(self, owner: str, lease_id: str) -> dict[str, Any]:
        return self.leases.view(self.leases.renew(owner, lease_id))

    def close_lease(self, owner: str, lease_id: str) -> None:
        self.leases.close(owner, lease_id)

    def warm_pool(self, owner: str, env_id: str) -> dict[str, Any]:
        return self.envs.warm.status(self.owned_env(owner, env_id).id)

    def logs(self, owner: str, env_id: str, service: str | None, tail: int) -> dict[str, Any]:
        rec = self.owned_env(owner, env_id)
        name = service or rec.agent_service
        version = self.ctx.store.get_version(rec.version_id)
        if version is not None and name not in {s.name for s in version.services}:
            raise invalid(f"service: env {rec.id} has no service '{name}'", "service")
        return {"env_id": rec.id, "service": name, "lines": self.envs.logs(rec, name, tail)}

    def _wait_all(
        self, recs: list[EnvRecord], wait: WaitFor, timeout_s: float
    ) -> list[dict[str, Any]]:
        until = WAIT_UNTIL[wait]
        done = [self.envs.wait(r.id, until, timeout_s + WAIT_MARGIN_S) for r in recs]
        states = self.states()
        return [self.env_view(r, states) for r in done]

    # create, fork, snapshot, deploy
    def create_sandbox(self, owner: str, body: SandboxCreate) -> dict[str, Any]:
        """``POST /v1/sandboxes``: an implicit one-service version and ``count`` envs from it.

        Ready spares of the same configuration (a warm pool another env of this image asked
        for) are taken before booting; each env succeeds or fails on its own.
        """
        t_in = time.perf_counter()
        count = body.count or 1
        with self.admit.hold(owner, count) as hold:
            self.admit.version(owner)
            self.admit.image(body.image, "image")
            self.admit.disk(owner)
            lease_id = self.leases.holding(owner, body.lease_id)
            t0 = time.perf_counter()
            planned, facts = self.versions.implicit(owner, body)  # one image look, no record
            t1 = time.perf_counter()
            admitted = self.admit.sandbox(hold, planned, facts, body)
            live = admitted.live
            start = Start(body.labels, body.ttl_s, body.wait_timeout_s, lease_id)
            with self.ctx.pins.pin(owner):  # the version is needed once its envs are recorded
                if live:
                    t2 = time.perf_counter()
                    copied = self._from_zygote(admitted, planned, body, lease_id)
                    if copied is not None:
                        log.info(
                            "sandbox of %s from its zygote: checks %.1f ms, image look %.1f ms, "
                            "admission %.1f ms, copy %.1f ms",
                            body.image,
                            (t0 - t_in) * 1e3,
                            (t1 - t0) * 1e3,
                            (t2 - t1) * 1e3,
                            (time.perf_counter() - t2) * 1e3,
                        )
                        return copied
                version = self.versions.add(planned)
                recs = self.envs.create(admitted, version, start)
        if live:  # the first live create of this configuration boots; the next ones copy
            self.zygotes.leave_behind(owner, version, admitted.egress, recs[0].id)
        envs = self._wait_all(recs, body.wait, body.wait_timeout_s)
        if live and body.count is None:
            self._refuse_unsupported_live(owner, body.image, envs[0], version.id)
        return envs[0] if body.count is None else {"envs": envs}

    def _from_zygote(
        self,
        admitted: Admitted,
        planned: VersionRecord,
        body: SandboxCreate,
        lease_id: str | None,
    ) -> dict[str, Any] | None:
        """A live create answered by copies of the key's zygote (the answer), or None."""
        opts = EnvsCreate(
            count=body.count or 1,
            labels=body.labels,
            lease_id=lease_id,
            ttl_s=body.ttl_s,
            wait_timeout_s=body.wait_timeout_s,
        )
        recs = self.zygotes.copy(admitted, planned, opts, single=body.count is None)
        if recs is None:
            return None
        views = self._copies_view(recs)
        return views[0] if body.count is None else {"envs": views}

    def _copies_view(self, recs: list[EnvRecord]) -> list[dict[str, Any]]:
        # The copies run in the zygote's container, which ran them a moment ago.
        states = {cid: "running" for r in recs for cid in r.runtime.containers.values()}
        return [self.env_view(r, states) for r in recs]

    def _refuse_unsupported_live(
        self, owner: str, what: str, env: dict[str, Any], implicit_version: str | None = None
    ) -> None:
        """A live env whose server turned out not to be copyable (it says why once it serves):
        409, and nothing of it is left, its implicit version neither (a stored version
        stays). (With ``count``, each env fails on its own.)"""
        error = env.get("error") or {}
        if env.get("status") == "failed" and error.get("code") == "live_unsupported":
            why = f"its live create was refused (live_unsupported): {error['message']}"
            self.envs.delete(
                str(env["id"]), EnvDeletion(reason="server", message=why, at=iso(now()))
            )
            if implicit_version:
                self.versions.delete(owner, implicit_version)
            raise ApiError(
                409, "live_unsupported", f"{what} cannot run for live forks: {error['message']}"
            )

    def snapshot(self, owner: str, env_id: str, labels: dict[str, str]) -> dict[str, Any]:
        rec = self.owned_env(owner, env_id)
        self.admit.snapshot(owner, rec)
        return self.version_view(self.versions.snapshot(rec, labels, "snapshot"))

    def fork(self, owner: str, env_id: str, opts: EnvsCreate) -> dict[str, Any]:
        """One snapshot of the env, ``opts.count`` children started from it."""
        rec = self.owned_env(owner, env_id)
        if opts.live is not False:
            raise invalid(
                "live is for creating envs from a version; a fork's kind says how it forks "
                "(volume, live or auto)",
                "live",
            )
        opts = opts.model_copy(update={"lease_id": self.leases.holding(owner, opts.lease_id)})
        spill: str | None = None  # every child spills: its parent's node has no room
        if opts.kind == "live" or (opts.kind == "auto" and rec.runtime.live is not None):
            try:
                with self.admit.hold(owner, opts.count) as hold:
                    copied, admitted = self.admit.live_fork(hold, rec, opts)
                    live_n = live_share(self.ctx, rec, opts)  # the rest spill (a cluster's cap)
                    if live_n:
                        with self.ctx.pins.pin(owner):
                            some = opts.model_copy(update={"count": live_n})
                            version, children = self.live.fork(hold, rec, copied, some)
            except ApiError as exc:
                # auto: live where the env allows it. A server running threads of its own
                # (the gate saw them before any child existed) or a child's own egress or
                # env (which a copy cannot take) gets a volume fork instead.
                if opts.kind != "auto" or exc.code not in AUTO_VOLUME_CODES:
                    raise
                log.info("fork of %s (auto): %s; a volume fork instead", env_id, exc.message)
            else:
                if live_n:
                    # The children run in the parent's container, which ran their fork a
                    # moment ago: no round trip to the engine to say so.
                    states = {cid: "running" for cid in rec.runtime.containers.values()}
                    views = [self.env_view(r, states) for r in children]
                    if live_n < opts.count:
                        views += self._spill(owner, rec, version, children, opts, live_n)
                    return {"version": self.version_view(version), "envs": views}
                spill = spill_note(rec, 0, opts.count)
        parent = self.ctx.store.get_version(rec.version_id)
        t0 = time.perf_counter()
        with self.admit.hold(owner, opts.count) as hold:
            admitted = self.admit.fork(hold, rec, parent, opts)
            with self.ctx.pins.pin(owner):  # the fork's version, until its children are recorded
                version = self.versions.snapshot(rec, {}, "fork")
                t1 = time.perf_counter()
                if spill:  # a spilled child forks live too
                    admitted.live = "auto"
                recs = self.envs.create(admitted, version, Start.of(opts, spill))
        t2 = time.perf_counter()
        envs = self._wait_all(recs, opts.wait, opts.wait_timeout_s)
        log.info(
            "fork env %s into %d (%d warm): snapshot %.1f ms, create %.1f ms, wait %.1f ms",
            rec.id,
            len(recs),
            sum(r.start == "warm" for r in recs),
            (t1 - t0) * 1000,
            (t2 - t1) * 1000,
            (time.perf_counter() - t2) * 1000,
        )
        return {"version": self.version_view(version), "envs": envs}

    def _spill(
        self,
        owner: str,
        rec: EnvRecord,
        version: VersionRecord,
        children: list[EnvRecord],
        opts: EnvsCreate,
        live_n: int,
    ) -> list[dict[str, Any]]:
        """The children of a live fork that did not fit on its parent's node: a volume fork
        of the live children's version, placed on other nodes (``spill``), each booted live
        (``auto``) so that it forks live in turn. When they cannot be started, nothing of the
        fork is left: its live children and version go too."""
        rest = opts.model_copy(update={"count": opts.count - live_n})
        note = spill_note(rec, live_n, opts.count)
        try:
            with (
                self.admit.hold(owner, rest.count) as hold,
                self.ctx.pins.pin(owner, version.id),
            ):
                admitted = Admitted(hold, rest.count, rec.egress, "auto", 0)
                self.admit.fair(owner, pool_of(version, rec.egress, rest.env, owner), rest.count, 0)
                recs = self.envs.create(admitted, version, Start.of(rest, note))
        except BaseException:
            for child in children:
                self.envs.delete(child.id)
            with contextlib.suppress(ApiError, Refused):
                self.versions.delete(owner, version.id)
            raise
        log.info("fork of %s: %d live, %d spilled to a volume fork", rec.id, live_n, len(recs))
        return self._wait_all(recs, rest.wait, rest.wait_timeout_s)

    def create_from_version(self, owner: str, version_id: str, opts: EnvsCreate) -> dict[str, Any]:
        version = self.versions.get_owned(owner, version_id)
        self.leases.holding(owner, opts.lease_id)
        with self.admit.hold(owner, opts.count) as hold:
            self.admit.disk(owner)
            admitted = self.admit.from_version(hold, version, opts, self._version_egress(version))
            live = admitted.live
            with self.ctx.pins.pin(owner, version.id):
                # Looked up again under the pin: an expired version the collector deleted
                # meanwhile is 404; once pinned, it stays until the envs are recorded.
                version = self.versions.get_owned(owner, version.id)
                if live:  # a version started live before: a copy of its zygote
                    copied = self.zygotes.copy(
                        admitted, version, opts, single=opts.count == 1, of=opts.env
                    )
                    if copied is not None:
                        return {"envs": self._copies_view(copied)}
                recs = self.envs.create(admitted, version, Start.of(opts))
        if live:  # the first live create from this version boots; the next ones copy
            self.zygotes.leave_behind(owner, version, admitted.egress, recs[0].id, of=opts.env)
        envs = self._wait_all(recs, opts.wait, opts.wait_timeout_s)
        if live and len(envs) == 1:
            self._refuse_unsupported_live(owner, f"version {version.id}", envs[0])
        return {"envs": envs}

    def _version_egress(self, version: VersionRecord) -> str:
        """A version keeps the egress of the env it came from; deny otherwise."""
        store = self.ctx.store
        parent = store.get_env(version.parent_env_id) if version.parent_env_id else None
        return parent.egress if parent else "deny"

    def deploy(self, owner: str, name: str, compose: str, labels: dict[str, str]) -> dict[str, Any]:
        self.admit.version(owner)
        self.admit.disk(owner)
        return self.version_view(self.versions.deploy(owner, name, compose, labels))

    # versions and projects
    def get_version(self, owner: str, version_id: str) -> dict[str, Any]:
        return self.version_view(self.versions.get_owned(owner, version_id))

    def list_versions(
        self, owner: str, limit: int, cursor: str | None, project: str | None
    ) -> tuple[list[dict[str, Any]], str | None]:
        recs = self.ctx.store.list_versions(owner, limit + 1, cursor, project)
        items = [self.version_view(r) for r in recs[:limit]]
        return items, recs[limit - 1].id if len(recs) > limit else None

    def delete_version(self, owner: str, version_id: str) -> None:
        self.versions.delete(owner, version_id)

    def gc(self, owner: str) -> dict[str, Any]:
        """``POST /v1/gc``: delete the key's expired versions now (``collect``)."""
        freed = self.collector.collect(owner)
        return {
            "versions_deleted": freed.versions,
            "layers_deleted": freed.layers,
            "bytes_freed": freed.bytes,
        }

    def diff_versions(self, owner: str, base_id: str, version_id: str) -> dict[str, Any]:
        """``GET /v1/versions/{id}/diff?base=``: the files that differ, from the layers."""
        return self.versions.diff(
            self.versions.get_owned(owner, base_id), self.versions.get_owned(owner, version_id)
        )

    def list_projects(
        self, owner: str, limit: int, cursor: str | None
    ) -> tuple[list[dict[str, Any]], str | None]:
        rows = self.ctx.store.list_projects(owner, limit + 1, cursor)
        items = [
            {"name": n, "latest_version_id": v, "version_count": k, "created_at": t}
            for n, t, v, k in rows[:limit]
        ]
        return items, rows[limit - 1][0] if len(rows) > limit else None
