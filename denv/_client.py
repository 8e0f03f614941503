"""`Denv`: the typed facade over the generated denv API client."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Literal, Protocol, Self, TypeVar

import httpx
from denv_api_client.api.envs import (
    delete_env,
    fork_env,
    get_env,
    get_env_logs,
    get_warm_pool,
    list_envs,
    snapshot_env,
    wait_env,
)
from denv_api_client.api.health import get_health
from denv_api_client.api.projects import deploy_project, list_projects
from denv_api_client.api.sandboxes import create_sandbox
from denv_api_client.api.versions import (
    create_envs_from_version,
    delete_version,
    get_version,
    list_versions,
)
from denv_api_client.client import AuthenticatedClient
from denv_api_client.models import (
    DeployRequest,
    Egress,
    Env,
    EnvList,
    EnvsCreate,
    EnvStatus,
    EnvVars,
    Fork,
    Health,
    Labels,
    Project,
    ProjectList,
    SandboxCreate,
    SnapshotRequest,
    Version,
    VersionList,
    WaitFor,
    WaitRequest,
    WaitRequestUntil,
    WarmPool,
)
from denv_api_client.types import UNSET, Unset

from . import _config
from ._http import build_http_client, call_options, unwrap, unwrap_empty
from .local import resolve_server

EgressArg = Literal["deny", "allow"] | Egress
WaitArg = Literal["none", "running", "healthy"] | WaitFor
UntilArg = Literal["running", "healthy", "deleted"] | WaitRequestUntil
StatusArg = Literal["creating", "starting", "running", "healthy", "failed", "deleted"] | EnvStatus

__all__ = ["Denv"]


class _Secret(str):
    """A string whose repr does not show it (the generated client's attrs repr shows its token)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"'{_config.API_KEY_PREFIX}***'"


def _opt(value: Any) -> Any:
    """None → UNSET, so the server applies the contract's default."""
    return UNSET if value is None else value


def _labels(labels: Mapping[str, str] | None) -> Labels | Unset:
    return UNSET if labels is None else Labels.from_dict(dict(labels))


def _env_vars(env: Mapping[str, str] | None) -> EnvVars | Unset:
    return UNSET if env is None else EnvVars.from_dict(dict(env))


T_co = TypeVar("T_co", covariant=True)


class _Page(Protocol[T_co]):
    @property
    def items(self) -> Sequence[T_co]: ...
    @property
    def next_cursor(self) -> str | None: ...


def _paginate(fetch: Callable[[str | Unset], _Page[T_co]]) -> Iterator[T_co]:
    """Items of every page, following `next_cursor`; a page is fetched when it is reached."""
    cursor: str | Unset = UNSET
    while True:
        page = fetch(cursor)
        yield from page.items
        if not page.next_cursor:
            return
        cursor = page.next_cursor


def _new_idempotency_key() -> str:
    return f"denv-{uuid.uuid4()}"


class Denv:
    """A client of one denv server (the local `denv serve`, or a hosted one).

    >>> with Denv() as denv:  # DENV_SERVER/DENV_API_KEY, else the local server
    ...     env = denv.create_sandbox("denv-echo-env:latest")
    ...     fork = denv.fork(env.id, count=4)
    ...     print([child.endpoints[0].url for child in fork.envs])

    Every call has a timeout (`timeout_s`; waits get theirs on top), raises a `DenvError`
    subclass on failure, and is retried up to `max_retries` times only when a retry cannot
    repeat work the server already did. Creates carry an Idempotency-Key made per call.
    Constructing a client does no I/O: the server is found on its first call (or at once
    with `Denv.from_environment()`).
    (`_transport` and `_sleep` replace the network and the retry pause in tests.)
    """

    def __init__(
        self,
        server: str | None = None,
        api_key: str | None = None,
        *,
        timeout_s: float = _config.DEFAULT_TIMEOUT_S,
        max_retries: int = _config.DEFAULT_MAX_RETRIES,
        _transport: httpx.BaseTransport | None = None,
        _sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, not {timeout_s!r}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be 0 or more, not {max_retries!r}")
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self._page_size = _config.LIST_PAGE_SIZE
        # The server is found on first use (`_api`), so constructing a client does no I/O.
        self._server_arg = server
        self._key_arg = None if api_key is None else _Secret(api_key)
        self._transport = _transport
        self._sleep = _sleep
        self._server: str | None = None
        self._client: AuthenticatedClient | None = None
        self._closed = False
        self._lock = threading.Lock()

    @classmethod
    def from_environment(
        cls,
        server: str | None = None,
        api_key: str | None = None,
        *,
        start_local: bool = False,
        timeout_s: float = _config.DEFAULT_TIMEOUT_S,
        max_retries: int = _config.DEFAULT_MAX_RETRIES,
    ) -> Denv:
        """A client whose server is found now rather than on first use (see `denv.local`).

        With `start_local=True` and no server configured, the local server is started when
        none answers. Raises `DenvConfigError` when no server or key is found.

        >>> denv = Denv.from_environment(start_local=True)
        """
        url, key = resolve_server(server, api_key, start=start_local)
        return cls(url, key, timeout_s=timeout_s, max_retries=max_retries)

    @property
    def server(self) -> str:
        """The server's base URL (found on first use: argument, DENV_SERVER, local server)."""
        self._api  # noqa: B018  (finds the server)
        assert self._server is not None
        return self._server

    @property
    def _api(self) -> AuthenticatedClient:
        """The generated client, built on first use (see `denv.local.resolve_server`)."""
        with self._lock:
            if self._client is None:
                if self._closed:  # once built, httpx itself refuses calls after close
                    raise RuntimeError("this Denv client is closed")
                server, key = resolve_server(self._server_arg, self._key_arg)
                http = build_http_client(
                    server,
                    key,
                    timeout_s=self.timeout_s,
                    max_retries=self.max_retries,
                    transport=self._transport,
                    sleep=self._sleep,
                )
                client = AuthenticatedClient(base_url=server, token=_Secret(key))
                client.set_httpx_client(http)
                self._server, self._client = server, client
            return self._client

    def __repr__(self) -> str:
        return f"Denv(server={self._server or self._server_arg!r})"

    # -- lifecycle

    def close(self) -> None:
        """Close the connection pool. The client is unusable afterwards."""
        with self._lock:
            self._closed = True
            client = self._client
        if client is not None:
            client.get_httpx_client().close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _long_poll(
        self, wait_s: float, *, idempotent: bool | None = None
    ) -> AbstractContextManager[None]:
        """For a call that may rightly wait `wait_s` before answering: that, plus `timeout_s`."""
        return call_options(read_timeout_s=wait_s + self.timeout_s, idempotent=idempotent)

    def _create_timeout(
        self, wait: WaitArg, wait_timeout_s: float | None
    ) -> AbstractContextManager[None]:
        if WaitFor(wait) is WaitFor.NONE:
            return call_options()
        return self._long_poll(
            wait_timeout_s if wait_timeout_s is not None else _config.DEFAULT_CREATE_WAIT_TIMEOUT_S
        )

    # -- server

    def health(self) -> Health:
        """The server's status and versions (needs no key)."""
        res = get_health.sync_detailed(client=self._api)
        return unwrap(res)

    # -- envs

    def create_sandbox(
        self,
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
    ) -> Env:
        """Run `image` as a new env; with `wait="healthy"` return once it answers `health_path`.

        An env that fails to start comes back with `status == "failed"` and `error.log_tail`.
        """
        body = SandboxCreate(
            image=image,
            command=UNSET if command is None else list(command),
            env=_env_vars(env),
            ports=UNSET if ports is None else list(ports),
            egress=Egress(egress),
            volumes=UNSET if volumes is None else list(volumes),
            labels=_labels(labels),
            ttl_s=_opt(ttl_s),
            wait=WaitFor(wait),
            wait_timeout_s=_opt(wait_timeout_s),
            health_path=_opt(health_path),
            pull=pull,
            warm=warm,
            warm_fork=warm_fork,
        )
        with self._create_timeout(wait, wait_timeout_s):
            res = create_sandbox.sync_detailed(
                client=self._api,
                body=body,
                idempotency_key=idempotency_key or _new_idempotency_key(),
            )
        return unwrap(res)

    def get_env(self, env_id: str) -> Env:
        """One env, as it is now."""
        res = get_env.sync_detailed(env_id, client=self._api)
        return unwrap(res)

    def list_envs(
        self, *, status: StatusArg | None = None, version_id: str | None = None
    ) -> Iterator[Env]:
        """Every env of this key, newest first, fetched page by page as you iterate."""
        status_filter = UNSET if status is None else EnvStatus(status)

        def page(cursor: str | Unset) -> EnvList:
            res = list_envs.sync_detailed(
                client=self._api,
                limit=self._page_size,
                cursor=cursor,
                status=status_filter,
                version_id=_opt(version_id),
            )
            return unwrap(res)

        return _paginate(page)

    def delete_env(self, env_id: str) -> None:
        """Stop an env at once and remove everything it had. Deleting it again succeeds."""
        res = delete_env.sync_detailed(env_id, client=self._api)
        unwrap_empty(res)

    def wait_env(
        self,
        env_id: str,
        until: UntilArg = "healthy",
        timeout_s: float = _config.DEFAULT_ENV_WAIT_TIMEOUT_S,
    ) -> Env:
        """Wait (server-side long-poll) until the env reaches `until`, fails, or `timeout_s` passes.

        Returns the env as it is then; compare its `status` with what you waited for.
        """
        body = WaitRequest(until=WaitRequestUntil(until), timeout_s=timeout_s)
        # A wait changes nothing on the server, so it may be retried although it is a POST.
        with self._long_poll(timeout_s, idempotent=True):
            res = wait_env.sync_detailed(env_id, client=self._api, body=body)
        return unwrap(res)

    def logs(self, env_id: str, *, service: str | None = None, tail: int = 100) -> list[str]:
        """The last `tail` log lines of a service (default: the agent service), oldest first."""
        res = get_env_logs.sync_detailed(env_id, client=self._api, service=_opt(service), tail=tail)
        return unwrap(res).lines

    def warm_pool(self, env_id: str) -> WarmPool:
        """The booted spares the env asked for (`warm`): `.state`, `.ready` of `.target`.

        `state` is `none` (no spares asked for), `filling`, `ready`, or `stalled`
        (boots keep failing or no room is left; `.error` says which).
        """
        res = get_warm_pool.sync_detailed(env_id, client=self._api)
        return unwrap(res)

    # -- versions and forks

    def snapshot(self, env_id: str, *, labels: Mapping[str, str] | None = None) -> Version:
        """Save the env's volumes as a new immutable version (its services pause for it)."""
        res = snapshot_env.sync_detailed(
            env_id,
            client=self._api,
            body=SnapshotRequest(labels=_labels(labels)),
            idempotency_key=_new_idempotency_key(),
        )
        return unwrap(res)

    def fork(
        self,
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
    ) -> Fork:
        """Snapshot the env once and start `count` children from it: `.version`, `.envs`.

        >>> fork = denv.fork(env.id, count=8)
        >>> [child.status for child in fork.envs]
        """
        body = _envs_create(count, egress, env, labels, ttl_s, wait, wait_timeout_s, warm)
        with self._create_timeout(wait, wait_timeout_s):
            res = fork_env.sync_detailed(
                env_id, client=self._api, body=body, idempotency_key=_new_idempotency_key()
            )
        return unwrap(res)

    def envs_from_version(
        self,
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
    ) -> list[Env]:
        """Start `count` envs from a stored version, in order."""
        body = _envs_create(count, egress, env, labels, ttl_s, wait, wait_timeout_s, warm)
        with self._create_timeout(wait, wait_timeout_s):
            res = create_envs_from_version.sync_detailed(
                version_id, client=self._api, body=body, idempotency_key=_new_idempotency_key()
            )
        return unwrap(res).envs

    def get_version(self, version_id: str) -> Version:
        """One version."""
        res = get_version.sync_detailed(version_id, client=self._api)
        return unwrap(res)

    def list_versions(self, project: str | None = None) -> Iterator[Version]:
        """Every version of this key (or of one project), newest first, page by page."""

        def page(cursor: str | Unset) -> VersionList:
            res = list_versions.sync_detailed(
                client=self._api, limit=self._page_size, cursor=cursor, project=_opt(project)
            )
            return unwrap(res)

        return _paginate(page)

    def delete_version(self, version_id: str) -> None:
        """Delete a version and the layers only it used; `Conflict` while envs run from it."""
        res = delete_version.sync_detailed(version_id, client=self._api)
        unwrap_empty(res)

    # -- projects

    def deploy(
        self, project: str, compose: str, *, labels: Mapping[str, str] | None = None
    ) -> Version:
        """Deploy a compose file (with `x-denv.agent.service`) as a new version of `project`."""
        res = deploy_project.sync_detailed(
            project,
            client=self._api,
            body=DeployRequest(compose=compose, labels=_labels(labels)),
            idempotency_key=_new_idempotency_key(),
        )
        return unwrap(res)

    def list_projects(self) -> Iterator[Project]:
        """Every project of this key, page by page."""

        def page(cursor: str | Unset) -> ProjectList:
            res = list_projects.sync_detailed(
                client=self._api, limit=self._page_size, cursor=cursor
            )
            return unwrap(res)

        return _paginate(page)


def _envs_create(
    count: int,
    egress: EgressArg | None,
    env: Mapping[str, str] | None,
    labels: Mapping[str, str] | None,
    ttl_s: int | None,
    wait: WaitArg,
    wait_timeout_s: float | None,
    warm: int,
) -> EnvsCreate:
    return EnvsCreate(
        count=count,
        egress=UNSET if egress is None else Egress(egress),
        env=_env_vars(env),
        labels=_labels(labels),
        ttl_s=_opt(ttl_s),
        wait=WaitFor(wait),
        wait_timeout_s=_opt(wait_timeout_s),
        warm=warm,
    )
