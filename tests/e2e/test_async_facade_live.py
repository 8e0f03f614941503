"""End to end: `AsyncDenv` on the real local server, on one event loop that never blocks.

A watchdog task ticks every 50 ms while the calls run; a gap between two ticks longer than
`MAX_GAP_S` means something blocked the loop (a sync HTTP call, finding the server, a sleep).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import TypeVar

import pytest
from conftest import LocalDenv
from provider_helpers import PROBE_APP, PROBE_IMAGE

from denv import AsyncDenv, EnvStatus

pytestmark = pytest.mark.e2e

TICK_S = 0.05
MAX_GAP_S = 0.5
T = TypeVar("T")


@asynccontextmanager
async def watchdog() -> AsyncIterator[list[float]]:
    """Yields the gaps between ticks seen so far; fails if the loop stalled past MAX_GAP_S."""
    gaps: list[float] = []
    last = [time.monotonic()]

    async def tick() -> None:
        while True:
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            gaps.append(now - last[0])
            last[0] = now

    task = asyncio.create_task(tick())
    try:
        yield gaps
    finally:
        task.cancel()
    gaps.append(time.monotonic() - last[0])  # a stall after the last tick counts too
    assert max(gaps) <= MAX_GAP_S, f"the event loop was blocked for {max(gaps):.2f}s"


async def watched(call: Awaitable[T]) -> T:
    async with watchdog():
        return await call


def test_64_concurrent_get_env_never_block_the_loop(denv_server: LocalDenv) -> None:
    async def run() -> None:
        async with AsyncDenv(denv_server.url, denv_server.key) as denv, watchdog() as gaps:
            env = await denv.create_sandbox(PROBE_IMAGE, command=["python3", "-c", PROBE_APP])
            try:
                got = await asyncio.gather(*(denv.get_env(env.id) for _ in range(64)))
                assert {e.id for e in got} == {env.id}
                assert all(e.status is EnvStatus.HEALTHY for e in got)
            finally:
                await denv.delete_env(env.id)
            assert len(gaps) > 1

    asyncio.run(run())


def test_create_fork_delete_through_asyncdenv(denv_server: LocalDenv) -> None:
    async def run() -> None:
        async with AsyncDenv(denv_server.url, denv_server.key) as denv:
            env = await watched(
                denv.create_sandbox(PROBE_IMAGE, command=["python3", "-c", PROBE_APP])
            )
            assert env.status is EnvStatus.HEALTHY
            fork = await watched(denv.fork(env.id, count=2))
            children = [child.id for child in fork.envs]
            assert len(set(children)) == 2
            assert all(c.parent_id == env.id and c.status is EnvStatus.HEALTHY for c in fork.envs)
            listed = [e.id async for e in denv.list_envs(version_id=fork.version.id)]
            assert sorted(listed) == sorted(children)
            await asyncio.gather(*(denv.delete_env(i) for i in [*children, env.id]))
            gone = await asyncio.gather(*(denv.get_env(i) for i in [*children, env.id]))
            assert {e.status for e in gone} == {EnvStatus.DELETED}
            await denv.delete_version(fork.version.id)

    asyncio.run(run())


def test_the_server_is_found_from_the_environment_without_blocking(
    denv_server: LocalDenv, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DENV_SERVER", denv_server.url)
    monkeypatch.setenv("DENV_API_KEY", denv_server.key)

    async def run() -> None:
        async with AsyncDenv() as denv, watchdog():
            health = await denv.health()
            assert health.status.value == "ok"

    asyncio.run(run())
