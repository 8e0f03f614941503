"""The provider's async half: start, wait, fork and stop without blocking the event loop.

Every server call goes through `denv.AsyncDenv`, every probe through `httpx.AsyncClient` and
the `websockets` asyncio client; the one piece of blocking work (finding or starting the
local server the first time) runs on a worker thread. `DenvProvider`'s `*_async` methods are
these functions; the sync methods stay as they are.

An operation opens its own `AsyncDenv` on the running loop and closes it when done, so a
provider is never tied to one event loop (OpenEnv's `.sync()` clients run a loop of their
own on another thread).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, Protocol, Self, TypeVar

import httpx

from denv import AsyncDenv, Env
from denv.errors import Conflict, DenvError, EnvReadyTimeout, EnvStartError, NotFound

from ._config import ForkKind, ProviderConfig, check_start_options
from ._connection import PROBE_TIMEOUT_S, Connection, default_tls
from ._readiness import (
    WebSocketProbe,
    _session_error,
    child_probe,
    is_loopback,
    no_websocket,
    probe_websocket,
    websocket_url,
)
from ._waits import (
    FAILED,
    LOG_TAIL_LINES,
    MAX_WAIT_S,
    PROBE_BACKOFF_S,
    WS_PROBE_MAX_S,
    agent_url,
    needs_probes,
    start_error,
    timeout_error,
)


class Provider(Protocol):
    """What these functions use of a `DenvProvider`: named here, not imported, since the
    provider's module imports this one."""

    ws_probe: WebSocketProbe
    _config: ProviderConfig
    _connection: Connection | None
    _env_id: str | None
    _origin: str
    _ready_timeout_s: float | None
    _healthy_at_bind: bool
    _async: bool

    @property
    def base_url(self) -> str | None: ...
    def _conn(self) -> Connection: ...
    def _require_unbound(self) -> None: ...
    def _adopt(self, env: Env, what: str) -> str: ...
    def _unbind(self, env_id: str) -> None: ...
    def _blank_child(self, connection: Connection) -> Self: ...
    def stop_container(self) -> None: ...
    def close(self) -> None: ...


P = TypeVar("P", bound=Provider)

logger = logging.getLogger(__name__)


@dataclass
class Link:
    """One async operation's clients: the server's API and plain HTTP for probes."""

    denv: AsyncDenv
    http: httpx.AsyncClient
    connection: Connection


async def _connection(provider: Provider) -> Connection:
    """The provider's (sync) connection: it knows the server and key. Opening it may find
    or start the local server, blocking work kept off the loop."""
    if provider._connection is not None:
        return provider._conn()
    return await asyncio.to_thread(provider._conn)


@asynccontextmanager
async def link(provider: Provider) -> AsyncIterator[Link]:
    connection = await _connection(provider)
    server = await asyncio.to_thread(lambda: connection.denv.server)
    denv = AsyncDenv(server, connection.api_key)
    # Made on a thread: the first one builds the shared TLS context (default_tls).
    http = await asyncio.to_thread(
        httpx.AsyncClient,
        timeout=PROBE_TIMEOUT_S,
        trust_env=not is_loopback(server),
        verify=default_tls(),
    )
    try:
        yield Link(denv, http, connection)
    finally:
        await http.aclose()
        await denv.aclose()


# -- errors, with their log tails fetched without blocking ---------------------------------------


async def _log_tail(denv: AsyncDenv, env_id: str) -> list[str]:
    try:
        return await denv.logs(env_id, tail=LOG_TAIL_LINES)
    except DenvError as exc:
        logger.debug("no logs for env %s: %s", env_id, exc)
        return []


async def _start_error(denv: AsyncDenv, env: Env, origin: str) -> EnvStartError | EnvReadyTimeout:
    have = env.error is not None and bool(env.error.log_tail)
    return start_error(_Tail([] if have else await _log_tail(denv, env.id)), env, origin)


async def _timeout_error(
    denv: AsyncDenv, env_id: str | None, timeout: float, reason: str
) -> EnvReadyTimeout:
    tail = await _log_tail(denv, env_id) if env_id else []
    return timeout_error(_Tail(tail), env_id, timeout, reason)


class _Tail:
    """Stands in for `Denv` where the sync error builders read the log tail: already read."""

    def __init__(self, lines: list[str]) -> None:
        self._lines = lines

    def logs(self, env_id: str, *, service: str | None = None, tail: int = 100) -> list[str]:
        return self._lines[-tail:]


async def _delete_quietly(denv: AsyncDenv, env_id: str) -> None:
    try:
        await denv.delete_env(env_id)
    except Exception as exc:
        logger.warning("could not delete env %s: %s", env_id, exc)


# -- readiness -----------------------------------------------------------------------------------


