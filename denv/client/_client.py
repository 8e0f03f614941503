"""`Denv`: the typed facade over the generated denv API client.

Each method is its operation in `denv.client._operations`, run by `ClientBase._call`; `AsyncDenv`
(denv/client/_async.py) runs the same operations awaited.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from . import _config
from . import _operations as ops
from ._base import ClientBase
from ._lineage import lineage as lineage_plan
from ._requests import EgressArg, StatusArg, UntilArg, WaitArg
from .types import Collected, Env, Fork, Health, Project, Version, VersionDiff, WarmPool

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

    The envs a client creates are held by its lease: one background thread renews it, and
    when the client closes, or its process exits or dies (renewals stop for the lease's
    timeout, 15 s by default), the server deletes them. `detach=True` makes a client whose
    envs stay until their `ttl_s` or a delete (the `denv` CLI's); `detach(env_id)` keeps
    one env; `lease_id=` holds envs under another client's lease, which this one neither
    renews nor closes; `lease_timeout_s` asks for another timeout (5-600 s).
    A server with TLS (`denv serve --tls-cert`) whose certificate the system does not trust
    is checked against `ca_bundle`, a PEM file (default $DENV_CA_BUNDLE).
    (`_transport` and `_sleep` replace the network and the retry pause in tests.)
    """

    # -- server

    def health(self) -> Health:
        """The server's status and versions (needs no key)."""
        return self._call(ops.health())

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
        live: ops.LiveArg = False,
    ) -> Env:
        """Run `image` as a new env; with `wait="healthy"` return once it answers `health_path`.

        An env that fails to start comes back with `status == "failed"` and `error.log_tail`.
        `live=True` runs the image's uvicorn server under denv's launcher, so that
        `fork(..., kind="live")` copies the running process (memory, sessions) into children;
        it is refused (409 `live_unsupported`) when the server cannot be copied. `"auto"`
        keeps such an env, serving as without `live` (`env.live_unsupported` says why).
        """
        return self._call(
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

    def create_sandboxes(
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
        """Run `count` envs of `image` in one request (at most 32); the same options as
        `create_sandbox`, each env in the list on its own.

        Each env succeeds or fails on its own: a failed one has `status == "failed"` and its
        `error`, the others run. Ready warm spares of the image (see `warm`) are taken first.

        >>> envs = denv.create_sandboxes("denv-echo-env:latest", 16)
        >>> ready = [e for e in envs if e.status == "healthy"]
        """
        return self._call(
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

    def get_env(self, env_id: str) -> Env:
        """One env, as it is now."""
        return self._call(ops.get_env(env_id))

    def list_envs(
        self,
        *,
        status: StatusArg | None = None,
        version_id: str | None = None,
        include_deleted: bool = False,
    ) -> Iterator[Env]:
        """The envs of this key that are not deleted, newest first, fetched page by page.

        `include_deleted=True` lists deleted envs too (their records stay, with their
        lineage); `status="deleted"` lists only those.
        """
        return self._list(ops.list_envs(status, version_id, include_deleted))

    def delete_env(self, env_id: str) -> None:
        """Stop an env at once and remove everything it had. Deleting it again succeeds."""
        return self._call(ops.delete_env(env_id))

    def detach(self, env_id: str) -> Env:
        """Take an env out of this client's lease, to keep it after the client closes or its
        process exits: it then lives until its `ttl_s` or a delete (`env.lease_id` is None).

        >>> keep = denv.create_sandbox("denv-echo-env:latest", ttl_s=86400)
        >>> denv.detach(keep.id)
        """
        return self._call(ops.detach(env_id))

    def wait_env(
        self,
        env_id: str,
        until: UntilArg = "healthy",
        timeout_s: float = _config.DEFAULT_ENV_WAIT_TIMEOUT_S,
    ) -> Env:
        """Wait (server-side long-poll) until the env reaches `until`, fails, or `timeout_s` passes.

        Returns the env as it is then; compare its `status` with what you waited for.
        """
        return self._call(ops.wait_env(env_id, until, timeout_s))

    def logs(self, env_id: str, *, service: str | None = None, tail: int = 100) -> list[str]:
        """The last `tail` log lines of a service (default: the agent service), oldest first."""
        return self._call(ops.logs(env_id, service, tail))

    def warm_pool(self, env_id: str) -> WarmPool:
        """The booted spares the env asked for (`warm`): `.state`, `.ready` of `.target`.

        `state` is `none` (no spares asked for), `filling`, `ready`, or `stalled`
        (boots keep failing or no room is left; `.error` says which).
        """
        return self._call(ops.warm_pool(env_id))

    # -- versions and forks

    def snapshot(self, env_id: str, *, labels: Mapping[str, str] | None = None) -> Version:
        """Save the env's volumes as a new immutable version (its services pause for it)."""
        return self._call(ops.snapshot(env_id, labels))

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
        kind: ops.ForkKind = "auto",
        reseed: bool = True,
    ) -> Fork:
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
        return self._call(
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
        live: ops.LiveArg = False,
    ) -> list[Env]:
        """Start `count` envs from a stored version, in order. `live` as in `create_sandbox`:
        `True` or `"auto"` start them ready for live forks."""
        return self._call(
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

    def get_version(self, version_id: str) -> Version:
        """One version."""
        return self._call(ops.get_version(version_id))

    def list_versions(self, project: str | None = None) -> Iterator[Version]:
        """Every version of this key (or of one project), newest first, page by page."""
        return self._list(ops.list_versions(project))

    def delete_version(self, version_id: str) -> None:
        """Delete a version and the layers only it used; `Conflict` while envs run from it."""
        return self._call(ops.delete_version(version_id))

    def gc(self) -> Collected:
        """Delete this key's expired versions now: those a sandbox or a fork made that no env
        and no child version has needed for the server's grace period. What was freed::

            freed = denv.gc()   # Collected(versions_deleted=12, layers_deleted=12, ...)
        """
        return self._call(ops.gc())

    def lineage(self, id: str) -> list[Env | Version]:
        """The chain from an env or a version to its root, nearest first.

        Env → its version → the env that version was snapshotted from → its version → … →
        the root version (a sandbox's implicit one, or a deployed one). A version deleted
        since ends the chain early.

        >>> [x.id for x in denv.lineage(child.id)]
        ['env_...child', 'ver_...fork', 'env_...root', 'ver_...implicit']
        """
        return self._run(lineage_plan(id))

    def diff(self, version_a: str, version_b: str) -> VersionDiff:
        """The files that differ in the volumes from `version_a` to `version_b`.

        Computed by the server from the versions' layers, without starting an env; its cost
        follows what changed, not the volume's size. Each `FileChange` has the file's
        `path` (`/work/...`), `change` (added, modified, deleted) and `size` in bytes.

        >>> for c in denv.diff(before.id, after.id).changes:
        ...     print(c.change, c.path, c.size)
        """
        return self._call(ops.diff(version_a, version_b))

    # -- projects

    def deploy(
        self, project: str, compose: str, *, labels: Mapping[str, str] | None = None
    ) -> Version:
        """Deploy a compose file (with `x-denv.agent.service`) as a new version of `project`."""
        return self._call(ops.deploy(project, compose, labels))

    def list_projects(self) -> Iterator[Project]:
        """Every project of this key, page by page."""
        return self._list(ops.list_projects())
