"""The OpenEnv client of the denv env behind one session of this server.

Each session of the exported server talks to its own denv env over one OpenEnv WebSocket
session: reset, step and state as OpenEnv messages, MCP tool calls as `mcp` messages on the
same socket (so tools see the same server-side session as steps). The clients run on one
background event loop; the server's threads and coroutines hand work to it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from openenv.core.generic_client import GenericEnvClient

T = TypeVar("T")
#: Seconds to keep retrying the first WebSocket connection of a new env (its ingress route
#: can lag its health check by a moment).
CONNECT_TIMEOUT_S = 30.0

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _loop_lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="denv-inner", daemon=True)
            thread.start()
            _loop = loop
        return _loop


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on the background loop and wait for it (from any thread but that loop's)."""
    return asyncio.run_coroutine_threadsafe(coro, _background_loop()).result()


async def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Await `coro` on the background loop from another event loop."""
    future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(
        coro, _background_loop()
    )
    return await asyncio.wrap_future(future)


class _Client(GenericEnvClient):  # type: ignore[misc]  # openenv ships no type hints
    """OpenEnv's generic client plus the `mcp` message of its WebSocket protocol."""

    async def mcp(self, request: dict[str, Any]) -> dict[str, Any]:
        response: dict[str, Any] = await self._send_and_receive({"type": "mcp", "data": request})
        data = response.get("data")
        return data if isinstance(data, dict) else {}


class InnerEnv:
    """One connected OpenEnv session on the env at `base_url`; calls are serialized."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self._client = _Client(base_url=base_url, message_timeout_s=300.0)
        self._lock: asyncio.Lock | None = None
        self._next_id = 0
        run(self._connect())

    async def _connect(self) -> None:
        self._lock = asyncio.Lock()
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        delay = 0.05
        while True:
            try:
                await self._client.connect()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _call(self, kind: str, payload: Any = None) -> dict[str, Any]:
        assert self._lock is not None
        async with self._lock:
            if kind == "reset":
                message: dict[str, Any] = {"type": "reset", "data": payload or {}}
            elif kind == "step":
                message = {"type": "step", "data": payload}
            elif kind == "state":
                message = {"type": "state"}
            else:
                self._next_id += 1
                return await self._client.mcp({"jsonrpc": "2.0", "id": self._next_id, **payload})
            response: dict[str, Any] = await self._client._send_and_receive(message)
            data = response.get("data")
            return data if isinstance(data, dict) else {}

    def reset(self, **kwargs: Any) -> dict[str, Any]:
        """The env's own reset: `{"observation", "reward", "done"}`."""
        return run(self._call("reset", kwargs))

    def step(self, action: dict[str, Any]) -> dict[str, Any]:
        return run(self._call("step", action))

    def state(self) -> dict[str, Any]:
        return run(self._call("state"))

    async def mcp(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """A JSON-RPC response (`result` or `error`) to an MCP request, from any event loop."""
        return await run_async(self._call("mcp", {"method": method, "params": params}))

    def close(self) -> None:
        # The env is deleted next: a socket that will not close cleanly is no loss.
        with contextlib.suppress(Exception):
            run(self._client.close())
