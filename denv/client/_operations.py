"""Every facade operation, defined once for `Denv` and `AsyncDenv`: its public signature
(names, keyword-only arguments, defaults), its docstring and the call it makes.

An operation is a `Call`: the generated operation module, the arguments to send, how its
answer becomes a value, and how long the server may rightly take. A list is a `Listing`: the
call for one page. `denv.client._binding` makes each operation a method of both facades
(`Denv.create_sandbox = sync_call(ops.create_sandbox)`): `Denv` runs the call with the
module's `sync_detailed`, `AsyncDenv` awaits its `asyncio_detailed`; neither restates an
operation's parameters or docstring.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeAlias, TypeVar

import attrs
from denv_api_client.api.envs import delete_env as delete_env_op
from denv_api_client.api.envs import detach_env as detach_env_op
from denv_api_client.api.envs import fork_env as fork_env_op
from denv_api_client.api.envs import get_env as get_env_op
from denv_api_client.api.envs import get_env_logs as get_env_logs_op
from denv_api_client.api.envs import get_warm_pool as get_warm_pool_op
from denv_api_client.api.envs import list_envs as list_envs_op
from denv_api_client.api.envs import snapshot_env as snapshot_env_op
from denv_api_client.api.envs import wait_env as wait_env_op
from denv_api_client.api.health import get_health as get_health_op
from denv_api_client.api.leases import close_lease as close_lease_op
from denv_api_client.api.leases import get_lease as get_lease_op
from denv_api_client.api.leases import open_lease as open_lease_op
from denv_api_client.api.leases import renew_lease as renew_lease_op
from denv_api_client.api.projects import deploy_project as deploy_project_op
from denv_api_client.api.projects import list_projects as list_projects_op
from denv_api_client.api.sandboxes import create_sandbox as create_sandbox_op
from denv_api_client.api.versions import collect_versions as collect_versions_op
from denv_api_client.api.versions import create_envs_from_version as envs_from_version_op
from denv_api_client.api.versions import delete_version as delete_version_op
from denv_api_client.api.versions import diff_versions as diff_versions_op
from denv_api_client.api.versions import get_version as get_version_op
from denv_api_client.api.versions import list_versions as list_versions_op
from denv_api_client.models import (
    DeployRequest,
    EnvsCreateKind,
    EnvStatus,
    LiveAuto,
    SandboxCreate,
    SnapshotRequest,
    WaitRequest,
    WaitRequestUntil,
)
from denv_api_client.models.lease_create import LeaseCreate
from denv_api_client.types import UNSET, Response, Unset

from . import _config
from ._http import unwrap, unwrap_empty
from ._requests import (
    EgressArg,
    Page,
    StatusArg,
    UntilArg,
    WaitArg,
    egress_body,
    env_vars_body,
    envs_create,
    labels_body,
    new_idempotency_key,
    opt,
    wait_body,
)
from .types import Collected, Env, Fork, Health, Lease, Project, Version, VersionDiff, WarmPool

ForkKind = Literal["volume", "live", "auto"]
LiveArg = bool | Literal["auto"]

T = TypeVar("T")


class Operation(Protocol):
    """A generated operation module (`denv_api_client.api.<tag>.<operation>`)."""

    @property
    def sync_detailed(self) -> Callable[..., Response[Any]]: ...
    @property
    def asyncio_detailed(self) -> Callable[..., Any]: ...


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API call, ready to send; `result` turns its answer into the facade's value.

    `wait_s`: how long the server may rightly wait before answering (a long-poll), added to
    the client's timeout; `idempotent=True` marks a POST that is safe to retry. `holds=True`:
    the call creates envs, which the client's lease holds (its body gets the `lease_id`).
    """

    operation: Operation
    result: Callable[[Response[Any]], T]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    wait_s: float | None = None
    idempotent: bool | None = None
    holds: bool = False


@dataclass(frozen=True)
class Listing(Generic[T]):
    """A list, one page a call: `page(cursor, limit)`, each item turned by `convert`."""

    page: Callable[[str | Unset, int], Call[Page[Any]]]
    convert: Callable[[Any], T]


#: Several calls, each depending on the answer before it (see `denv.client._lineage`): a
#: generator that yields each call, is sent its value (or thrown its error), and returns `T`.
Plan: TypeAlias = Generator[Call[Any], Any, T]


def _value(convert: Callable[[Any], T]) -> Callable[[Response[Any]], T]:
    return lambda res: convert(unwrap(res))


def _page(res: Response[Any]) -> Page[Any]:
    page: Page[Any] = unwrap(res)
    return page


