"""fork_client / fork_clients: a client of the same class on each child of a live env.

Each child's env belongs to its client: closing the client deletes the env
(the client holds the child's provider, and OpenEnv's close stops it).
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, TypeVar

from openenv.core.env_client import EnvClient
from openenv.core.sync_client import SyncEnvClient

from ._config import ForkKind
from ._provider import DenvProvider

ClientT = TypeVar("ClientT")
# Marks a client setting the installed OpenEnv does not have (so it is not passed on).
_MISSING: Any = object()


def fork_client(client: ClientT, *, kind: ForkKind | None = None) -> ClientT:
    """A new client of the same class (sync stays sync, async stays async) on a fork of its env.

    Example::

        root = GenericEnvClient.from_docker_image(image, provider=DenvProvider()).sync()
        root.reset(); root.step({"message": "prefix"})
        with fork_client(root) as branch:      # its own env, deleted on close
            branch.step({"message": "only in the branch"})
    """
    return fork_clients(client, 1, kind=kind)[0]


def fork_clients(client: ClientT, n: int, *, kind: ForkKind | None = None) -> list[ClientT]:
    """n new clients like `client`, on n children forked from ONE snapshot of its env.

    The children start in parallel and are ready (health and WebSocket) when
    this returns. It blocks; in async code use `await fork_clients_async(client, n)`.
    `kind`: `"volume"`, `"live"` (copies of the running server, its session included) or
    `"auto"`; default: the provider's `fork` setting.
    """
    async_client, is_sync = _unwrap(client)
    children = _provider_of(client, async_client).fork(n, kind=kind)
    return _clients_on(async_client, is_sync, children)


async def fork_client_async(client: ClientT, *, kind: ForkKind | None = None) -> ClientT:
    """`fork_client`, awaited: nothing in it blocks the event loop."""
    return (await fork_clients_async(client, 1, kind=kind))[0]


async def fork_clients_async(
    client: ClientT, n: int, *, kind: ForkKind | None = None
) -> list[ClientT]:
    """`fork_clients`, awaited: n async clients (of the same class) on n children of ONE
    snapshot, each connected, without blocking the event loop.

    Example::

        root = await from_denv_version(GenericEnvClient, "ver_...")
        await root.reset()
        branches = await fork_clients_async(root, 8)
        results = await asyncio.gather(*(b.step(action) for b in branches))
        await asyncio.gather(*(b.close() for b in branches))
    """
    async_client, is_sync = _unwrap(client)
    children = await _provider_of(client, async_client).fork_async(n, kind=kind)
    clients = _clients_on(async_client, is_sync, children)
    if not is_sync:
        try:
            await asyncio.gather(*(c.connect() for c in clients))
        except BaseException:
            await asyncio.gather(*(c.stop_container_async() for c in children))
            raise
    return clients


def _provider_of(client: Any, async_client: Any) -> DenvProvider:
    provider = getattr(async_client, "_provider", None)
    if not isinstance(provider, DenvProvider):
        raise TypeError(
            f"{type(client).__name__} was not started by a DenvProvider, so its env cannot be "
            "forked: create it with from_docker_image(image, provider=DenvProvider()) or "
            "from_denv_version(...)"
        )
    return provider


def _clients_on(async_client: Any, is_sync: bool, children: list[DenvProvider]) -> list[Any]:
    clients: list[Any] = []
    try:
        for child in children:
            forked = _client_on(async_client, child)
            clients.append(forked.sync() if is_sync else forked)
    except BaseException:
        for child in children:
            child.close()
        raise
    return clients


def _unwrap(client: Any) -> tuple[Any, bool]:
    if isinstance(client, SyncEnvClient):
        return client.async_client, True
    if isinstance(client, EnvClient):
        return client, False
    raise TypeError(f"expected an OpenEnv EnvClient or SyncEnvClient, got {type(client).__name__}")


def _client_on(template: Any, provider: DenvProvider) -> Any:
    """A client like `template` (same class, same connection settings) bound to `provider`."""
    settings = {
        "base_url": provider.base_url,
        "connect_timeout_s": getattr(template, "_connect_timeout", _MISSING),
        "message_timeout_s": getattr(template, "_message_timeout", _MISSING),
        "max_message_size_mb": _megabytes(getattr(template, "_max_message_size", _MISSING)),
        "websocket_ping_interval_s": getattr(template, "_websocket_ping_interval_s", _MISSING),
        "websocket_ping_timeout_s": getattr(template, "_websocket_ping_timeout_s", _MISSING),
        "mode": getattr(template, "_mode", _MISSING),
        "headers": getattr(template, "_headers", _MISSING),
        "provider": provider,
    }
    parameters = inspect.signature(type(template)).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    kwargs = {
        name: value
        for name, value in settings.items()
        if value is not _MISSING and (takes_any or name in parameters)
    }
    forked = type(template)(**kwargs)
    if "provider" not in kwargs:
        # A client class that does not take `provider` still closes it: OpenEnv's
        # close stops whatever `_provider` holds.
        forked._provider = provider
    return forked


def _megabytes(size_bytes: Any) -> Any:
    return size_bytes if size_bytes is _MISSING else size_bytes / (1024 * 1024)
