"""`Blocking`: an `AsyncDenv` driven call by call from sync test code.

The facade's scenarios and retry cases are written once, against `Denv`'s calls; wrapped in
`Blocking`, an `AsyncDenv` runs the very same code, each coroutine awaited on one event loop
(lists are drained with `async for`). So sync and async are held to one set of expectations,
and a replay shows that both send the same requests.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Coroutine
from types import TracebackType
from typing import Any, TypeVar

from denv import AsyncDenv

T = TypeVar("T")


async def _drain(items: AsyncIterator[T]) -> list[T]:
    return [item async for item in items]


class Blocking:
    """Calls `client`'s methods as `Denv`'s are called; every one must be awaited or iterated."""

    def __init__(self, client: AsyncDenv) -> None:
        object.__setattr__(self, "client", client)
        object.__setattr__(self, "_runner", asyncio.Runner())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await `coro` on this wrapper's event loop (the one its client's pool lives on)."""
        result: T = self._runner.run(coro)
        return result

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.client, name)
        if name.startswith("_") or not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            out = attr(*args, **kwargs)
            if inspect.iscoroutine(out):
                return self.run(out)
            assert isinstance(out, AsyncIterator), f"AsyncDenv.{name} returned {out!r}"
            return self.run(_drain(out))

        return call

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.client, name, value)  # e.g. a scenario's `_page_size = 1`

    def close(self) -> None:
        try:
            self.run(self.client.aclose())
        finally:
            self._runner.close()

    def __enter__(self) -> Blocking:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
