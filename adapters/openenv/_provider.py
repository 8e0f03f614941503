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

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, overload

from openenv.core.containers.runtime import ContainerProvider

from . import _async, _operations, _waits
from ._binding import Binding
from ._config import Egress, ForkKind, ProviderConfig
from ._plan import run
from ._readiness import WebSocketProbe, no_websocket, probe_websocket

if TYPE_CHECKING:
    from denv import WarmPool


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
        warm: Booted spares the server keeps ready for volume forks of this env (0: none).
            With `fork="auto"` (the default), `warm > 0` asks for volume forks: the env
            starts without the launcher and its forks take the spares.
        warm_fork: Declare that the image's server reads `/work` per session,
            not at boot, so children may start from booted spares. Defaults to `warm > 0`.
        websocket: Also require a WebSocket upgrade on `/ws` for readiness (OpenEnv
            servers; the probe opens no session, so an env that allows one keeps it for
            the client). False for a plain HTTP service, ready on `/health` alone.
        fork: How `fork()` branches the env. `"auto"` (default): the env starts under
            denv's launcher (the image is not changed, and serves as it would without it)
            and forks live where its server can be copied, else from a volume snapshot.
            `"live"`: the same, but the start fails with `denv.Conflict`
            (`live_unsupported`) when the server cannot be copied (`--reload`, a server
            that is not uvicorn in Python, one whose trial copy could not serve). A live
            child is a copy of the running server process, OpenEnv sessions included,
            ready in milliseconds.
            `"volume"`: children boot from a snapshot of `/work` (memory is not kept).
        pull: Pull the image when the server's engine does not have it (anonymously
            unless the server allows its registry credentials). Default False: a missing
            image fails the start with `denv.InvalidRequest` (`image_not_found`).
        detach: Keep the envs this provider (and its forks) starts after the provider is
            closed or its process exits, until their `ttl_s` or a stop. Default False: they
            are held by the provider's lease, so a closed provider, an exiting or crashed
            process (renewals stop for 15 s) leaves nothing running. `detach()` keeps one.

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
        fork: ForkKind = "auto",
        pull: bool = False,
        detach: bool = False,
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
            pull,
            detach,
        )
        probe = probe_websocket if config.websocket else no_websocket
        self._binding = Binding(config, probe, connection=None)

    @classmethod
    def _bound(cls, binding: Binding) -> DenvProvider:
        """A provider on `binding` (a fork's child), made without `__init__`."""
        provider: DenvProvider = cls.__new__(cls)
        provider._binding = binding
        return provider

    # -- what the provider is bound to ---------------------------------------------------------

    @property
    def config(self) -> ProviderConfig:
        """The settings this provider was made with (its forks are made with the same)."""
        return self._binding.config

    @property
    def env_id(self) -> str | None:
        """The id of the env this provider runs, or None when it runs none."""
        return self._binding.env_id

    @property
    def base_url(self) -> str | None:
        """The URL an OpenEnv client connects to (holds an ingress capability: keep it private)."""
        return self._binding.base_url

    @property
    def start(self) -> str | None:
        """How the server started the env: `"warm"` (a booted spare) or `"cold"` (a boot)."""
        return self._binding.start

    @property
    def server(self) -> str:
        """The denv server's URL (resolving the embedded default if needed)."""
        return self._binding.look(lambda connection: str(connection.denv.server))

    @property
    def api_key(self) -> str:
        """The API key used for `server` (never shown in repr or logs)."""
        return self._binding.look(lambda connection: connection.api_key)

    @property
    def ws_probe(self) -> WebSocketProbe:
        """The WebSocket readiness check, a seam: tests that replay recorded HTTP (which
        cannot hold a WebSocket) replace it. Forks inherit it."""
        return self._binding.ws_probe

    @ws_probe.setter
    def ws_probe(self, probe: WebSocketProbe) -> None:
        self._binding.ws_probe = probe

    def __repr__(self) -> str:
        binding = self._binding
        server = binding.connection().denv.server if binding.connected else binding.config.server
        return (
            f"DenvProvider(env_id={binding.env_id!r}, image={binding.config.image!r}, "
            f"egress={binding.config.egress!r}, server={server!r})"
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
        binding = self._binding
        with binding.lock:  # one start at a time
            plan = _operations.start_image(binding, image, port, env_vars, kwargs, awaited=False)
            return run(plan, binding)

    def start_version(
        self,
        version_id: str,
        env_vars: Mapping[str, str] | None = None,
        *,
        wait_timeout: float | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> str:
        """Start a new env from a stored version (`ver_...`) and return its base URL."""
        binding = self._binding
        with binding.lock:
            plan = _operations.start_version(
                binding, version_id, env_vars, wait_timeout, labels, awaited=False
            )
            return run(plan, binding)

    def wait_for_ready(self, base_url: str, timeout_s: float | None = None) -> None:
        """Return once `<base_url>/health` answers 200 and a WebSocket opens on `<base_url>/ws`.

        Waits on the server's long-poll, so readiness is noticed at once and a
        crashed env fails at once, with its last log lines (`EnvStartError`);
        `EnvReadyTimeout` after `timeout_s` (default: the start's
        `wait_timeout`, else the constructor's `timeout_s`). Either way the
        env is deleted. A refused API key raises `denv.Unauthorized` at once.
        """
        run(_waits.ready(self._binding, base_url, timeout_s), self._binding)

    def stop_container(self) -> None:
        """Delete the env (at once, no grace period). Safe to call again, or with no env.

        Also lets go of the connection to the server; a later start opens a new one.
        """
        binding = self._binding
        with binding.lock:
            bound = binding.env_id is not None and binding.connected
            if bound and binding.awaited and _async.in_event_loop():
                # OpenEnv's async close() calls this from a coroutine: stop on a thread.
                _operations.stop_on_a_thread(binding.hand_over())
                return
            run(_operations.stop(binding), binding)

    def close(self) -> None:
        """Delete the env, if any, and close the connection to the server (as stop_container)."""
        self.stop_container()

    def detach(self) -> None:
        """Keep this provider's env after the provider is closed or its process exits: it
        is taken out of the lease and lives until its `ttl_s` or `stop_container()`.

        >>> provider.detach()   # e.g. to reconnect later: GenericEnvClient(base_url=...)
        """
        env_id = self._binding.env_id
        if env_id is None:
            raise RuntimeError("detach() needs a running env: start one first")
        self._binding.connection().denv.detach(env_id)

    # -- fork ------------------------------------------------------------------------------------

    @overload
    def fork(self, *, kind: ForkKind | None = None, reseed: bool = True) -> DenvProvider: ...
    @overload
    def fork(
        self, n: int, *, kind: ForkKind | None = None, reseed: bool = True
    ) -> list[DenvProvider]: ...

    def fork(
        self, n: int | None = None, *, kind: ForkKind | None = None, reseed: bool = True
    ) -> DenvProvider | list[DenvProvider]:
        """Snapshot this env once and start children from it, ready (health and WebSocket).

        `fork()` returns one provider bound to a child; `fork(n)` returns n,
        started in parallel by the server from the same snapshot. With a volume fork
        the child's volumes hold the parent's state at the snapshot and its server
        restarts; with a live fork (what `"auto"`, the default, does for an env whose
        server can be copied) the child is a copy of the running server, OpenEnv sessions
        included. A live child draws fresh entropy for Python's `random` and NumPy's
        global generator (`reseed=True`, the default: as a volume child's rebooted server);
        `reseed=False` keeps the parent's state of both (the child draws what the parent
        would have drawn next). Generators the env holds itself are copied either way.
        Nothing is left behind when any child fails: all of them are deleted.
        """
        count = 1 if n is None else n
        plan = _operations.fork(self._binding, count, kind, awaited=False, reseed=reseed)
        children = [DenvProvider._bound(child) for child in run(plan, self._binding)]
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
        env_id = self._binding.env_id
        if env_id is None:
            raise RuntimeError("wait_warm() needs a running env: start one first")
        denv = self._binding.connection().denv
        return _waits.wait_warm_pool(denv, env_id, timeout_s, progress)

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
        plan = _operations.start_image(self._binding, image, port, env_vars, kwargs, awaited=True)
        return await _async.run(plan, self._binding)

    async def start_version_async(
        self,
        version_id: str,
        env_vars: Mapping[str, str] | None = None,
        *,
        wait_timeout: float | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> str:
        """`start_version`, awaited."""
        plan = _operations.start_version(
            self._binding, version_id, env_vars, wait_timeout, labels, awaited=True
        )
        return await _async.run(plan, self._binding)

    async def wait_for_ready_async(self, base_url: str, timeout_s: float | None = None) -> None:
        """`wait_for_ready`, awaited: the server's long-poll, then /health and a WebSocket."""
        await _async.run(_waits.ready(self._binding, base_url, timeout_s), self._binding)

    @overload
    async def fork_async(
        self, *, kind: ForkKind | None = None, reseed: bool = True
    ) -> DenvProvider: ...
    @overload
    async def fork_async(
        self, n: int, *, kind: ForkKind | None = None, reseed: bool = True
    ) -> list[DenvProvider]: ...

    async def fork_async(
        self, n: int | None = None, *, kind: ForkKind | None = None, reseed: bool = True
    ) -> DenvProvider | list[DenvProvider]:
        """`fork`, awaited: one snapshot, `n` children ready, all deleted if any fails.

        >>> branches = await root.provider.fork_async(8)
        """
        count = 1 if n is None else n
        plan = _operations.fork(self._binding, count, kind, awaited=True, reseed=reseed)
        children = [DenvProvider._bound(child) for child in await _async.run(plan, self._binding)]
        return children[0] if n is None else children

    async def stop_container_async(self) -> None:
        """`stop_container`, awaited: the env is deleted when it returns."""
        await _async.run(_operations.stop(self._binding), self._binding)
