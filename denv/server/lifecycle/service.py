"""The server's operations behind the contract: create, fork, snapshot, deploy, and the rest.

Routes (``api.routes``) parse HTTP and call one method here on a worker thread; what it
returns is a record as the API shows it (``shown``), which the API renders as JSON
(``api.render``). Here ownership is checked (another key's resources are 404), counts and
quotas are enforced, and the work is handed to ``envs`` (lifecycle) and ``versions``; they
reach the machine only through the node seam (``node``).

    service = Service(ctx)
    made = service.fork(owner, "env_...", EnvsCreate(count=4))   # Made: version, envs
"""

from __future__ import annotations

import logging

from denv.server.errors import invalid
from denv.server.lifecycle.collect import Collector, Freed
from denv.server.lifecycle.context import Context
from denv.server.lifecycle.create import Creates
from denv.server.lifecycle.envs import Envs
from denv.server.lifecycle.fork import Forks
from denv.server.lifecycle.leases import Leases
from denv.server.lifecycle.live.forks import LiveForks
from denv.server.lifecycle.live.zygotes import Zygotes
from denv.server.lifecycle.parts import WAIT_UNTIL, Parts, Views
from denv.server.lifecycle.reconcile import reconcile
from denv.server.lifecycle.requests import EnvsCreate, SandboxCreate
from denv.server.lifecycle.shown import (
    EnvShown,
    LeaseShown,
    Logs,
    Made,
    Page,
    PoolShown,
    Project,
    VersionDiff,
    VersionShown,
)
from denv.server.lifecycle.versions import Versions
from denv.server.records import (
    EnvRecord,
    EnvStatus,
)

log = logging.getLogger(__name__)