def _create_wait_s(wait: WaitArg, wait_timeout_s: float | None) -> float | None:
    """A create that waits for its envs is a long-poll of `wait_timeout_s`."""
    if str(wait) == "none":
        return None
    return wait_timeout_s if wait_timeout_s is not None else _config.DEFAULT_CREATE_WAIT_TIMEOUT_S


# -- server


def health() -> Call[Health]:
    """The server's status and versions (needs no key)."""
    return Call(get_health_op, _value(Health.from_api))


# -- envs


def create_sandbox(
    image: str,
    *,
    ports: Sequence[int] | None = None,
    env: Mapping[str, str] | None = None,
    egress: EgressArg = "deny",
    command: Sequence[str] | None = None,
    volumes: Sequence[str] | None = None,
    labels: Mapping[str, str] | None = None,
    ttl_s: int | None = None,
    wait: WaitArg = "healthy",
    wait_timeout_s: float | None = None,
    health_path: str | None = None,
    pull: bool = False,
    warm: int = 0,
    warm_fork: bool = False,
    idempotency_key: str | None = None,
    live: LiveArg = False,
) -> Call[Env]:
    """Run `image` as a new env; with `wait="healthy"` return once it answers `health_path`.

    An env that fails to start comes back with `status == "failed"` and `error.log_tail`.
    `live=True` runs the image's uvicorn server under denv's launcher, so that
    `fork(..., kind="live")` copies the running process (memory, sessions) into children;
    it is refused (409 `live_unsupported`) when the server cannot be copied. `"auto"`
    keeps such an env, serving as without `live` (`env.live_unsupported` says why).
    """
    body = SandboxCreate(
        image=image,
        command=UNSET if command is None else list(command),
        env=env_vars_body(env),
        ports=UNSET if ports is None else list(ports),
        egress=egress_body(egress),
        volumes=UNSET if volumes is None else list(volumes),
        labels=labels_body(labels),
        ttl_s=opt(ttl_s),
        wait=wait_body(wait),
        wait_timeout_s=opt(wait_timeout_s),
        health_path=opt(health_path),
        pull=pull,
        warm=warm,
        warm_fork=warm_fork,
        live=_live_body(live),
    )
    return Call(
        create_sandbox_op,
        _value(Env.from_api),
        kwargs={"body": body, "idempotency_key": idempotency_key or new_idempotency_key()},
        wait_s=_create_wait_s(wait, wait_timeout_s),
        holds=True,
    )


def _live_body(live: LiveArg) -> bool | LiveAuto | Unset:
    """`live` as sent: only when asked (older servers know no `live`)."""
    if live == "auto":
        return LiveAuto.AUTO
    if live is True:
        return True
    if live is False:
        return UNSET
    raise ValueError(f"live must be True, False or 'auto', not {live!r}")


def create_sandboxes(
    image: str,
    count: int,
    *,
    ports: Sequence[int] | None = None,
    env: Mapping[str, str] | None = None,
    egress: EgressArg = "deny",
    command: Sequence[str] | None = None,
    volumes: Sequence[str] | None = None,
    labels: Mapping[str, str] | None = None,
    ttl_s: int | None = None,
    wait: WaitArg = "healthy",
    wait_timeout_s: float | None = None,
    health_path: str | None = None,
    pull: bool = False,
    warm: int = 0,
    warm_fork: bool = False,
    idempotency_key: str | None = None,
) -> Call[list[Env]]:
    """Run `count` envs of `image` in one request (at most 32); the same options as
    `create_sandbox`, each env in the list on its own.

    Each env succeeds or fails on its own: a failed one has `status == "failed"` and its
    `error`, the others run. Ready warm spares of the image (see `warm`) are taken first.

    >>> envs = denv.create_sandboxes("denv-echo-env:latest", 16)
    >>> ready = [e for e in envs if e.status == "healthy"]
    """
    # `create_sandbox`'s call with `count`: the answer is an EnvBatch, each env on its own.
    one = create_sandbox(
        image,
        ports=ports,
        env=env,
        egress=egress,
        command=command,
        volumes=volumes,
        labels=labels,
        ttl_s=ttl_s,
        wait=wait,
        wait_timeout_s=wait_timeout_s,
        health_path=health_path,
        pull=pull,
        warm=warm,
        warm_fork=warm_fork,
        idempotency_key=idempotency_key,
    )
    body = attrs.evolve(one.kwargs["body"], count=count)
    kwargs = {**one.kwargs, "body": body}
    return Call(create_sandbox_op, _envs, kwargs=kwargs, wait_s=one.wait_s, holds=True)


def _envs(res: Response[Any]) -> list[Env]:
    return [Env.from_api(env) for env in unwrap(res).envs]


