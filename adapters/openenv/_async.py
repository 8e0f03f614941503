"""The provider's async runner: a plan (`_plan`) awaited without blocking the event loop.

Every server call goes through `denv.AsyncDenv`, every probe through `httpx.AsyncClient` and
the `websockets` asyncio client; the one piece of blocking work (finding or starting the
local server the first time) runs on a worker thread. `DenvProvider`'s `*_async` methods run
the same plans as its sync methods, here.

A run opens its own `AsyncDenv` on the running loop and closes it when done, so a provider
is never tied to one event loop (OpenEnv's `.sync()` clients run a loop of their own on
another thread).
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar, cast

import httpx

from denv import AsyncDenv

from ._connection import PROBE_TIMEOUT_S, Connection, default_tls
from ._plan import Api, ConnectionSource, Get, Plan, Progress, Sleep, Step, Together, WebSocket
from ._readiness import is_loopback, no_websocket, probe_websocket, probe_websocket_async

T = TypeVar("T")


async def run(plan: Plan[T], source: ConnectionSource) -> T:
    """Run `plan` to its result on the running loop, reaching the server `source` names."""
    link = _Link(source)
    try:
        return await _drive(plan, link)
    finally:
        await link.aclose()


async def _drive(plan: Plan[T], link: _Link) -> T:
    progress = Progress(plan)
    while progress.step is not None:
        try:
            value = await link.take(progress.step)
        except BaseException as exc:
            progress.throw(exc)
        else:
            progress.send(value)
    return cast(T, progress.result)


class _Link:
    """One run's clients, opened at the first step that needs them: the server's API, and
    plain HTTP for probes."""

    def __init__(self, source: ConnectionSource) -> None:
        self._source = source
        self._clients: tuple[AsyncDenv, httpx.AsyncClient] | None = None
        self._opening = asyncio.Lock()

    async def take(self, step: Step) -> Any:
        if isinstance(step, Api):
            denv, _ = await self._open()
            return await getattr(denv, step.method)(*step.args, **step.kwargs)
        if isinstance(step, Get):
            _, http = await self._open()
            return await http.get(step.url)
        if isinstance(step, WebSocket):
            return await _websocket(step)
        if isinstance(step, Sleep):
            await asyncio.sleep(step.seconds)
            return None
        return await self._together(step)

    async def _together(self, step: Together) -> list[BaseException | None]:
        outcomes = await asyncio.gather(
            *(_drive(plan, self) for plan in step.plans), return_exceptions=True
        )
        return [o if isinstance(o, BaseException) else None for o in outcomes]

    async def _open(self) -> tuple[AsyncDenv, httpx.AsyncClient]:
        async with self._opening:  # the plans of a Together share one set
            if self._clients is None:
                connection = await self._connection()
                server = await asyncio.to_thread(lambda: connection.denv.server)
                # The provider's lease (its sync client renews and closes it): this run's
                # client, closed when the run ends, only sends it with its creates.
                lease_id = await asyncio.to_thread(connection.lease_id)
                denv = AsyncDenv(server, connection.api_key, detach=True, lease_id=lease_id)
                # Made on a thread: the first one builds the shared TLS context (default_tls).
                http = await asyncio.to_thread(
                    httpx.AsyncClient,
                    timeout=PROBE_TIMEOUT_S,
                    trust_env=not is_loopback(server),
                    verify=default_tls(),
                )
                self._clients = denv, http
            return self._clients

    async def _connection(self) -> Connection:
        """The provider's (sync) connection: it knows the server and key. Opening it may find
        or start the local server, blocking work kept off the loop."""
        if self._source.connected:
            return self._source.connection()
        return await asyncio.to_thread(self._source.connection)

    async def aclose(self) -> None:
        if self._clients is not None:
            denv, http = self._clients
            self._clients = None
            await http.aclose()
            await denv.aclose()


async def _websocket(step: WebSocket) -> str | None:
    probe = step.probe
    if probe is no_websocket:
        return None
    if probe is probe_websocket:
        return await probe_websocket_async(step.base_url, step.timeout_s)
    return await asyncio.to_thread(probe, step.base_url, step.timeout_s)  # a test's own seam


def in_event_loop() -> bool:
    """True on a thread whose asyncio loop is running (a coroutine called us)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
