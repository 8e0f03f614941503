"""`AsyncDenv`: the facade for asyncio, the same operations as `Denv`, awaited.

Each method is its operation in `denv.client._operations` (the one definition `Denv` runs too),
awaited through `AsyncClientBase._call`; the docstrings are `Denv`'s.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TypeVar

from . import _config
from . import _operations as ops
from ._async_base import AsyncClientBase
from ._client import Denv
from ._lineage import lineage as lineage_plan
from ._requests import EgressArg, StatusArg, UntilArg, WaitArg
from .types import Collected, Env, Fork, Health, Project, Version, VersionDiff, WarmPool

__all__ = ["AsyncDenv"]

C = TypeVar("C", bound=type)


def _docs_of(sync: type) -> Callable[[C], C]:
    """Give each method of the decorated class without a docstring the one of `sync`'s."""

    def give(cls: C) -> C:
        for name, method in vars(cls).items():
            if callable(method) and not name.startswith("_") and method.__doc__ is None:
                method.__doc__ = getattr(sync, name).__doc__
        return cls

    return give


@_docs_of(Denv)
class AsyncDenv(AsyncClientBase):
    """`Denv` for asyncio: every call a coroutine (lists are async iterators), on one loop.

    >>> async with AsyncDenv() as denv:  # DENV_SERVER/DENV_API_KEY, else the local server
    ...     env = await denv.create_sandbox("denv-echo-env:latest")
    ...     fork = await denv.fork(env.id, count=4)
    ...     async for env in denv.list_envs(status="healthy"):
    ...         print(env.id)

    Timeouts, retries, Idempotency-Keys and errors are `Denv`'s. Constructing a client does
    no I/O; the server is found on the first call, on a worker thread (finding or starting
    the local server reads files and waits on a process), so the event loop never blocks.
    (`_transport` and `_sleep` replace the network and the async retry pause in tests.)
    """

    # -- server

    async def health(self) -> Health:
        return await self._call(ops.health())

    # -- envs

    async def create_sandbox(
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
        live: ops.LiveArg = False,
    ) -> Env:
        return await self._call(
            ops.create_sandbox(
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
                live=live,
            )
        )

    async def create_sandboxes(
        self,
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
    ) -> list[Env]:
        return await self._call(
            ops.create_sandboxes(
                image,
                count,
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
        )

    async def get_env(self, env_id: str) -> Env:
        return await self._call(ops.get_env(env_id))

    def list_envs(
        self,
        *,
        status: StatusArg | None = None,
        version_id: str | None = None,
        include_deleted: bool = False,
    ) -> AsyncIterator[Env]:
        return self._list(ops.list_envs(status, version_id, include_deleted))

    async def delete_env(self, env_id: str) -> None:
        return await self._call(ops.delete_env(env_id))

    async def detach(self, env_id: str) -> Env:
        return await self._call(ops.detach(env_id))

    async def wait_env(
        self,
        env_id: str,
        until: UntilArg = "healthy",
        timeout_s: float = _config.DEFAULT_ENV_WAIT_TIMEOUT_S,
    ) -> Env:
        return await self._call(ops.wait_env(env_id, until, timeout_s))

    async def logs(self, env_id: str, *, service: str | None = None, tail: int = 100) -> list[str]:
        return await self._call(ops.logs(env_id, service, tail))

    async def warm_pool(self, env_id: str) -> WarmPool:
        return await self._call(ops.warm_pool(env_id))

    # -- versions and forks

    async def snapshot(self, env_id: str, *, labels: Mapping[str, str] | None = None) -> Version:
        return await self._call(ops.snapshot(env_id, labels))

    async def fork(
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
        kind: ops.ForkKind = "auto",
        reseed: bool = True,
    ) -> Fork:
        return await self._call(
            ops.fork(
                env_id,
                count,
                egress=egress,
                env=env,
                labels=labels,
                ttl_s=ttl_s,
                wait=wait,
                wait_timeout_s=wait_timeout_s,
                warm=warm,
                kind=kind,
                reseed=reseed,
            )
        )

    async def envs_from_version(
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
        live: ops.LiveArg = False,
    ) -> list[Env]:
        return await self._call(
            ops.envs_from_version(
                version_id,
                count,
                egress=egress,
                env=env,
                labels=labels,
                ttl_s=ttl_s,
                wait=wait,
                wait_timeout_s=wait_timeout_s,
                warm=warm,
                live=live,
            )
        )

    async def get_version(self, version_id: str) -> Version:
        return await self._call(ops.get_version(version_id))

    def list_versions(self, project: str | None = None) -> AsyncIterator[Version]:
        return self._list(ops.list_versions(project))

    async def delete_version(self, version_id: str) -> None:
        return await self._call(ops.delete_version(version_id))

    async def gc(self) -> Collected:
        """Delete this key's expired versions now: those a sandbox or a fork made that no env
        and no child version has needed for the server's grace period. What was freed::

            freed = denv.gc()   # Collected(versions_deleted=12, layers_deleted=12, ...)
        """
        return await self._call(ops.gc())

    async def lineage(self, id: str) -> list[Env | Version]:
        return await self._run(lineage_plan(id))

    async def diff(self, version_a: str, version_b: str) -> VersionDiff:
        return await self._call(ops.diff(version_a, version_b))

    # -- projects

    async def deploy(
        self, project: str, compose: str, *, labels: Mapping[str, str] | None = None
    ) -> Version:
        return await self._call(ops.deploy(project, compose, labels))

    def list_projects(self) -> AsyncIterator[Project]:
        return self._list(ops.list_projects())