def get_env(env_id: str) -> Call[Env]:
    """One env, as it is now."""
    return Call(get_env_op, _value(Env.from_api), (env_id,))


def list_envs(
    *,
    status: StatusArg | None = None,
    version_id: str | None = None,
    include_deleted: bool = False,
) -> Listing[Env]:
    """The envs of this key that are not deleted, newest first, fetched page by page.

    `include_deleted=True` lists deleted envs too (their records stay, with their
    lineage); `status="deleted"` lists only those.
    """
    status_filter = UNSET if status is None else EnvStatus(str(status))
    # Sent only when asked for: the server's default is to leave deleted envs out.
    deleted: bool | Unset = True if include_deleted else UNSET

    def page(cursor: str | Unset, limit: int) -> Call[Page[Any]]:
        query = {"limit": limit, "cursor": cursor, "status": status_filter}
        filters = {"version_id": opt(version_id), "include_deleted": deleted}
        return Call(list_envs_op, _page, kwargs={**query, **filters})

    return Listing(page, Env.from_api)


def delete_env(env_id: str) -> Call[None]:
    """Stop an env at once and remove everything it had. Deleting it again succeeds."""
    return Call(delete_env_op, unwrap_empty, (env_id,))


def detach(env_id: str) -> Call[Env]:
    """Take an env out of this client's lease, to keep it after the client closes or its
    process exits: it then lives until its `ttl_s` or a delete (`env.lease_id` is None).

    >>> keep = denv.create_sandbox("denv-echo-env:latest", ttl_s=86400)
    >>> denv.detach(keep.id)
    """
    return Call(detach_env_op, _value(Env.from_api), (env_id,), idempotent=True)


def wait_env(
    env_id: str,
    until: UntilArg = "healthy",
    timeout_s: float = _config.DEFAULT_ENV_WAIT_TIMEOUT_S,
) -> Call[Env]:
    """Wait (server-side long-poll) until the env reaches `until`, fails, or `timeout_s` passes.

    Returns the env as it is then; compare its `status` with what you waited for.
    """
    body = WaitRequest(until=WaitRequestUntil(str(until)), timeout_s=timeout_s)
    # A wait changes nothing on the server, so it may be retried although it is a POST.
    return Call(
        wait_env_op,
        _value(Env.from_api),
        (env_id,),
        {"body": body},
        wait_s=timeout_s,
        idempotent=True,
    )


def logs(env_id: str, *, service: str | None = None, tail: int = 100) -> Call[list[str]]:
    """The last `tail` log lines of a service (default: the agent service), oldest first."""

    def lines(res: Response[Any]) -> list[str]:
        found: list[str] = unwrap(res).lines
        return found

    return Call(get_env_logs_op, lines, (env_id,), {"service": opt(service), "tail": tail})


def warm_pool(env_id: str) -> Call[WarmPool]:
    """The booted spares the env asked for (`warm`): `.state`, `.ready` of `.target`.

    `state` is `none` (no spares asked for), `filling`, `ready`, or `stalled`
    (boots keep failing or no room is left; `.error` says which).
    """
    return Call(get_warm_pool_op, _value(WarmPool.from_api), (env_id,))


# -- versions and forks


def snapshot(env_id: str, *, labels: Mapping[str, str] | None = None) -> Call[Version]:
    """Save the env's volumes as a new immutable version (its services pause for it)."""
    body = SnapshotRequest(labels=labels_body(labels))
    return Call(
        snapshot_env_op,
        _value(Version.from_api),
        (env_id,),
        {"body": body, "idempotency_key": new_idempotency_key()},
    )


def fork(
    env_id: str,
    count: int = 1,
    *,
    egress: EgressArg | None = None,
    env: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    ttl_s: int | None = None,
    wait: WaitArg = "healthy",
    wait_timeout_s: float | None = None,
    warm: int = 0,
    kind: ForkKind = "auto",
    reseed: bool = True,
) -> Call[Fork]:
    """Snapshot the env once and start `count` children from it: `.version`, `.envs`.

    `kind="live"` (an env created with `live=True`) copies its running server process,
    memory and sessions included, into each child in milliseconds; `"auto"` (the
    default) is live where the env allows it, else volume. A live child draws fresh
    entropy for Python's `random` and NumPy's global generator (`reseed=True`, the
    default, as a volume fork's rebooted server does); `reseed=False` keeps the
    parent's state of both, so the child draws what the parent would have drawn next.
    On a cluster, live children run on the parent's node: with `"auto"` those it has no
    room for start as a volume fork on other nodes (`child.spill` says why); with
    `"live"` that is `RateLimited`.

    >>> fork = denv.fork(env.id, count=8)
    >>> [child.status for child in fork.envs]
    """
    body = envs_create(count, egress, env, labels, ttl_s, wait, wait_timeout_s, warm)
    if kind != "volume":  # sent only when asked: older servers know no `kind`
        body.kind = EnvsCreateKind(kind)
    if not reseed:  # sent only when asked, as `kind`
        body.reseed = False
    return Call(
        fork_env_op,
        _value(Fork.from_api),
        (env_id,),
        {"body": body, "idempotency_key": new_idempotency_key()},
        wait_s=_create_wait_s(wait, wait_timeout_s),
        holds=True,
    )


