"""`Denv`: the typed facade over the generated denv API client."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

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
from denv_api_client.models import (
    DeployRequest,
    EnvList,
    EnvStatus,
    ProjectList,
    SandboxCreate,
    SnapshotRequest,
    VersionList,
    WaitRequest,
    WaitRequestUntil,
)
from denv_api_client.types import UNSET, Unset

from . import _config
from ._base import ClientBase
from ._http import unwrap, unwrap_empty
from ._requests import (
    EgressArg,
    StatusArg,
    UntilArg,
    WaitArg,
    egress_body,
    env_vars_body,
    envs_create,
    labels_body,
    new_idempotency_key,
    opt,
    paginate,
    wait_body,
)
from .types import Env, Fork, Health, Project, Version, WarmPool

__all__ = ["Denv"]


class Denv(ClientBase):
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

    # -- server

    def health(self) -> Health:
        """The server's status and versions (needs no key)."""
        res = get_health.sync_detailed(client=self._api)
        return Health.from_api(unwrap(res))

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
        )
        with self._create_timeout(wait, wait_timeout_s):
            res = create_sandbox.sync_detailed(
                client=self._api,
                body=body,
                idempotency_key=idempotency_key or new_idempotency_key(),
            )
        return Env.from_api(unwrap(res))

    def get_env(self, env_id: str) -> Env:
        """One env, as it is now."""
        res = get_env.sync_detailed(env_id, client=self._api)
        return Env.from_api(unwrap(res))

    def list_envs(
        self, *, status: StatusArg | None = None, version_id: str | None = None
    ) -> Iterator[Env]:
        """Every env of this key, newest first, fetched page by page as you iterate."""
        status_filter = UNSET if status is None else EnvStatus(str(status))

        def page(cursor: str | Unset) -> EnvList:
            res = list_envs.sync_detailed(
                client=self._api,
                limit=self._page_size,
                cursor=cursor,
                status=status_filter,
                version_id=opt(version_id),
            )
            return unwrap(res)

        return paginate(page, Env.from_api)

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
        body = WaitRequest(until=WaitRequestUntil(str(until)), timeout_s=timeout_s)
        # A wait changes nothing on the server, so it may be retried although it is a POST.
        with self._long_poll(timeout_s, idempotent=True):
            res = wait_env.sync_detailed(env_id, client=self._api, body=body)
        return Env.from_api(unwrap(res))

    def logs(self, env_id: str, *, service: str | None = None, tail: int = 100) -> list[str]:
        """The last `tail` log lines of a service (default: the agent service), oldest first."""
        res = get_env_logs.sync_detailed(env_id, client=self._api, service=opt(service), tail=tail)
        return unwrap(res).lines

    def warm_pool(self, env_id: str) -> WarmPool:
        """The booted spares the env asked for (`warm`): `.state`, `.ready` of `.target`.

        `state` is `none` (no spares asked for), `filling`, `ready`, or `stalled`
        (boots keep failing or no room is left; `.error` says which).
        """
        res = get_warm_pool.sync_detailed(env_id, client=self._api)
        return WarmPool.from_api(unwrap(res))

    # -- versions and forks

    def snapshot(self, env_id: str, *, labels: Mapping[str, str] | None = None) -> Version:
        """Save the env's volumes as a new immutable version (its services pause for it)."""
        res = snapshot_env.sync_detailed(
            env_id,
            client=self._api,
            body=SnapshotRequest(labels=labels_body(labels)),
            idempotency_key=new_idempotency_key(),
        )
        return Version.from_api(unwrap(res))

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
        body = envs_create(count, egress, env, labels, ttl_s, wait, wait_timeout_s, warm)
        with self._create_timeout(wait, wait_timeout_s):
            res = fork_env.sync_detailed(
                env_id, client=self._api, body=body, idempotency_key=new_idempotency_key()
            )
        return Fork.from_api(unwrap(res))

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
        body = envs_create(count, egress, env, labels, ttl_s, wait, wait_timeout_s, warm)
        with self._create_timeout(wait, wait_timeout_s):
            res = create_envs_from_version.sync_detailed(
                version_id, client=self._api, body=body, idempotency_key=new_idempotency_key()
            )
        return [Env.from_api(env) for env in unwrap(res).envs]

    def get_version(self, version_id: str) -> Version:
        """One version."""
        res = get_version.sync_detailed(version_id, client=self._api)
        return Version.from_api(unwrap(res))

    def list_versions(self, project: str | None = None) -> Iterator[Version]:
        """Every version of this key (or of one project), newest first, page by page."""

        def page(cursor: str | Unset) -> VersionList:
            res = list_versions.sync_detailed(
                client=self._api, limit=self._page_size, cursor=cursor, project=opt(project)
            )
            return unwrap(res)

        return paginate(page, Version.from_api)

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
            body=DeployRequest(compose=compose, labels=labels_body(labels)),
            idempotency_key=new_idempotency_key(),
        )
        return Version.from_api(unwrap(res))

    def list_projects(self) -> Iterator[Project]:
        """Every project of this key, page by page."""

        def page(cursor: str | Unset) -> ProjectList:
            res = list_projects.sync_detailed(
                client=self._api, limit=self._page_size, cursor=cursor
            )
            return unwrap(res)

        return paginate(page, Project.from_api)
