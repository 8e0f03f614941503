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

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from denv_api_client.api.envs import delete_env as delete_env_op
from denv_api_client.api.envs import detach_env as detach_env_op
from denv_api_client.api.envs import get_env as get_env_op
from denv_api_client.api.envs import get_env_logs as get_env_logs_op
from denv_api_client.api.envs import get_warm_pool as get_warm_pool_op
from denv_api_client.api.envs import list_envs as list_envs_op
from denv_api_client.api.envs import wait_env as wait_env_op
from denv_api_client.api.health import get_health as get_health_op
from denv_api_client.api.sandboxes import create_sandbox as create_sandbox_op
from denv_api_client.models import (
    EnvStatus,
    SandboxCreate,
    WaitRequest,
    WaitRequestUntil,
)
from denv_api_client.types import UNSET, Response, Unset

from . import _config
from ._call import Call as Call
from ._call import ForkKind as ForkKind
from ._call import Listing as Listing
from ._call import LiveArg as LiveArg
from ._call import Plan as Plan
from ._call import create_wait_s, envs_of, live_body, page_of, value
from ._http import unwrap, unwrap_empty
from ._operations_versions import (  # the facades bind every operation from here
    close_lease as close_lease,
)
from ._operations_versions import (
    delete_version as delete_version,
)
from ._operations_versions import (
    deploy as deploy,
)
from ._operations_versions import (
    diff as diff,
)
from ._operations_versions import (
    envs_from_version as envs_from_version,
)
from ._operations_versions import (
    fork as fork,
)
from ._operations_versions import (
    gc as gc,
)
from ._operations_versions import (
    get_lease as get_lease,
)
from ._operations_versions import (
    get_version as get_version,
)
from ._operations_versions import (
    list_projects as list_projects,
)
from ._operations_versions import (
    list_versions as list_versions,
)
from ._operations_versions import (
    open_lease as open_lease,
)
from ._operations_versions import (
    renew_lease as renew_lease,
)
from ._operations_versions import (
    snapshot as snapshot,
)
from ._requests import (
    EgressArg,
    Page,
    StatusArg,
    UntilArg,
    WaitArg,
    egress_body,
    env_vars_body,
    labels_body,
    new_idempotency_key,
    opt,
    wait_body,
)
from .types import Env, Health, WarmPool

# -- server


def health() -> Call[Health]:
    """The server's status and versions (needs no key)."""
    return Call(get_health_op, value(Health.from_api))


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
        live=live_body(live),
    )
    return Call(
        create_sandbox_op,
        value(Env.from_api),
        kwargs={"body": body, "idempotency_key": idempotency_key or new_idempotency_key()},
        wait_s=create_wait_s(wait, wait_timeout_s),
        holds=True,
    )


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
    return Call(create_sandbox_op, envs_of, kwargs=kwargs, wait_s=one.wait_s, holds=True)


def get_env(env_id: str) -> Call[Env]:
    """One env, as it is now."""
    return Call(get_env_op, value(Env.from_api), (env_id,))


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
        return Call(list_envs_op, page_of, kwargs={**query, **filters})

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
    return Call(detach_env_op, value(Env.from_api), (env_id,), idempotent=True)


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
        value(Env.from_api),
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
    return Call(get_warm_pool_op, value(WarmPool.from_api), (env_id,))
