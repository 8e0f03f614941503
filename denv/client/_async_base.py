"""How an `AsyncDenv` reaches its server and awaits one operation (`Denv`'s is in
`denv.client._base`, with the settings both share).

Nothing blocks the event loop: finding the server, building the HTTP client (CA
certificates) and the lease's keeper run on worker threads; each operation of
`denv.client._operations` is awaited through the generated `asyncio_detailed`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from types import TracebackType
from typing import Any, Self, TypeVar, cast

import httpx
from denv_api_client.client import AuthenticatedClient
from denv_api_client.types import UNSET, Unset

from . import _config
from . import _operations as ops
from ._base import ClientSettings
from ._http import api_client, build_async_http_client, tls_verify
from ._operations import Call, Listing
from ._requests import Secret
from .errors import DenvError, LeaseExpired
from .local import resolve_server
from .types import Lease

T = TypeVar("T")


class AsyncClientBase(ClientSettings):
    """The connection half of `AsyncDenv` (its calls are in `denv.client._async`)."""

    def __init__(
        self,
        server: str | None = None,
        api_key: str | None = None,
        *,
        timeout_s: float = _config.DEFAULT_TIMEOUT_S,
        max_retries: int = _config.DEFAULT_MAX_RETRIES,
        ca_bundle: str | os.PathLike[str] | None = None,
        detach: bool = False,
        lease_id: str | None = None,
        lease_timeout_s: float | None = None,
        _transport: httpx.AsyncBaseTransport | None = None,
        _sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        super().__init__(
            server,
            api_key,
            timeout_s=timeout_s,
            max_retries=max_retries,
            ca_bundle=ca_bundle,
            detach=detach,
            lease_id=lease_id,
            lease_timeout_s=lease_timeout_s,
        )
        self._transport = _transport
        self._sleep = _sleep
        self._lock = asyncio.Lock()
        self._lease_lock = asyncio.Lock()

    @classmethod
    async def from_environment(
        cls,
        server: str | None = None,
        api_key: str | None = None,
        *,
        start_local: bool = False,
        timeout_s: float = _config.DEFAULT_TIMEOUT_S,
        max_retries: int = _config.DEFAULT_MAX_RETRIES,
    ) -> Self:
        """`Denv.from_environment`, finding (or starting) the server on a thread."""
        url, key = await asyncio.to_thread(resolve_server, server, api_key, start=start_local)
        return cls(url, key, timeout_s=timeout_s, max_retries=max_retries)

    async def _api(self) -> AuthenticatedClient:
        """The generated client, built on first use; the server is found on a thread."""
        if self._client is not None:
            return self._client
        async with self._lock:
            if self._client is None:
                if self._closed:
                    raise self._closed_error()
                # Reading state files, probing /health, maybe starting `denv serve`, and
                # loading CA certificates for the HTTP client (tens of ms of CPU each time):
                # blocking work that must not stall the event loop.
                server, client = await asyncio.to_thread(self._build)
                self._client, self._server = client, server
            return self._client

    def _build(self) -> tuple[str, AuthenticatedClient]:
        server, key = resolve_server(self._server_arg, self._key_arg)
        self._key = Secret(key)
        http = build_async_http_client(
            server,
            Secret(key),
            timeout_s=self.timeout_s,
            max_retries=self.max_retries,
            transport=self._transport,
            sleep=self._sleep,
            verify=tls_verify(self._ca_bundle),
        )
        return server, api_client(server, Secret(key)).set_async_httpx_client(http)

    async def _call(self, call: Call[T]) -> T:
        if call.holds:
            call = self._with_lease(call, await self._lease())
        client = await self._api()
        try:
            with self._options(call):
                res = await call.operation.asyncio_detailed(
                    *call.args, client=client, **call.kwargs
                )
            return call.result(res)
        except LeaseExpired as exc:
            self._lease_ended(exc)
            raise

    async def _lease(self) -> str | None:
        """`Denv._lease`: opened awaited; its keeper (a thread, and a sync client loading
        CA certificates) is started on a worker thread."""
        if self._detach or self._lease_given is not None:
            return self._lease_given
        async with self._lease_lock:
            if self._keeper is None:
                lease = await self._call(ops.open_lease(self._lease_timeout_s))
                assert self._server is not None
                self._keeper = await asyncio.to_thread(self._keeper_for, lease, self._server)
            return self._keeper.check()

    def _lease_transport(self) -> httpx.BaseTransport | None:
        # A test's stand-in network that also serves sync clients (httpx.MockTransport)
        # carries the renewals too; a real one is the keeper's own.
        transport = self._transport
        return transport if isinstance(transport, httpx.BaseTransport) else None

    async def lease(self) -> Lease | None:
        """`Denv.lease`, awaited."""
        lease_id = await self._lease()
        if lease_id is None:
            return None
        return await self._call(ops.get_lease(lease_id))

    async def _run(self, plan: Generator[Call[Any], Any, T]) -> T:
        """`ClientBase._run`, each call awaited."""
        step = next(plan)
        while True:
            try:
                value = await self._call(step)
            except DenvError as exc:
                try:
                    step = plan.throw(exc)
                except StopIteration as done:
                    return cast(T, done.value)
                continue
            try:
                step = plan.send(value)
            except StopIteration as done:
                return cast(T, done.value)

    async def _list(self, listing: Listing[T]) -> AsyncIterator[T]:
        cursor: str | Unset = UNSET
        while True:
            page = await self._call(listing.page(cursor, self._page_size))
            for item in page.items:
                yield listing.convert(item)
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def aclose(self) -> None:
        """`Denv.close`: the lease is closed on a worker thread, never blocking the loop."""
        async with self._lock:
            self._closed = True
            client = self._client
        if self._keeper is not None:
            await asyncio.to_thread(self._keeper.close)
        if client is not None:
            await client.get_async_httpx_client().aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
