"""DenvProvider: OpenEnv's ContainerProvider, running envs on a denv server.

Example::

    from openenv.core import GenericEnvClient
    from denv.openenv import DenvProvider

    image = "denv-echo-env:latest"
    root = GenericEnvClient.from_docker_image(image, provider=DenvProvider()).sync()
    root.reset()
    branch = root.provider.fork()            # a DenvProvider bound to a ready child
    child = GenericEnvClient(base_url=branch.base_url, provider=branch).sync()
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, overload

from denv.errors import Conflict, EnvReadyTimeout, EnvStartError, NotFound
from openenv.core.containers.runtime import ContainerProvider

from . import _async, _waits
from ._async import delete_on_a_thread, in_event_loop
from ._config import (
    Egress,
    ForkKind,
    ProviderConfig,
    check_start_options,
)
from ._connection import Connection, open_connection
from ._readiness import WebSocketProbe, child_probe, no_websocket, probe_websocket
from ._waits import FAILED, ReadyWait, agent_url, start_error

if TYPE_CHECKING:
    from denv import Env, WarmPool

logger = logging.getLogger(__name__)

#: The contract's limit on children per fork request (EnvsCreate.count).
MAX_FORK_COUNT = 32


class DenvProvider(ContainerProvider):  # type: ignore[misc]  # openenv ships no type hints
    """Runs an OpenEnv environment image as a denv env, and forks it.

    Args:
        server: The denv server's URL. Default: DENV_SERVER, else a local
            `denv serve` owned by this user, started when none answers.
        api_key: The key for `server`. Default: DENV_API_KEY, else the local server's key.
        image: The image `start_container()` runs when given none, so that
            OpenEnv's provider-owned start (`EnvClient(provider=...)`) works.
        egress: `"deny"` (no outward connections; clients reach the env through
            the server's ingress proxy), `"allow"` (ports published on the server's host;
            no connections to the host, link-local or private networks unless the server
            allows them), or an allowlist `{"allow": ["name-or-cidr[:port]", ...]}` (only
            those destinations; names resolved by the server when the env is created;
            reached through the ingress like deny), e.g. the trainer's capture proxy:
            `{"allow": ["host.docker.internal:8100"]}` (docs/openenv-provider.md).
        ttl_s: Seconds until the server deletes an env this provider started.
        labels: Labels put on every env this provider starts or forks.
        timeout_s: Seconds an env may take to become ready (health and WebSocket).
        warm: Booted spares the server keeps ready for forks of this env (0: none).
        warm_fork: Declare that the image's server reads `/work` per session,
            not at boot, so children may start from booted spares. Defaults to `warm > 0`.
        websocket: Also require a WebSocket session on `/ws` for readiness (OpenEnv
            servers). False for a plain HTTP service, which is ready on `/health` alone.
        fork: How `fork()` branches the env. `"volume"` (default): children boot from a
            snapshot of `/work` (memory is not kept). `"live"`: the env is started under
            denv's launcher (the image is not changed) and each child is a copy of its
            running server process, OpenEnv sessions included, ready in milliseconds; the
            start fails with `denv.Conflict` (`live_unsupported`) when the image's server is
            not `uvicorn MODULE:APP`. `"auto"`: live where possible, else volume.

    The provider is bound to one env at a time (`env_id`, `base_url`);
    `fork()` returns new providers bound to children of that env, made with the same
    settings (`config`, a frozen `ProviderConfig`).
    """

    def __init__(
        self,
        server: str | None = None,
        api_key: str | None = None,
        image: str | None = None,
        egress: Egress = "deny",
        ttl_s: int = 3600,
        labels: Mapping[str, str] | None = None,
        timeout_s: float = 120.0,
        warm: int = 0,
        *,
        warm_fork: bool | None = None,
        websocket: bool = True,
        fork: ForkKind = "volume",
    ) -> None:
        config = ProviderConfig(
            server,
            api_key,
            image,
            egress,
            ttl_s,
            labels or {},
            timeout_s,
            warm,
            warm_fork,
            websocket,
            fork,
        )
        self._setup(config)

    def _setup(self, config: ProviderConfig) -> None:
        self._config = config
        self._connection: Connection | None = None
        self._env_id: str | None = None
        self._base_url: str | None = None
        self._ready_timeout_s: float | None = None
        self._origin = ""  # what the env was started from, for messages
        self._start: str | None = None  # "warm" or "cold": how the server started the env
        self._healthy_at_bind = False
        self._async = False  # bound by an *_async call: stop_container never blocks a loop
        self._lock = threading.RLock()
        #: The WebSocket readiness check, a seam: tests that replay recorded HTTP
        #: (which cannot hold a WebSocket) replace it. Forks inherit it.
        self.ws_probe: WebSocketProbe = probe_websocket if config.websocket else no_websocket

    # -- what the provider is bound to ---------------------------------------------------------

    @property
    def config(self) -> ProviderConfig:
        """The settings this provider was made with (its forks are made with the same)."""
        return self._config

    @property
    def env_id(self) -> str | None:
        """The id of the env this provider runs, or None when it runs none."""
        return self._env_id

    @property
    def base_url(self) -> str | None:
        """The URL an OpenEnv client connects to (holds an ingress capability: keep it private)."""
        return self._base_url

    @property
    def start(self) -> str | None:
        """How the server started the env: `"warm"` (a booted spare) or `"cold"` (a boot)."""
        return self._start

    @property
    def server(self) -> str:
        """The denv server's URL (resolving the embedded default if needed)."""
        return str(self._conn().denv.server)

    @property
    def api_key(self) -> str:
        """The API key used for `server` (never shown in repr or logs)."""
        return self._conn().api_key

    def __repr__(self) -> str:
        server = self._connection.denv.server if self._connection else self._config.server
        return (
            f"DenvProvider(env_id={self._env_id!r}, image={self._config.image!r}, "
            f"egress={self._config.egress!r}, server={server!r})"
        )

    # -- OpenEnv's ContainerProvider -----------------------------------------------------------

    def start_container(
        self,
        image: str | None = None,
        port: int | None = None,
        env_vars: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> str:
        """Start `image` as a new env and return the base URL clients connect to.

        `port` is the container port the image's server listens on (default
        8000); the server picks the address clients use. Options: `wait_timeout`
        (seconds for the next `wait_for_ready`, as AutoEnv passes), `labels`,
        `command` (or `cmd`, a list or a shell-style string). Any other keyword
        is an error. The env is not ready yet: call `wait_for_ready(base_url)`.
        """
        check_start_options(kwargs)
        config = self._config
        image = image or config.image
        if not image:
            raise ValueError(
                "no image to start: pass one to start_container(image) or DenvProvider(image=...)"
            )
        wait_timeout = kwargs.get("wait_timeout")
        with self._lock:
            self._require_unbound()
            denv = self._conn().denv

            options = config.sandbox_options(port, env_vars, kwargs)
            try:
                env = denv.create_sandbox(image, live=config.fork != "volume", **options)
            except Conflict as exc:
                if not config.volume_fallback(exc.code):
                    raise
                logger.info("fork='auto': %s; starting for volume forks", exc)
                env = denv.create_sandbox(image, live=False, **options)
            self._ready_timeout_s = float(wait_timeout) if wait_timeout else None
            return self._adopt(env, f"image {image!r}")

    def start_version(
        self,
        version_id: str,
        env_vars: Mapping[str, str] | None = None,
        *,
        wait_timeout: float | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> str:
        """Start a new env from a stored version (`ver_...`) and return its base URL."""
        config = self._config
        with self._lock:
            self._require_unbound()
            (env,) = self._conn().denv.envs_from_version(
                version_id,
                count=1,
                egress=config.egress,
                env=dict(env_vars) if env_vars else None,
                labels=config.merged_labels(labels),
                ttl_s=config.ttl_s,
                wait="running",
                wait_timeout_s=float(wait_timeout or config.timeout_s),
                warm=config.warm,
            )
            self._ready_timeout_s = float(wait_timeout) if wait_timeout else None
            return self._adopt(env, f"version {version_id}")

    def wait_for_ready(self, base_url: str, timeout_s: float | None = None) -> None:
        """Return once `<base_url>/health` answers 200 and a WebSocket opens on `<base_url>/ws`.

        Waits on the server's long-poll, so readiness is noticed at once and a
        crashed env fails at once, with its last log lines (`EnvStartError`);
        `EnvReadyTimeout` after `timeout_s` (default: the start's
        `wait_timeout`, else the constructor's `timeout_s`). Either way the
        env is deleted. A refused API key raises `denv.Unauthorized` at once.
        """
        timeout = (
            timeout_s if timeout_s is not None else self._ready_timeout_s or self._config.timeout_s
        )
        env_id = self._env_id
        wait = ReadyWait(self._conn(), self.ws_probe, env_id, self._origin, timeout)
        try:
            if env_id is not None and not self._healthy_at_bind:
                wait.until_healthy()
            wait.until_probes_pass(base_url)
        except (EnvStartError, EnvReadyTimeout):
            if env_id is not None:
                self._delete_quietly(env_id)
                self._unbind(env_id)
            raise

    def stop_container(self) -> None:
        """Delete the env (at once, no grace period). Safe to call again, or with no env.

        Also lets go of the connection to the server; a later start opens a new one.
        """
        with self._lock:
            env_id, connection = self._env_id, self._connection
            if env_id is not None and connection is not None and self._async and in_event_loop():
                # OpenEnv's async close() calls this from a coroutine: delete on a thread.
                self._env_id = self._base_url = self._start = self._connection = None
                delete_on_a_thread(connection, env_id)
                return
            if env_id is not None and connection is not None:
                with contextlib.suppress(NotFound):  # already gone: what stop wants
                    connection.denv.delete_env(env_id)
                self._env_id = self._base_url = self._start = None
                logger.info("deleted env %s", env_id)
            self._connection = None
        if connection is not None:
            connection.release()

    def close(self) -> None:
        """Delete the env, if any, and close the connection to the server (as stop_container)."""
        self.stop_container()

    # -- fork ------------------------------------------------------------------------------------

    @overload
    def fork(self, *, kind: ForkKind | None = None) -> DenvProvider: ...
    @overload
    def fork(self, n: int, *, kind: ForkKind | None = None) -> list[DenvProvider]: ...

    def fork(
        self, n: int | None = None, *, kind: ForkKind | None = None
    ) -> DenvProvider | list[DenvProvider]:
        """Snapshot this env once and start children from it, ready (health and WebSocket).

        `fork()` returns one provider bound to a child; `fork(n)` returns n,
        started in parallel by the server from the same snapshot. With a volume fork
        the child's volumes hold the parent's state at the snapshot and its server
        restarts; with a live fork (`kind="live"`, the default of `DenvProvider(fork=
        "live")`) the child is a copy of the running server, OpenEnv sessions included.
        Nothing is left behind when any child fails: all of them are deleted.
        """
        count = 1 if n is None else n
        if not 1 <= count <= MAX_FORK_COUNT:
            raise ValueError(f"fork count must be between 1 and {MAX_FORK_COUNT}, not {count!r}")
        env_id = self._env_id
        if env_id is None:
            raise RuntimeError(
                "fork() needs a running env: start one first (start_container(), or a client "
                "made with from_docker_image(image, provider=DenvProvider()))"
            )
        config, connection = self._config, self._conn()
        result = connection.denv.fork(
            env_id,
            count=count,
            labels=config.merged_labels(),
            ttl_s=config.ttl_s,
            # The server starts the children in parallel and answers once each is healthy or
            # failed (at once for warm children); the client then only probes its own path.
            wait="healthy",
            wait_timeout_s=config.timeout_s,
            warm=config.warm,
            kind=config.fork_kind(kind),
        )
        logger.info("forked env %s into %d (version %s)", env_id, count, result.version.id)
        children: list[DenvProvider] = []
        try:
            for env in result.envs:
                children.append(self._child(env, connection))
            timeout_s = config.timeout_s
            _waits.run_all(
                [
                    partial(c.wait_for_ready, c.base_url or "", timeout_s)
                    for c in children
                    if _waits.needs_probes(c.start)
                ]
            )
        except BaseException:
            _waits.discard([env.id for env in result.envs], children, self._delete_quietly)
            raise
        return children[0] if n is None else children

    def wait_warm(
        self,
        timeout_s: float = 300.0,
        progress: Callable[[WarmPool], None] | None = None,
    ) -> WarmPool:
        """Wait until the spares this env asked for (`warm=n`) are booted; return the pool.

        Once it returns, the next `fork(k)` with k <= n starts every child from a spare.
        `progress` is called with the server's report (`denv.WarmPool`: `ready`,
        `booting`, `target`) each time it changes. Returns at once when the env asked
        for no spares (state `none`: forks start cold). Raises `WarmPoolStalled` when
        spare boots keep failing or the server has no room for them, and
        `WarmPoolTimeout` after `timeout_s`.

        >>> provider = DenvProvider(warm=8)
        >>> client = GenericEnvClient.from_docker_image(image, provider=provider).sync()
        >>> provider.wait_warm(timeout_s=120, progress=lambda p: print(p.ready, "/", p.target))
        """
        env_id = self._env_id
        if env_id is None:
            raise RuntimeError("wait_warm() needs a running env: start one first")
        return _waits.wait_warm_pool(self._conn().denv, env_id, timeout_s, progress)

    # -- asyncio ---------------------------------------------------------------------------------

    async def start_container_async(
        self,
        image: str | None = None,
        port: int | None = None,
        env_vars: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> str:
        """`start_container`, awaited on the running loop (nothing in it blocks the loop).

        >>> provider = DenvProvider()
        >>> url = await provider.start_container_async("denv-echo-env:latest")
        >>> await provider.wait_for_ready_async(url)
        >>> client = GenericEnvClient(base_url=url, provider=provider)
        """
        return await _async.start_container(self, image, port, env_vars, kwargs)

    async def start_version_async(
        self,
        version_id: str,
        env_vars: Mapping[str, str] | None = None,
        *,
        wait_timeout: float | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> str:
        """`start_version`, awaited."""
        return await _async.start_version(self, version_id, env_vars, wait_timeout, labels)

    async def wait_for_ready_async(self, base_url: str, timeout_s: float | None = None) -> None:
        """`wait_for_ready`, awaited: the server's long-poll, then /health and a WebSocket."""
        await _async.ready(self, base_url, timeout_s)

    @overload
    async def fork_async(self, *, kind: ForkKind | None = None) -> DenvProvider: ...
    @overload
    async def fork_async(self, n: int, *, kind: ForkKind | None = None) -> list[DenvProvider]: ...

    async def fork_async(
        self, n: int | None = None, *, kind: ForkKind | None = None
    ) -> DenvProvider | list[DenvProvider]:
        """`fork`, awaited: one snapshot, `n` children ready, all deleted if any fails.

        >>> branches = await root.provider.fork_async(8)
        """
        count = 1 if n is None else n
        if not 1 <= count <= MAX_FORK_COUNT:
            raise ValueError(f"fork count must be between 1 and {MAX_FORK_COUNT}, not {count!r}")
        children = await _async.fork(self, count, kind)
        return children[0] if n is None else children

    async def stop_container_async(self) -> None:
        """`stop_container`, awaited: the env is deleted when it returns."""
        await _async.stop(self)

    # -- internals -------------------------------------------------------------------------------

    def _blank_child(self, connection: Connection) -> DenvProvider:
        """A provider with this one's settings, sharing its connection, bound to nothing yet."""
        child = DenvProvider.__new__(DenvProvider)
        child._setup(self._config)
        child.ws_probe = self.ws_probe
        child._connection = connection.share()
        return child

    def _conn(self) -> Connection:
        with self._lock:
            if self._connection is None:
                self._connection = open_connection(self._config.server, self._config.api_key)
            return self._connection

    def _child(self, env: Env, connection: Connection) -> DenvProvider:
        """A provider bound to `env` (a fork of this one's), sharing its connection."""
        child = DenvProvider.__new__(DenvProvider)
        child._setup(self._config)
        child.ws_probe = child_probe(str(env.start), self.ws_probe)
        child._connection = connection.share()
        try:
            child._adopt(env, f"a fork of {self._env_id}")
        except BaseException:
            child.close()
            raise
        return child

    def _require_unbound(self) -> None:
        if self._env_id is not None:
            raise RuntimeError(
                f"this DenvProvider already runs env {self._env_id}: call stop_container() "
                "first, or use another DenvProvider"
            )

    def _adopt(self, env: Env, what: str) -> str:
        """Bind to a just-created env and return its base URL; delete it if it is unusable."""
        try:
            if str(env.status) in FAILED:
                raise start_error(self._conn().denv, env, what)
            url = agent_url(env)
            if url is None:
                raise EnvStartError(
                    f"env {env.id} ({what}) has no endpoint for its agent service "
                    f"{env.agent_service!r}",
                    env_id=env.id,
                    fix="Expose the port its OpenEnv server listens on: start_container(port=...).",
                )
        except BaseException:
            self._delete_quietly(env.id)
            raise
        with self._lock:
            self._env_id, self._base_url, self._origin = env.id, url, what
            self._start = str(env.start)
            # Already healthy on the server (a fork that waited): no long-poll needed.
            self._healthy_at_bind = str(env.status) == "healthy"
        logger.info("env %s started (%s, egress %s)", env.id, what, env.egress)
        return url

    def _delete_quietly(self, env_id: str) -> None:
        """Delete an env on a failure path, where a second error would hide the first."""
        try:
            self._conn().denv.delete_env(env_id)
        except Exception as exc:
            logger.warning("could not delete env %s: %s", env_id, exc)

    def _unbind(self, env_id: str) -> None:
        with self._lock:
            if self._env_id == env_id:
                self._env_id = self._base_url = self._start = None
