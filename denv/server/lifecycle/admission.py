"""Admission: everything that can refuse a request, in one place, before anything is written.

A create, fork, snapshot or deploy asks here first: the count per request, the key's env
quota, its starting and spare caps (fairness), its versions cap, its disk budget (``disk``),
the egress it asked for (parsed once, an allowlist resolved once) and whether the host
guard lets it out, the operator's image allowlist, and whether the image can run live. Only
then does the lifecycle record a version or an env, so a refused request leaves nothing behind.

Two checks run again when envs are recorded (``Envs.create``), under the quota lock that
makes "count, then insert" one step: the env quota and the starting cap. They are the same
functions (:func:`check_quota`, :func:`check_starting`), so both places refuse with one
message; the second run only catches a concurrent request that took the room meanwhile.

    admit = Admission(ctx, warm)
    egress = admit.fork(owner, parent_version, opts)   # or raises the ApiError to answer
"""

from __future__ import annotations

from denv.server.config import MAX_COUNT
from denv.server.errors import ApiError
from denv.server.lifecycle.context import Context
from denv.server.lifecycle.disk import check_disk
from denv.server.lifecycle.fairness import over_quota, throttled
from denv.server.lifecycle.images import check_allowed
from denv.server.lifecycle.limits import check_volume_sizes
from denv.server.lifecycle.pools.spares import PoolOf, pool_of
from denv.server.lifecycle.pools.warm import WarmPools
from denv.server.lifecycle.requests import Egress, LiveStart, SandboxCreate
from denv.server.node.egress import from_request as egress_from_request
from denv.server.node.live import unsupported_reason as live_reason
from denv.server.node.seam import ImageFacts
from denv.server.records import READY, EnvRecord, EnvStatus, VersionRecord


def check_quota(ctx: Context, owner: str, count: int) -> None:
    """429 ``quota_exceeded`` when ``count`` more envs pass ``--max-envs-per-key``."""
    limit = ctx.config.max_envs_per_key
    live = ctx.store.count_live(owner)
    if live + count > limit:
        raise ApiError(
            429,
            "quota_exceeded",
            f"this API key has {live} live env(s); {count} more would pass the "
            f"limit of {limit}: delete envs you no longer need",
        )


def check_starting(ctx: Context, owner: str, count: int) -> None:
    """429 ``rate_limited`` past ``--max-starting-per-key``.

    A request larger than the starting cap is let through when none of the key's envs is
    starting, so a fork of up to ``MAX_COUNT`` still runs on a quiet key."""
    cap = ctx.config.max_starting_per_key
    starting = ctx.store.count_starting(owner) if cap else 0
    if starting and starting + count > cap:
        raise throttled("starting", starting, cap)


def live_unsupported(rec: EnvRecord) -> str | None:
    """Why ``rec`` cannot be live-forked now, or None."""
    if rec.runtime.live is None:
        if rec.runtime.live_unsupported:
            return f"env {rec.id}'s server cannot be copied: {rec.runtime.live_unsupported}"
        if rec.spec.live and rec.status == EnvStatus.FAILED:
            why = f" ({rec.error.code}: {rec.error.message})" if rec.error else ""
            return f"env {rec.id} failed{why}"
        if rec.spec.live and rec.status not in READY:
            return f"env {rec.id} is {rec.status}: its server is not up yet"
        return f"env {rec.id} was not created with live: true"
    if rec.status not in READY:
        return f"env {rec.id} is {rec.status}"
    return None


def _egress_name(egress: str) -> str:
    """deny, allow, or "an allowlist" (a record keeps an allowlist as its JSON)."""
    return egress if egress in ("deny", "allow") else "an allowlist"


def refuse_live(reason: str) -> ApiError:
    return ApiError(
        409,
        "live_unsupported",
        f"a live fork is not possible: {reason}. Fork with kind: volume instead (its "
        "children boot from a snapshot of /work), or create the env with live: true",
    )