async def _probe_health(http: httpx.AsyncClient, base_url: str) -> str | None:
    try:
        response = await http.get(base_url.rstrip("/") + "/health")
    except httpx.TransportError as exc:
        return f"GET /health failed: {type(exc).__name__}: {exc}"
    if response.status_code == 200:
        return None
    return f"GET /health answered {response.status_code}"


async def _probe_websocket(base_url: str, timeout_s: float) -> str | None:
    """`probe_websocket` on the asyncio client: open an OpenEnv session, close it."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

    url = websocket_url(base_url)
    proxy: dict[str, Any] = {"proxy": None} if is_loopback(url) else {}
    try:
        async with connect(url, open_timeout=timeout_s, close_timeout=timeout_s, **proxy) as ws:
            await ws.send(json.dumps({"type": "close"}))
            try:
                frame = await asyncio.wait_for(ws.recv(), timeout_s)
            except (ConnectionClosed, TimeoutError):
                return None
            return _session_error(frame)
    except InvalidStatus as exc:
        return f"WebSocket upgrade on /ws answered {exc.response.status_code}"
    except (OSError, InvalidHandshake, ConnectionClosed, TimeoutError) as exc:
        return f"WebSocket upgrade on /ws failed: {type(exc).__name__}: {exc}"


async def _websocket(provider: Provider, base_url: str, timeout_s: float) -> str | None:
    probe = provider.ws_probe
    if probe is no_websocket:
        return None
    if probe is probe_websocket:
        return await _probe_websocket(base_url, timeout_s)
    return await asyncio.to_thread(probe, base_url, timeout_s)  # a test's own seam


async def wait_for_ready(
    provider: Provider, ln: Link, base_url: str, timeout_s: float | None
) -> None:
    """`DenvProvider.wait_for_ready`, awaited (the env is deleted when it fails)."""
    timeout = (
        timeout_s
        if timeout_s is not None
        else provider._ready_timeout_s or provider._config.timeout_s
    )
    env_id, origin = provider._env_id, provider._origin
    deadline = time.monotonic() + timeout
    try:
        if env_id is not None and not provider._healthy_at_bind:
            await _until_healthy(ln.denv, env_id, origin, timeout, deadline)
        await _until_probes_pass(provider, ln, base_url, timeout, deadline)
    except (EnvStartError, EnvReadyTimeout):
        if env_id is not None:
            await _delete_quietly(ln.denv, env_id)
            provider._unbind(env_id)
        raise


async def _until_healthy(
    denv: AsyncDenv, env_id: str, origin: str, timeout: float, deadline: float
) -> None:
    status = "not checked"
    while True:
        remaining = deadline - time.monotonic()
        poll_s = min(remaining, MAX_WAIT_S)
        if poll_s > 0:
            env = await denv.wait_env(env_id, until="healthy", timeout_s=round(poll_s, 3))
            status = str(env.status)
            if status in FAILED:
                raise await _start_error(denv, env, origin)
            if status in ("healthy", "running"):
                return
        if poll_s >= remaining:
            raise await _timeout_error(denv, env_id, timeout, f"still {status}")


async def _until_probes_pass(
    provider: Provider, ln: Link, base_url: str, timeout: float, deadline: float
) -> None:
    env_id, delay = provider._env_id, PROBE_BACKOFF_S[0]
    while True:
        reason = await _probe_health(ln.http, base_url)
        if reason is None:
            remaining = max(deadline - time.monotonic(), 0.5)
            reason = await _websocket(provider, base_url, min(remaining, WS_PROBE_MAX_S))
            if reason is None:
                return
        if env_id is not None:
            env = await ln.denv.get_env(env_id)
            if str(env.status) in FAILED:
                raise await _start_error(ln.denv, env, provider._origin)
        if time.monotonic() + delay > deadline:
            raise await _timeout_error(ln.denv, env_id, timeout, reason)
        await asyncio.sleep(delay)
        delay = min(delay * 2, PROBE_BACKOFF_S[1])


# -- start, fork, stop ---------------------------------------------------------------------------


async def _adopt(provider: Provider, denv: AsyncDenv, env: Env, what: str) -> str:
    """Bind `provider` to a just-created env (the checks of `_adopt` that read the server,
    done here without blocking); delete the env if it is unusable."""
    try:
        if str(env.status) in FAILED:
            raise await _start_error(denv, env, what)
        if agent_url(env) is None:
            raise EnvStartError(
                f"env {env.id} ({what}) has no endpoint for its agent service "
                f"{env.agent_service!r}",
                env_id=env.id,
                fix="Expose the port its OpenEnv server listens on: start_container(port=...).",
            )
    except BaseException:
        await _delete_quietly(denv, env.id)
        raise
    provider._async = True
    return provider._adopt(env, what)  # both checks passed: bookkeeping only, no I/O


async def start_container(
    provider: Provider,
    image: str | None,
    port: int | None,
    env_vars: Mapping[str, str] | None,
    kwargs: dict[str, Any],
) -> str:
    """`DenvProvider.start_container`, awaited; then `wait_for_ready_async`."""
    check_start_options(kwargs)
    config = provider._config
    image = image or config.image
    if not image:
        raise ValueError(
            "no image to start: pass one to start_container_async(image) or DenvProvider(image=...)"
        )
    provider._require_unbound()
    wait_timeout = kwargs.get("wait_timeout")
    async with link(provider) as ln:
        options = config.sandbox_options(port, env_vars, kwargs)
        try:
            env = await ln.denv.create_sandbox(image, live=config.fork != "volume", **options)
        except Conflict as exc:
            if not config.volume_fallback(exc.code):
                raise
            logger.info("fork='auto': %s; starting for volume forks", exc)
            env = await ln.denv.create_sandbox(image, live=False, **options)
        provider._ready_timeout_s = float(wait_timeout) if wait_timeout else None
        return await _adopt(provider, ln.denv, env, f"image {image!r}")


async def start_version(
    provider: Provider,
    version_id: str,
    env_vars: Mapping[str, str] | None,
    wait_timeout: float | None,
    labels: Mapping[str, str] | None,
) -> str:
    """`DenvProvider.start_version`, awaited."""
    config = provider._config
    provider._require_unbound()
    async with link(provider) as ln:
        (env,) = await ln.denv.envs_from_version(
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
        provider._ready_timeout_s = float(wait_timeout) if wait_timeout else None
        return await _adopt(provider, ln.denv, env, f"version {version_id}")


async def ready(provider: Provider, base_url: str, timeout_s: float | None) -> None:
    async with link(provider) as ln:
        await wait_for_ready(provider, ln, base_url, timeout_s)


async def fork(provider: P, count: int, kind: ForkKind | None = None) -> list[P]:
    """`DenvProvider.fork(count)`, awaited: one snapshot, children ready, all or none."""
    env_id, config = provider._env_id, provider._config
    if env_id is None:
        raise RuntimeError(
            "fork_async() needs a running env: start one first (start_container_async(), or "
            "from_denv_version(...))"
        )
    async with link(provider) as ln:
        result = await ln.denv.fork(
            env_id,
            count=count,
            labels=config.merged_labels(),
            ttl_s=config.ttl_s,
            wait="healthy",
            wait_timeout_s=config.timeout_s,
            warm=config.warm,
            kind=config.fork_kind(kind),
        )
        logger.info("forked env %s into %d (version %s)", env_id, count, result.version.id)
        children: list[P] = []
        try:
            for env in result.envs:
                child = provider._blank_child(ln.connection)
                child.ws_probe = child_probe(str(env.start), child.ws_probe)
                children.append(child)
                await _adopt(child, ln.denv, env, f"a fork of {env_id}")
            waits = [
                wait_for_ready(c, ln, c.base_url or "", config.timeout_s)
                for c, env in zip(children, result.envs, strict=True)
                if needs_probes(str(env.start))
            ]
            errors = [e for e in await asyncio.gather(*waits, return_exceptions=True) if e]
            if errors:
                raise errors[0]
        except BaseException:
            await asyncio.gather(
                *(_delete_quietly(ln.denv, env.id) for env in result.envs),
                return_exceptions=True,
            )
            for child in children:
                child._env_id = None  # already deleted: closing it only lets go of the connection
                child.close()
            raise
    return children


async def stop(provider: Provider) -> None:
    """`DenvProvider.stop_container`, awaited: the env is deleted when it returns."""
    env_id = provider._env_id
    if env_id is not None and provider._connection is not None:
        async with link(provider) as ln:
            with suppress(NotFound):
                await ln.denv.delete_env(env_id)
        provider._unbind(env_id)
        logger.info("deleted env %s", env_id)
    provider.stop_container()  # nothing left to delete: lets go of the connection


def in_event_loop() -> bool:
    """True on a thread whose asyncio loop is running (a coroutine called us)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def delete_on_a_thread(connection: Connection, env_id: str) -> None:
    """Delete an env without making the running loop wait (OpenEnv's async `close()` calls
    the provider's sync stop). Not a daemon: the interpreter waits for it before exiting."""

    def run() -> None:
        try:
            with suppress(NotFound):
                connection.denv.delete_env(env_id)
            logger.info("deleted env %s", env_id)
        except Exception as exc:
            logger.warning("could not delete env %s: %s", env_id, exc)
        finally:
            connection.release()

    threading.Thread(target=run, name=f"denv-stop-{env_id}", daemon=False).start()