class Service:
    """Every operation of one server; each call blocks (routes run it in a thread). The
    verbs that make envs are rooms of their own (``create``, ``fork``); the rest are here."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.envs = Envs(ctx)
        self.versions = Versions(ctx)
        self.live = LiveForks(ctx, self.versions)
        self.leases = Leases(ctx, self.envs)
        self.collector = Collector(ctx, self.versions)
        self.zygotes = Zygotes(ctx, self.envs, self.versions, self.live)
        self.admit = self.envs.admit  # everything that can refuse, before anything is written
        self.views = Views(ctx, self.envs)
        parts = Parts(
            ctx, self.envs, self.versions, self.live, self.leases, self.zygotes, self.views
        )
        self.creates, self.forks = Creates(parts), Forks(parts)

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
        return self.views.owned_env(owner, env_id)

    def get_env(self, owner: str, env_id: str) -> EnvShown:
        rec = self.owned_env(owner, env_id)
        return self.views.env(rec, self.views.env_states(rec))

    def list_envs(
        self,
        owner: str,
        limit: int,
        cursor: str | None,
        status: EnvStatus | None,
        version_id: str | None,
        include_deleted: bool = False,
    ) -> Page[EnvShown]:
        """A page of envs, newest first, and the cursor of the next (None at the end).

        Deleted envs only with `include_deleted` (or when `status` asks for them)."""
        recs = self.ctx.store.list_envs(
            owner, limit + 1, cursor, status, version_id, include_deleted
        )
        states = self.views.states()
        items = [self.views.env(r, states) for r in recs[:limit]]
        return Page(items, recs[limit - 1].id if len(recs) > limit else None)

    def delete_env(self, owner: str, env_id: str) -> None:
        self.envs.delete(self.owned_env(owner, env_id).id)

    def wait_env(self, owner: str, env_id: str, until: str, timeout_s: float) -> EnvShown:
        rec = self.owned_env(owner, env_id)
        done = self.envs.wait(rec.id, WAIT_UNTIL[until], timeout_s)
        return self.views.env(done, self.views.env_states(done))

    def detach_env(self, owner: str, env_id: str) -> EnvShown:
        """``POST /v1/envs/{id}/detach``: the env stays when its lease ends."""
        rec = self.owned_env(owner, env_id)
        self.leases.detach(rec)
        return self.get_env(owner, env_id)

    # leases
    def open_lease(self, owner: str, timeout_s: float | None) -> LeaseShown:
        return self.leases.view(self.leases.open(owner, timeout_s))

    def get_lease(self, owner: str, lease_id: str) -> LeaseShown:
        return self.leases.view(self.leases.get_owned(owner, lease_id))

    def renew_lease(self, owner: str, lease_id: str) -> LeaseShown:
        return self.leases.view(self.leases.renew(owner, lease_id))

    def close_lease(self, owner: str, lease_id: str) -> None:
        self.leases.close(owner, lease_id)

    def warm_pool(self, owner: str, env_id: str) -> PoolShown:
        return self.envs.warm.status(self.owned_env(owner, env_id).id)

    def logs(self, owner: str, env_id: str, service: str | None, tail: int) -> Logs:
        rec = self.owned_env(owner, env_id)
        name = service or rec.agent_service
        version = self.ctx.store.get_version(rec.version_id)
        if version is not None and name not in {s.name for s in version.services}:
            raise invalid(f"service: env {rec.id} has no service '{name}'", "service")
        return Logs(rec.id, name, self.envs.logs(rec, name, tail))

    # create, fork, snapshot, deploy
    def create_sandbox(self, owner: str, body: SandboxCreate) -> Made:
        """``POST /v1/sandboxes``: an implicit one-service version and ``count`` envs from it
        (``create.Creates.sandbox``)."""
        return self.creates.sandbox(owner, body)

    def create_from_version(self, owner: str, version_id: str, opts: EnvsCreate) -> Made:
        """``POST /v1/versions/{id}/envs`` (``create.Creates.from_version``)."""
        return self.creates.from_version(owner, version_id, opts)

    def fork(self, owner: str, env_id: str, opts: EnvsCreate) -> Made:
        """One snapshot of the env, ``opts.count`` children started from it (``fork``)."""
        return self.forks.fork(owner, env_id, opts)

    def snapshot(self, owner: str, env_id: str, labels: dict[str, str]) -> VersionShown:
        rec = self.owned_env(owner, env_id)
        self.admit.snapshot(owner, rec)
        return self.views.version(self.versions.snapshot(rec, labels, "snapshot"))

    def deploy(self, owner: str, name: str, compose: str, labels: dict[str, str]) -> VersionShown:
        self.admit.version(owner)
        self.admit.disk(owner)
        return self.views.version(self.versions.deploy(owner, name, compose, labels))

    # versions and projects
    def get_version(self, owner: str, version_id: str) -> VersionShown:
        return self.views.version(self.versions.get_owned(owner, version_id))

    def list_versions(
        self, owner: str, limit: int, cursor: str | None, project: str | None
    ) -> Page[VersionShown]:
        recs = self.ctx.store.list_versions(owner, limit + 1, cursor, project)
        items = [self.views.version(r) for r in recs[:limit]]
        return Page(items, recs[limit - 1].id if len(recs) > limit else None)

    def delete_version(self, owner: str, version_id: str) -> None:
        self.versions.delete(owner, version_id)

    def gc(self, owner: str) -> Freed:
        """``POST /v1/gc``: delete the key's expired versions now (``collect``)."""
        return self.collector.collect(owner)

    def diff_versions(self, owner: str, base_id: str, version_id: str) -> VersionDiff:
        """``GET /v1/versions/{id}/diff?base=``: the files that differ, from the layers."""
        return self.versions.diff(
            self.versions.get_owned(owner, base_id), self.versions.get_owned(owner, version_id)
        )

    def list_projects(self, owner: str, limit: int, cursor: str | None) -> Page[Project]:
        rows = self.ctx.store.list_projects(owner, limit + 1, cursor)
        items = [Project(n, v, k, t) for n, t, v, k in rows[:limit]]
        return Page(items, rows[limit - 1][0] if len(rows) > limit else None)