class Admission:
    """The checks of one server; each method raises the ``ApiError`` to answer, or returns
    what the request resolved to (its egress as a record keeps it)."""

    def __init__(self, ctx: Context, warm: WarmPools) -> None:
        self.ctx = ctx
        self.warm = warm

    # the parts
    def count(self, owner: str, count: int) -> None:
        """422 past ``MAX_COUNT`` envs per request; 429 past the key's env quota."""
        if count > MAX_COUNT:
            raise ApiError(
                422,
                "limit_exceeded",
                f"count {count} is above the limit of {MAX_COUNT} envs per request: "
                "make several requests",
                {"path": "count"},
            )
        check_quota(self.ctx, owner, count)

    def version(self, owner: str) -> None:
        """429 ``quota_exceeded`` when one more version would pass --max-versions-per-key."""
        cap = self.ctx.config.max_versions_per_key
        held = self.ctx.store.count_versions(owner) if cap else 0
        if cap and held >= cap:
            raise over_quota(
                "versions",
                f"this API key has {held} versions, the server's limit is {cap} "
                "(--max-versions-per-key): delete versions you no longer need "
                "(DELETE /v1/versions/{id})",
                cap,
            )

    def egress(self, value: Egress | None, default: str) -> str:
        """A request's egress as a record's string (``default`` when it names none): an
        allowlist is checked and resolved here, once; 503 for an env that may open
        connections while the egress rules are missing."""
        if value is None:
            text = default
        else:
            text = egress_from_request(
                value if isinstance(value, str) else value.allow,
                allow_private=self.ctx.config.allow_private_egress,
            )
        if text != "deny":
            unsafe = self.ctx.host_guard.egress_unsafe()
            if unsafe:
                raise ApiError(503, "engine_unavailable", unsafe)
        return text

    def fair(self, owner: str, pool: PoolOf, count: int, warm: int) -> None:
        """The key's starting envs and warm spares within their caps (``fairness``), or 429."""
        check_starting(self.ctx, owner, count)
        if warm:
            self.warm.check_spares(owner, pool, warm)

    def image(self, image: str, path: str) -> None:
        """422 for an image the operator's ``--allow-image`` list does not admit."""
        check_allowed(image, self.ctx.config.allow_images, path)

    def live(self, image: str, version: VersionRecord) -> None:
        """409 ``live_unsupported`` for an env that cannot run under the live launcher."""
        reason = live_reason(len(version.services))
        if reason is not None:
            raise ApiError(
                409,
                "live_unsupported",
                f"{image} cannot run for live forks: {reason}. Create it without "
                "live (its forks then boot from a snapshot of /work: kind volume)",
            )

    # the requests
    def fork(
        self,
        owner: str,
        rec: EnvRecord,
        parent: VersionRecord | None,
        egress: Egress | None,
        env: dict[str, str],
        count: int,
        warm: int,
    ) -> str:
        """A volume fork of ``rec`` into ``count`` children (counts, caps, egress, the sizes of
        the volumes it snapshots): their egress, once admitted."""
        self.count(owner, count)
        self.version(owner)
        resolved = self.egress(egress, rec.egress)
        if parent is not None:  # the children's caps, before the snapshot is made
            self.fair(owner, pool_of(parent, resolved, env, owner), count, warm)
        check_disk(self.ctx, owner, check_volume_sizes(self.ctx, rec))
        return resolved

    def live_fork(
        self, owner: str, rec: EnvRecord, egress: Egress | None, env: dict[str, str], count: int
    ) -> VersionRecord:
        """A live fork of ``rec``: 409 ``live_unsupported`` naming why it cannot be one, else
        the version its children copy (a live child keeps its parent's network namespace
        and process environment, so it cannot take another egress or env)."""
        self.count(owner, count)
        self.version(owner)
        # Only an egress asked for is checked: the children stay in the parent's namespace.
        asked = rec.egress if egress is None else self.egress(egress, rec.egress)
        reason = live_unsupported(rec)
        if reason is not None:
            raise refuse_live(reason)
        parent = self.ctx.store.get_version(rec.version_id)
        if parent is None:
            raise ApiError(409, "conflict", f"the version of env {rec.id} is gone")
        if asked != rec.egress:
            raise refuse_live(
                f"a live child runs in its parent's network namespace, so it keeps the "
                f"parent's egress ({_egress_name(rec.egress)}), not {_egress_name(asked)}"
            )
        if env:
            raise refuse_live("a live child keeps its parent's process environment (env)")
        check_disk(self.ctx, owner, check_volume_sizes(self.ctx, rec))  # what it captures
        return parent

    def live_start(
        self, what: str, version: VersionRecord, live: LiveStart, warm: int
    ) -> LiveStart:
        """How a create's envs start: ``live`` as asked, with ``auto`` resolved. ``auto``
        starts without the launcher where the request asks for spares (they serve volume
        forks) or the version cannot run live (several services); ``true`` there is 409."""
        if live == "auto":
            return False if warm or live_reason(len(version.services)) else "auto"
        if live:
            self.live(what, version)
        return live

    def sandbox(
        self, owner: str, version: VersionRecord, facts: ImageFacts, body: SandboxCreate
    ) -> tuple[str, LiveStart]:
        """``POST /v1/sandboxes`` on its (not yet recorded) implicit version: its egress
        and how its envs start (``live_start``)."""
        count = body.count or 1
        egress = self.egress(body.egress, "deny")
        live = self.live_start(body.image, version, body.live, body.warm)
        self.fair(owner, pool_of(version, egress, {}, owner), count, 0 if live else body.warm)
        return egress, live

    def snapshot(self, owner: str, rec: EnvRecord) -> None:
        """A snapshot of ``rec``: the versions cap, its volumes' sizes and the disk budget."""
        self.version(owner)
        check_disk(self.ctx, owner, check_volume_sizes(self.ctx, rec))

    def disk(self, owner: str) -> None:
        """A create or deploy: 507 past the key's disk quota or below the server's floor."""
        check_disk(self.ctx, owner)
