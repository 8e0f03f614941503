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
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

from denv.errors import (
    EnvReadyTimeout,
    EnvStartError,
    NotFound,
    WarmPoolStalled,
    WarmPoolTimeout,
)
from openenv.core.containers.runtime import ContainerProvider

from ._connection import Connection, open_connection
from ._readiness import WebSocketProbe, probe_websocket
from ._waits import FAILED, ReadyWait, start_error

if TYPE_CHECKING:
    from denv import Env, WarmPool

logger = logging.getLogger(__name__)

Egress = Literal["deny", "allow"]

#: The container port an OpenEnv server listens on unless told otherwise.
DEFAULT_PORT = 8000
#: Keyword arguments of start_container besides image/port/env_vars: what OpenEnv itself passes
#: (AutoEnv's `wait_timeout`) and the per-start options other providers take.
START_OPTIONS = ("wait_timeout", "labels", "command", "cmd")
#: How often wait_warm() asks the server how its spares are doing.
WARM_POLL_S = 0.25


class DenvProvider(ContainerProvider):  # type: ignore[misc]  # openenv ships no type hints
    """Runs an OpenEnv environment image as a denv env, and forks it.

    Args:
        server: The denv server's URL. Default: DENV_SERVER, else a local
            `denv serve` owned by this user, started when none answers.
        api_key: The key for `server`. Default: DENV_API_KEY, else the local server's key.
        image: The image `start_container()` runs when given none, so that
            OpenEnv's provider-owned start (`EnvClient(provider=...)`) works.
        egress: `"deny"` (no outward connections; clients reach the env through
            the server's ingress proxy) or `"allow"` (ports published on the server's host).
        ttl_s: Seconds until the server deletes an env this provider started.
        labels: Labels put on every env this provider starts or forks.
        timeout_s: Seconds an env may take to become ready (health and WebSocket).
        warm: Booted spares the server keeps ready for forks of this env (0: none).
        warm_fork: Declare that the image's server reads `/work` per session,
            not at boot, so children may start from booted spares. Defaults to `warm > 0`.
        websocket: Also require a WebSocket session on `/ws` for readiness (OpenEnv
            servers). False for a plain HTTP service, which is ready on `/health` alone.

    The provider is bound to one env at a time (`env_id`, `base_url`);
    `fork()` returns new providers bound to children of that env.
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
    ) -> None:
        if egress not in ("deny", "allow"):
            raise ValueError(f"egress must be 'deny' or 'allow', not {egress!r}")
        if ttl_s < 1:
            raise ValueError(f"ttl_s must be at least 1 second, not {ttl_s!r}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, not {timeout_s!r}")
        if warm < 0:
            raise ValueError(f"warm must be 0 or more, not {warm!r}")
        self._server = server
        self._api_key = api_key
        self._image = image
        self._egress: Egress = egress
        self._ttl_s = ttl_s
        self._labels = dict(labels or {})
        self._timeout_s = timeout_s
        self._warm = warm
        self._warm_fork = warm > 0 if warm_fork is None else warm_fork
        self._connection: Connection | None = None
        self._env_id: str | None = None
        self._base_url: str | None = None
        self._ready_timeout_s: float | None = None
        self._origin = ""  # what the env was started from, for messages
        self._start: str | None = None  # "warm" or "cold": how the server started the env
        self._healthy_at_bind = False
        self._lock = threading.RLock()
        #: The WebSocket readiness check, a seam: tests that replay recorded HTTP
        #: (which cannot hold a WebSocket) replace it. Forks inherit it.
        self.ws_probe: WebSocketProbe = probe_websocket if websocket else _no_websocket

    # -- what the provider is bound to ---------------------------------------------------------

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
        server = self._connection.denv.server if self._connection else self._server
        return (
            f"DenvProvider(env_id={self._env_id!r}, image={self._image!r}, "
            f"egress={self._egress!r}, server={server!r})"
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
        unknown = sorted(set(kwargs) - set(START_OPTIONS))
        if unknown:
            raise ValueError(
                "DenvProvider.start_container() got unknown keyword argument(s): "
                f"{', '.join(unknown)}; it accepts image, port, env_vars, "
                f"{', '.join(START_OPTIONS)}"
            )
        image = image or self._image
        if not image:
            raise ValueError(
                "no image to start: pass one to start_container(image) or DenvProvider(image=...)"
            )
        wait_timeout = kwargs.get("wait_timeout")
        with self._lock:
            self._require_unbound()
            env = self._conn().denv.create_sandbox(
                image,
                ports=[port or DEFAULT_PORT],
                env=dict(env_vars) if env_vars else None,
                egress=self._egress,
                command=_command(kwargs.get("command", kwargs.get("cmd"))),
                labels=self._merged_labels(kwargs.get("labels")),
                ttl_s=self._ttl_s,
                wait="running",
                wait_timeout_s=float(wait_timeout or self._timeout_s),
                warm=self._warm,
                warm_fork=self._warm_fork,
            )
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
        with self._lock:
            self._require_unbound()
            (env,) = self._conn().denv.envs_from_version(
                version_id,
                count=1,
                egress=self._egress,
                env=dict(env_vars) if env_vars else None,
                labels=self._merged_labels(labels),
                ttl_s=self._ttl_s,
                wait="running",
                wait_timeout_s=float(wait_timeout or self._timeout_s),
                warm=self._warm,
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
        timeout = timeout_s if timeout_s is not None else self._ready_timeout_s or self._timeout_s
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
    def fork(self) -> DenvProvider: ...
    @overload
    def fork(self, n: int) -> list[DenvProvider]: ...

    def fork(self, n: int | None = None) -> DenvProvider | list[DenvProvider]:
        """Snapshot this env once and start children from it, ready (health and WebSocket).

        `fork()` returns one provider bound to a child; `fork(n)` returns n,
        started in parallel by the server from the same snapshot. The child's
        volumes hold the parent's state at the snapshot; its server restarts.
        Nothing is left behind when any child fails: all of them are deleted.
        """
        from ._fork import fork_children

        children = fork_children(self, 1 if n is None else n)
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
        denv = self._conn().denv
        deadline = time.monotonic() + timeout_s
        seen: tuple[str, int, int] | None = None
        while True:
            pool = denv.warm_pool(env_id)
            state = str(pool.state)
            if (state, pool.ready, pool.booting) != seen and progress is not None:
                progress(pool)
            seen = (state, pool.ready, pool.booting)
            if state in ("none", "ready"):
                return pool
            if state == "stalled":
                raise WarmPoolStalled(
                    f"the warm pool of env {env_id} stopped filling at {pool.ready}/"
                    f"{pool.target} spares: {pool.error or 'no reason given'}. Forks start "
                    "cold meanwhile; fix the cause (the server's log names it), then fork "
                    "again with warm to restart the pool.",
                    pool,
                )
            if time.monotonic() + WARM_POLL_S > deadline:
                raise WarmPoolTimeout(
                    f"the warm pool of env {env_id} had {pool.ready}/{pool.target} spares "
                    f"ready ({pool.booting} booting) after {timeout_s:g}s: the machine may be "
                    "busy; wait longer (timeout_s) or fork now (children without a spare "
                    "start cold).",
                    pool,
                )
            time.sleep(WARM_POLL_S)

    # -- internals shared with _fork -------------------------------------------------------------

    def _conn(self) -> Connection:
        with self._lock:
            if self._connection is None:
                self._connection = open_connection(self._server, self._api_key)
            return self._connection

    def _child(self, env: Env, connection: Connection) -> DenvProvider:
        """A provider bound to `env` (a fork of this one's), sharing its connection."""
        child = DenvProvider(
            self._server,
            self._api_key,
            self._image,
            self._egress,
            self._ttl_s,
            self._labels,
            self._timeout_s,
            self._warm,
            warm_fork=self._warm_fork,
        )
        child.ws_probe = self.ws_probe
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

    def _merged_labels(self, extra: Mapping[str, str] | None) -> dict[str, str] | None:
        labels = {**self._labels, **(extra or {})}
        return labels or None

    def _adopt(self, env: Env, what: str) -> str:
        """Bind to a just-created env and return its base URL; delete it if it is unusable."""
        try:
            if str(env.status) in FAILED:
                raise start_error(self._conn().denv, env, what)
            url = _agent_url(env)
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


def _command(value: Sequence[str] | str | None) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return shlex.split(value)
    return [str(part) for part in value]


def _agent_url(env: Env) -> str | None:
    """The agent service's first endpoint (the port clients talk to), without a trailing slash."""
    for endpoint in env.endpoints:
        if endpoint.service == env.agent_service:
            return str(endpoint.url).rstrip("/")
    return None


def _no_websocket(base_url: str, timeout_s: float) -> None:
    """The WebSocket probe of a provider whose service is plain HTTP: nothing to check."""
    return None
