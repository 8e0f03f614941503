"""The facade's operations on versions, forks, projects and leases (``denv.client._operations``
holds the server's and the envs', and names these too, so the facades bind every operation from
one module)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from denv_api_client.api.envs import fork_env as fork_env_op
from denv_api_client.api.envs import snapshot_env as snapshot_env_op
from denv_api_client.api.leases import close_lease as close_lease_op
from denv_api_client.api.leases import get_lease as get_lease_op
from denv_api_client.api.leases import open_lease as open_lease_op
from denv_api_client.api.leases import renew_lease as renew_lease_op
from denv_api_client.api.projects import deploy_project as deploy_project_op
from denv_api_client.api.projects import list_projects as list_projects_op
from denv_api_client.api.versions import collect_versions as collect_versions_op
from denv_api_client.api.versions import create_envs_from_version as envs_from_version_op
from denv_api_client.api.versions import delete_version as delete_version_op
from denv_api_client.api.versions import diff_versions as diff_versions_op
from denv_api_client.api.versions import get_version as get_version_op
from denv_api_client.api.versions import list_versions as list_versions_op
from denv_api_client.models import (
    DeployRequest,
    EnvsCreateKind,
    SnapshotRequest,
)
from denv_api_client.models.lease_create import LeaseCreate
from denv_api_client.types import Unset

from ._call import (
    Call,
    ForkKind,
    Listing,
    LiveArg,
    create_wait_s,
    envs_of,
    live_body,
    page_of,
    value,
)
from ._http import unwrap_empty
from ._requests import (
    EgressArg,
    Page,
    WaitArg,
    envs_create,
    labels_body,
    new_idempotency_key,
    opt,
)
from .types import Collected, Env, Fork, Lease, Project, Version, VersionDiff

# -- versions and forks


def snapshot(env_id: str, *, labels: Mapping[str, str] | None = None) -> Call[Version]:
    """Save the env's volumes as a new immutable version (its services pause for it)."""
    body = SnapshotRequest(labels=labels_body(labels))
    return Call(
        snapshot_env_op,
        value(Version.from_api),
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
        value(Fork.from_api),
        (env_id,),
        {"body": body, "idempotency_key": new_idempotency_key()},
        wait_s=create_wait_s(wait, wait_timeout_s),
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
    body.live = live_body(live)
    return Call(
        envs_from_version_op,
        envs_of,
        (version_id,),
        {"body": body, "idempotency_key": new_idempotency_key()},
        wait_s=create_wait_s(wait, wait_timeout_s),
        holds=True,
    )


def get_version(version_id: str) -> Call[Version]:
    """One version."""
    return Call(get_version_op, value(Version.from_api), (version_id,))


def list_versions(project: str | None = None) -> Listing[Version]:
    """Every version of this key (or of one project), newest first, page by page."""

    def page(cursor: str | Unset, limit: int) -> Call[Page[Any]]:
        query = {"limit": limit, "cursor": cursor, "project": opt(project)}
        return Call(list_versions_op, page_of, kwargs=query)

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
    return Call(collect_versions_op, value(Collected.from_api), idempotent=True)


def diff(version_a: str, version_b: str) -> Call[VersionDiff]:
    """The files that differ in the volumes from `version_a` to `version_b`.

    Computed by the server from the versions' layers, without starting an env; its cost
    follows what changed, not the volume's size. Each `FileChange` has the file's
    `path` (`/work/...`), `change` (added, modified, deleted) and `size` in bytes.

    >>> for c in denv.diff(before.id, after.id).changes:
    ...     print(c.change, c.path, c.size)
    """
    return Call(diff_versions_op, value(VersionDiff.from_api), (version_b,), {"base": version_a})


# -- projects


def deploy(project: str, compose: str, *, labels: Mapping[str, str] | None = None) -> Call[Version]:
    """Deploy a compose file (with `x-denv.agent.service`) as a new version of `project`."""
    body = DeployRequest(compose=compose, labels=labels_body(labels))
    return Call(
        deploy_project_op,
        value(Version.from_api),
        (project,),
        {"body": body, "idempotency_key": new_idempotency_key()},
    )


def list_projects() -> Listing[Project]:
    """Every project of this key, page by page."""

    def page(cursor: str | Unset, limit: int) -> Call[Page[Any]]:
        return Call(list_projects_op, page_of, kwargs={"limit": limit, "cursor": cursor})

    return Listing(page, Project.from_api)


# -- leases (denv/client/_lease.py keeps a client's)


def open_lease(timeout_s: float | None) -> Call[Lease]:
    body = LeaseCreate(timeout_s=opt(timeout_s))
    return Call(
        open_lease_op,
        value(Lease.from_api),
        kwargs={"body": body, "idempotency_key": new_idempotency_key()},
    )


def get_lease(lease_id: str) -> Call[Lease]:
    return Call(get_lease_op, value(Lease.from_api), (lease_id,))


def renew_lease(lease_id: str) -> Call[Lease]:
    # Renewing twice is renewing once: safe to retry although it is a POST.
    return Call(renew_lease_op, value(Lease.from_api), (lease_id,), idempotent=True)


def close_lease(lease_id: str) -> Call[None]:
    return Call(close_lease_op, unwrap_empty, (lease_id,))
