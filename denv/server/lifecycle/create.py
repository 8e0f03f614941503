"""Create verbs: ``POST /v1/sandboxes`` (an image's implicit version and its envs) and
``POST /v1/versions/{id}/envs`` (envs of a stored version); a live create is answered by a
copy of the key's zygote of that configuration when there is one, else boots and leaves
one behind."""

from __future__ import annotations

import logging
import time

from denv.server.db import iso, now
from denv.server.errors import ApiError
from denv.server.lifecycle.admission import Admitted
from denv.server.lifecycle.env_records import EnvOptions
from denv.server.lifecycle.parts import Verb
from denv.server.lifecycle.requests import EnvsCreate, SandboxCreate
from denv.server.lifecycle.shown import EnvShown, Made
from denv.server.records import EnvDeletion, EnvStatus, VersionRecord

log = logging.getLogger(__name__)


class Creates(Verb):
    """Creates of one server; each call blocks (routes run it in a thread)."""

    def sandbox(self, owner: str, body: SandboxCreate) -> Made:
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
            start = EnvOptions(body.labels, body.ttl_s, body.wait_timeout_s, lease_id)
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
        envs = self.views.wait_all(recs, body.wait, body.wait_timeout_s)
        if live and body.count is None:
            self._refuse_unsupported_live(owner, body.image, envs[0], version.id)
        return Made(envs, one=body.count is None)

    def _from_zygote(
        self,
        admitted: Admitted,
        planned: VersionRecord,
        body: SandboxCreate,
        lease_id: str | None,
    ) -> Made | None:
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
        return Made(self.views.copies(recs), one=body.count is None)

    def _refuse_unsupported_live(
        self, owner: str, what: str, env: EnvShown, implicit_version: str | None = None
    ) -> None:
        """A live env whose server turned out not to be copyable (it says why once it serves):
        409, and nothing of it is left, its implicit version neither (a stored version
        stays). (With ``count``, each env fails on its own.)"""
        rec, error = env.rec, env.rec.error
        if rec.status == EnvStatus.FAILED and error and error.code == "live_unsupported":
            why = f"its live create was refused (live_unsupported): {error.message}"
            self.envs.delete(rec.id, EnvDeletion(reason="server", message=why, at=iso(now())))
            if implicit_version:
                self.versions.delete(owner, implicit_version)
            raise ApiError(
                409, "live_unsupported", f"{what} cannot run for live forks: {error.message}"
            )

    def from_version(self, owner: str, version_id: str, opts: EnvsCreate) -> Made:
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
                        return Made(self.views.copies(copied))
                recs = self.envs.create(admitted, version, EnvOptions.of(opts))
        if live:  # the first live create from this version boots; the next ones copy
            self.zygotes.leave_behind(owner, version, admitted.egress, recs[0].id, of=opts.env)
        envs = self.views.wait_all(recs, opts.wait, opts.wait_timeout_s)
        if live and len(envs) == 1:
            self._refuse_unsupported_live(owner, f"version {version.id}", envs[0])
        return Made(envs)

    def _version_egress(self, version: VersionRecord) -> str:
        """A version keeps the egress of the env it came from; deny otherwise."""
        store = self.ctx.store
        parent = store.get_env(version.parent_env_id) if version.parent_env_id else None
        return parent.egress if parent else "deny"
