"""Every facade operation, defined once for `Denv` and `AsyncDenv`.

An operation is a `Call`: the generated operation module, the arguments to send, how its
answer becomes a value, and how long the server may rightly take. `Denv` runs a call with
the module's `sync_detailed`, `AsyncDenv` awaits its `asyncio_detailed`; neither knows more
about an operation than its signature. A list is a `Listing`: the call for one page.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar

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
    return Call(get_health_op, _value(Health.from_api))


# -- envs


def create_sandbox(
    image: str,
    *,
    ports: Sequence[int] | None,
    env: Mapping[str, str] | None,
    egress: EgressArg,
    command: Sequence[str] | None,
    volumes: Sequence[str] | None,
    labels: Mapping[str, str] | None,
    ttl_s: int | None,
    wait: WaitArg,
    wait_timeout_s: float | None,
    health_path: str | None,
    pull: bool,
    warm: int,
    warm_fork: bool,
    idempotency_key: str | None,
    live: LiveArg = False,
) -> Call[Env]:
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


def create_sandboxes(image: str, count: int, **options: Any) -> Call[list[Env]]:
    """`create_sandbox`'s call with `count`: the answer is an EnvBatch, each env on its own."""
    one = create_sandbox(image, **options)
    body = attrs.evolve(one.kwargs["body"], count=count)
    kwargs = {**one.kwargs, "body": body}
    return Call(create_sandbox_op, _envs, kwargs=kwargs, wait_s=one.wait_s, holds=True)


def _envs(res: Response[Any]) -> list[Env]:
    return [Env.from_api(env) for env in unwrap(res).envs]


def get_env(env_id: str) -> Call[Env]:
    return Call(get_env_op, _value(Env.from_api), (env_id,))


def list_envs(
    status: StatusArg | None, version_id: str | None, include_deleted: bool = False
) -> Listing[Env]:
    status_filter = UNSET if status is None else EnvStatus(str(status))
    # Sent only when asked for: the server's default is to leave deleted envs out.
    deleted: bool | Unset = True if include_deleted else UNSET

    def page(cursor: str | Unset, limit: int) -> Call[Page[Any]]:
        query = {"limit": limit, "cursor": cursor, "status": status_filter}
        filters = {"version_id": opt(version_id), "include_deleted": deleted}
        return Call(list_envs_op, _page, kwargs={**query, **filters})

    return Listing(page, Env.from_api)


def delete_env(env_id: str) -> Call[None]:
    return Call(delete_env_op, unwrap_empty, (env_id,))


def detach(env_id: str) -> Call[Env]:
    return Call(detach_env_op, _value(Env.from_api), (env_id,), idempotent=True)


def wait_env(env_id: str, until: UntilArg, timeout_s: float) -> Call[Env]:
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


def logs(env_id: str, service: str | None, tail: int) -> Call[list[str]]:
    def lines(res: Response[Any]) -> list[str]:
        found: list[str] = unwrap(res).lines
        return found

    return Call(get_env_logs_op, lines, (env_id,), {"service": opt(service), "tail": tail})


def warm_pool(env_id: str) -> Call[WarmPool]:
    return Call(get_warm_pool_op, _value(WarmPool.from_api), (env_id,))


# -- versions and forks


def snapshot(env_id: str, labels: Mapping[str, str] | None) -> Call[Version]:
    body = SnapshotRequest(labels=labels_body(labels))
    return Call(
        snapshot_env_op,
        _value(Version.from_api),
        (env_id,),
        {"body": body, "idempotency_key": new_idempotency_key()},
    )


def fork(
    env_id: str,
    count: int,
    *,
    egress: EgressArg | None,
    env: Mapping[str, str] | None,
    labels: Mapping[str, str] | None,
    ttl_s: int | None,
    wait: WaitArg,
    wait_timeout_s: float | None,
    warm: int,
    kind: ForkKind = "auto",
    reseed: bool = True,
) -> Call[Fork]:
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
    count: int,
    *,
    egress: EgressArg | None,
    env: Mapping[str, str] | None,
    labels: Mapping[str, str] | None,
    ttl_s: int | None,
    wait: WaitArg,
    wait_timeout_s: float | None,
    warm: int,
    live: LiveArg = False,
) -> Call[list[Env]]:
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
    return Call(get_version_op, _value(Version.from_api), (version_id,))


def list_versions(project: str | None) -> Listing[Version]:
    def page(cursor: str | Unset, limit: int) -> Call[Page[Any]]:
        query = {"limit": limit, "cursor": cursor, "project": opt(project)}
        return Call(list_versions_op, _page, kwargs=query)

    return Listing(page, Version.from_api)


def delete_version(version_id: str) -> Call[None]:
    return Call(delete_version_op, unwrap_empty, (version_id,))


def gc() -> Call[Collected]:
    # Collecting twice frees nothing more: safe to retry.
    return Call(collect_versions_op, _value(Collected.from_api), idempotent=True)


def diff(version_a: str, version_b: str) -> Call[VersionDiff]:
    return Call(diff_versions_op, _value(VersionDiff.from_api), (version_b,), {"base": version_a})


# -- projects


def deploy(project: str, compose: str, labels: Mapping[str, str] | None) -> Call[Version]:
    body = DeployRequest(compose=compose, labels=labels_body(labels))
    return Call(
        deploy_project_op,
        _value(Version.from_api),
        (project,),
        {"body": body, "idempotency_key": new_idempotency_key()},
    )


def list_projects() -> Listing[Project]:
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