def envs_from_version(
    version_id: str,
    count: int = 1,
    *,
    egress: EgressArg | None = None,
    env: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    ttl_s: int | None = None,
    wait: WaitArg = "healthy",
    wait_timeout_s: float | None = None,
    warm: int = 0,
    live: LiveArg = False,
) -> Call[list[Env]]:
    """Start `count` envs from a stored version, in order. `live` as in `create_sandbox`:
    `True` or `"auto"` start them ready for live forks."""
    body = envs_create(count, egress, env, labels, ttl_s, wait, wait_timeout_s, warm)
    body.live = _live_body(live)
    return Call(
        envs_from_version_op,
        _envs,
        (version_id,),
        {"body": body, "idempotency_key": new_idempotency_key()},
        wait_s=_create_wait_s(wait, wait_timeout_s),
        holds=True,
    )


def get_version(version_id: str) -> Call[Version]:
    """One version."""
    return Call(get_version_op, _value(Version.from_api), (version_id,))


def list_versions(project: str | None = None) -> Listing[Version]:
    """Every version of this key (or of one project), newest first, page by page."""

    def page(cursor: str | Unset, limit: int) -> Call[Page[Any]]:
        query = {"limit": limit, "cursor": cursor, "project": opt(project)}
        return Call(list_versions_op, _page, kwargs=query)

    return Listing(page, Version.from_api)


def delete_version(version_id: str) -> Call[None]:
    """Delete a version and the layers only it used; `Conflict` while envs run from it."""
    return Call(delete_version_op, unwrap_empty, (version_id,))


def gc() -> Call[Collected]:
    """Delete this key's expired versions now: those a sandbox or a fork made that no env
    and no child version has needed for the server's grace period. What was freed::

        freed = denv.gc()   # Collected(versions_deleted=12, layers_deleted=12, ...)
    """
    # Collecting twice frees nothing more: safe to retry.
    return Call(collect_versions_op, _value(Collected.from_api), idempotent=True)


def diff(version_a: str, version_b: str) -> Call[VersionDiff]:
    """The files that differ in the volumes from `version_a` to `version_b`.

    Computed by the server from the versions' layers, without starting an env; its cost
    follows what changed, not the volume's size. Each `FileChange` has the file's
    `path` (`/work/...`), `change` (added, modified, deleted) and `size` in bytes.

    >>> for c in denv.diff(before.id, after.id).changes:
    ...     print(c.change, c.path, c.size)
    """
    return Call(diff_versions_op, _value(VersionDiff.from_api), (version_b,), {"base": version_a})


# -- projects


def deploy(project: str, compose: str, *, labels: Mapping[str, str] | None = None) -> Call[Version]:
    """Deploy a compose file (with `x-denv.agent.service`) as a new version of `project`."""
    body = DeployRequest(compose=compose, labels=labels_body(labels))
    return Call(
        deploy_project_op,
        _value(Version.from_api),
        (project,),
        {"body": body, "idempotency_key": new_idempotency_key()},
    )


def list_projects() -> Listing[Project]:
    """Every project of this key, page by page."""

    def page(cursor: str | Unset, limit: int) -> Call[Page[Any]]:
        return Call(list_projects_op, _page, kwargs={"limit": limit, "cursor": cursor})

    return Listing(page, Project.from_api)


# -- leases (denv/client/_lease.py keeps a client's)


def open_lease(timeout_s: float | None) -> Call[Lease]:
    body = LeaseCreate(timeout_s=opt(timeout_s))
    return Call(
        open_lease_op,
        _value(Lease.from_api),
        kwargs={"body": body, "idempotency_key": new_idempotency_key()},
    )


def get_lease(lease_id: str) -> Call[Lease]:
    return Call(get_lease_op, _value(Lease.from_api), (lease_id,))


def renew_lease(lease_id: str) -> Call[Lease]:
    # Renewing twice is renewing once: safe to retry although it is a POST.
    return Call(renew_lease_op, _value(Lease.from_api), (lease_id,), idempotent=True)


def close_lease(lease_id: str) -> Call[None]:
    return Call(close_lease_op, unwrap_empty, (lease_id,))
