"""End to end: `AsyncDenv` on the real local server, on one event loop that never blocks.

`loop_watchdog.watchdog` fails a test whose calls held the event loop (and names the call).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from conftest import LocalDenv
from loop_watchdog import watchdog, watched
from provider_helpers import PROBE_APP, PROBE_IMAGE

from denv import AsyncDenv, EnvStatus

pytestmark = pytest.mark.e2e


def test_the_watchdog_fails_a_blocked_loop_and_names_the_call() -> None:
    async def run() -> None:
        async with watchdog():
            await asyncio.sleep(0.1)
            time.sleep(0.8)  # what a sync call inside a coroutine does to the loop

    with pytest.raises(AssertionError, match=r"(?s)blocked for 0\.[89]\ds.*time\.sleep"):
        asyncio.run(run())


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
