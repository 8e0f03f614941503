"""Admission: everything that can refuse a request, in one place, before anything is written.

A create, fork, snapshot or deploy asks here first: the count per request, the key's env
quota, its starting and spare caps (fairness), its versions cap, its disk budget (``disk``),
the egress it asked for (parsed once, an allowlist resolved once) and whether the host
guard lets it out, the operator's image allowlist, and whether the image can run live. Only
then does the lifecycle record a version or an env, so a refused request leaves nothing behind.

The env quota and the starting cap are checked once: the envs a request is let through
for are *held* (``holds``) in the same step, so a concurrent request of the same key counts
them, and the hold is handed over when they are recorded. What a request resolved to
(its egress parsed once, how its envs start, its warm pool, the hold) is one value,
``Admitted``, which the verb carries to where the envs are recorded (``Envs.create``,
``LiveForks``). Only a cluster's room is looked at again there: it depends on the spares the
create takes.

    admit = Admission(ctx, warm)
    with admit.hold(owner, opts.count) as hold:              # the key's quota: 429, or held
        admitted = admit.fork(hold, rec, parent_version, opts)   # or the ApiError
        version = versions.snapshot(rec, {}, "fork")
        envs.create(admitted, version, EnvOptions.of(opts))      # hands the hold over
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import TracebackType

from denv.server.config import MAX_COUNT
from denv.server.errors import ApiError
from denv.server.lifecycle.context import Context
from denv.server.lifecycle.disk import check_disk
from denv.server.lifecycle.fairness import over_quota, throttled
from denv.server.lifecycle.holds import Hold
from denv.server.lifecycle.image_allowlist import check_allowed
from denv.server.lifecycle.limits import check_volume_sizes
from denv.server.lifecycle.pools.spares import PoolOf, pool_of
from denv.server.lifecycle.pools.warm import WarmPools
from denv.server.lifecycle.requests import Egress, EnvsCreate, LiveStart, SandboxCreate
from denv.server.node.egress import from_request as egress_from_request
from denv.server.node.live import unsupported_reason as live_reason
from denv.server.node.seam import ImageFacts
from denv.server.records import READY, EnvRecord, EnvStatus, VersionRecord


def check_quota(ctx: Context, owner: str, count: int) -> None:
    """429 ``quota_exceeded`` when ``count`` more envs pass ``--max-envs-per-key`` (the
    key's envs held by requests in flight count as its own)."""
    limit = ctx.config.max_envs_per_key
    live = ctx.store.count_existing(owner) + ctx.holds.held(owner)
    if live + count > limit:
        raise ApiError(
            429,
            "quota_exceeded",
            f"this API key has {live} env(s); {count} more would pass the "
            f"limit of {limit}: delete envs you no longer need",
        )


def check_starting(ctx: Context, owner: str, count: int, own: int = 0) -> None:
    """429 ``rate_limited`` past ``--max-starting-per-key``; envs held by other requests of
    the key count as starting (``own``: those this request holds itself).

    A request larger than the starting cap is let through when none of the key's envs is
    starting, so a fork of up to ``MAX_COUNT`` still runs on a quiet key."""
    cap = ctx.config.max_starting_per_key
    starting = ctx.store.count_starting(owner) + ctx.holds.held(owner) - own if cap else 0
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


def no_room(room: int, count: int) -> ApiError:
    """A cluster's nodes, under their caps, have room for fewer envs than asked."""
    return ApiError(
        429,
        "rate_limited",
        f"the cluster's nodes have room for {room} more env(s) and {count} were "
        "asked for: retry later, delete envs, or add nodes (denv serve "
        "--node-max-envs / --node-max-memory set each node's cap)",
        {"limit": "cluster", "room": room, "asked": count, "retry_after_s": 5},
    )


def refuse_live(reason: str) -> ApiError:
    return ApiError(
        409,
        "live_unsupported",
        f"a live fork is not possible: {reason}. Fork with kind: volume instead (its "
        "children boot from a snapshot of /work), or create the env with live: true",
    )


@dataclass
class Admitted:
    """What a request resolved to once admitted: ``count`` envs held for their key (``hold``),
    their egress as a record keeps it, how they start (``live``), the spares they ask for
    (``warm``, of ``pool``) and their process environment. A ``with`` block lets go of
    whatever is still held when the request ends."""

    hold: Hold
    count: int
    egress: str
    live: LiveStart = False
    warm: int = 0
    env: dict[str, str] = field(default_factory=dict)

    @property
    def owner(self) -> str:
        return self.hold.owner

    def __enter__(self) -> Admitted:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.hold.release()


class Admission:
    """The checks of one server; each method raises the ``ApiError`` to answer, or returns
    what the request resolved to (its egress as a record keeps it)."""

    def __init__(self, ctx: Context, warm: WarmPools) -> None:
        self.ctx = ctx
        self.warm = warm

    # the parts
    def hold(self, owner: str, count: int) -> Hold:
        """422 past ``MAX_COUNT`` envs per request; 429 past the key's env quota; else the
        ``count`` envs held for ``owner`` until they are recorded or the request ends."""
        if count > MAX_COUNT:
            raise ApiError(
                422,
                "limit_exceeded",
                f"count {count} is above the limit of {MAX_COUNT} envs per request: "
                "make several requests",
                {"path": "count"},
            )
        with self.ctx.quota_lock:
            check_quota(self.ctx, owner, count)
            return self.ctx.holds.take(self.ctx.quota_lock, owner, count)

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
        """The key's starting envs and warm spares within their caps (``fairness``), or 429;
        ``count`` envs held by this request."""
        check_starting(self.ctx, owner, count, own=count)
        if warm:
            self.spares_possible()
            self.warm.check_spares(owner, pool, warm)

    def spares_possible(self) -> None:
        """409 for warm spares where the node cannot keep them (``Abilities.spares``)."""
        why = self.ctx.abilities.spares
        if why is not None:
            raise ApiError(
                409,
                "conflict",
                f"warm spares are not available: {why}. Ask without warm (envs and forks "
                "boot cold; docs/isolation.md)",
            )

    def room(self, count: int, pool: PoolOf | None) -> None:
        """429 when a cluster's nodes have no room for ``count`` more envs, less the spares
        of ``pool`` that can take some of them (looked at again when they are recorded)."""
        room = self.ctx.node.room()  # a cluster's nodes under their caps; None: no cap
        if room is None:
            return
        spares = self.warm.available(pool) if pool is not None else 0
        if count - spares > room:
            raise no_room(room, count)

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

    # the requests: each takes the hold its verb took first (``hold``) and returns what
    # the request resolved to; a refusal leaves nothing written (the verb lets go of the hold)
    def fork(
        self, hold: Hold, rec: EnvRecord, parent: VersionRecord | None, opts: EnvsCreate
    ) -> Admitted:
        """A fork of ``rec`` into ``opts.count`` children, whatever its kind: the checks every
        kind shares, once (the versions cap, the egress asked for, the sizes of the volumes
        it captures), then how it forks. ``live`` True: a live fork (kind ``live``, or
        ``auto`` where the env and the request allow one; ``live`` asked where they do not
        is 409 naming why); else a volume fork (``volume_fork``)."""
        owner = hold.owner
        self.version(owner)
        # A live child stays in its parent's namespace: only an egress asked for is checked.
        asked = rec.egress if opts.egress is None else self.egress(opts.egress, rec.egress)
        check_disk(self.ctx, owner, check_volume_sizes(self.ctx, rec))  # what it captures
        if opts.kind == "volume" or (opts.kind == "auto" and rec.runtime.live is None):
            return self.volume_fork(hold, rec, parent, opts, asked)
        reason = self.not_live(rec, parent, asked, opts)
        if reason is None:
            return Admitted(hold, opts.count, rec.egress, True)
        if opts.kind == "live":
            raise refuse_live(reason)
        return self.volume_fork(hold, rec, parent, opts, asked)  # auto: a volume fork

    def not_live(
        self, rec: EnvRecord, parent: VersionRecord | None, asked: str, opts: EnvsCreate
    ) -> str | None:
        """Why the fork of ``rec`` cannot be live, or None (a live child keeps its parent's
        network namespace and process environment, so it cannot take another egress or
        env); 409 ``conflict`` when its version is gone (of any kind of fork that would be
        live: not a reason an ``auto`` fork boots from a snapshot instead)."""
        reason = live_unsupported(rec)
        if reason is not None:
            return reason
        if parent is None:
            raise ApiError(409, "conflict", f"the version of env {rec.id} is gone")
        if asked != rec.egress:
            return (
                f"a live child runs in its parent's network namespace, so it keeps the "
                f"parent's egress ({_egress_name(rec.egress)}), not {_egress_name(asked)}"
            )
        if opts.env:
            return "a live child keeps its parent's process environment (env)"
        return None

    def volume_fork(
        self,
        hold: Hold,
        rec: EnvRecord,
        parent: VersionRecord | None,
        opts: EnvsCreate,
        asked: str,
    ) -> Admitted:
        """What a volume fork checks besides ``fork``'s: the host guard for the egress its
        children get (``asked``, the parent's when none is), their spares, starting cap and
        room (a live fork of kind ``auto`` that its launcher refused comes here too)."""
        owner, count = hold.owner, opts.count
        egress = self.egress(None, asked) if opts.egress is None else asked
        if opts.warm:
            self.spares_possible()
        if parent is not None:  # the children's caps, before the snapshot is made
            pool = pool_of(parent, egress, opts.env, owner)
            self.fair(owner, pool, count, opts.warm)
            self.room(count, pool)
        return Admitted(hold, count, egress, False, opts.warm, dict(opts.env))

    def started(
        self, hold: Hold, version: VersionRecord, egress: str, live: LiveStart, env: dict[str, str]
    ) -> Admitted:
        """Envs the server starts itself on behalf of what was admitted already (a live
        fork's children that spill to other nodes, a zygote): the key's starting cap, then
        their ``Admitted`` (no spares)."""
        self.fair(hold.owner, pool_of(version, egress, env, hold.owner), hold.count, 0)
        return Admitted(hold, hold.count, egress, live, 0, dict(env))

    def live_start(
        self, what: str, version: VersionRecord, live: LiveStart, warm: int
    ) -> LiveStart:
        """How a create's envs start: ``live`` as asked, with ``auto`` resolved. ``auto``
        starts without the launcher where the request asks for spares (they serve volume
        forks) or the version cannot run live (several services); ``true`` there is 409."""
        why = self.ctx.abilities.live  # the node runs no env live (``Abilities.live``)
        if why is not None:
            if live is True:
                raise ApiError(
                    409,
                    "live_unsupported",
                    f"{what} cannot run for live forks: {why}. Create it without live (its "
                    "forks then boot from a snapshot of /work: kind volume)",
                )
            return False
        if live == "auto":
            return False if warm or live_reason(len(version.services)) else "auto"
        if live:
            self.live(what, version)
        return live

    def sandbox(
        self, hold: Hold, version: VersionRecord, facts: ImageFacts, body: SandboxCreate
    ) -> Admitted:
        """``POST /v1/sandboxes`` on its (not yet recorded) implicit version: its egress,
        how its envs start (``live_start``), their caps and room."""
        count = body.count or 1
        egress = self.egress(body.egress, "deny")
        live = self.live_start(body.image, version, body.live, body.warm)
        warm = 0 if live else body.warm
        pool = pool_of(version, egress, {}, hold.owner)
        self.fair(hold.owner, pool, count, warm)
        self.room(count, None if live else pool)
        return Admitted(hold, count, egress, live, warm)

    def from_version(
        self, hold: Hold, version: VersionRecord, opts: EnvsCreate, default_egress: str
    ) -> Admitted:
        """``POST /v1/versions/{id}/envs``: how its envs start, their egress (the version's
        env's unless asked), their caps and room."""
        live = self.live_start(f"version {version.id}", version, opts.live, opts.warm)
        egress = self.egress(opts.egress, default_egress)
        warm = 0 if live else opts.warm
        pool = pool_of(version, egress, opts.env, hold.owner)
        self.fair(hold.owner, pool, opts.count, warm)
        self.room(opts.count, None if live else pool)
        return Admitted(hold, opts.count, egress, live, warm, dict(opts.env))

    def snapshot(self, owner: str, rec: EnvRecord) -> None:
        """A snapshot of ``rec``: the versions cap, its volumes' sizes and the disk budget."""
        self.version(owner)
        check_disk(self.ctx, owner, check_volume_sizes(self.ctx, rec))

    def disk(self, owner: str) -> None:
        """A create or deploy: 507 past the key's disk quota or below the server's floor."""
        check_disk(self.ctx, owner)
