"""`AsyncDenv` on the facade's recorded cassettes, and its shape beside `Denv`.

The replays run the very scenarios the cassettes were recorded with
(tests/unit/facade_scenarios.py), each call awaited on one event loop through
tests/unit/async_driver.py, under the same strict matcher as the sync replays (method, path,
query, JSON body, Authorization and Idempotency-Key): the async facade sends what `Denv`
sends, and makes the same values and errors of the answers.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from typing import Any

import pytest
from async_driver import Blocking
from cassette_match import replay as replaying
from facade_scenarios import CASSETTE_KEY, CASSETTE_SERVER, SCENARIOS, UNKNOWN_ENV

import denv.client.local
from denv import AsyncDenv, Denv, DenvError, EnvStatus, InvalidRequest, NotFound


async def _no_retry(seconds: float) -> None:
    raise AssertionError(f"the facade tried to retry (after {seconds}s) during a replay")


def _sync_no_retry(seconds: float) -> None:
    raise AssertionError(f"the facade tried to retry (after {seconds}s) during a replay")


def replay_async(name: str) -> Any:
    with (
        replaying(f"{name}.yaml"),
        Blocking(AsyncDenv(CASSETTE_SERVER, CASSETTE_KEY, _sleep=_no_retry, detach=True)) as denv,
    ):
        return SCENARIOS[name](denv)


def replay_sync(name: str) -> Any:
    with (
        replaying(f"{name}.yaml"),
        Denv(CASSETTE_SERVER, CASSETTE_KEY, _sleep=_sync_no_retry, detach=True) as denv,
    ):
        return SCENARIOS[name](denv)


def _comparable(value: Any) -> Any:
    """Records compare as they are; an error by its class and what it carries."""
    if isinstance(value, DenvError):
        return (type(value), value.status, value.code, value.message)
    if isinstance(value, tuple | list):
        return [_comparable(v) for v in value]
    return value


# bad_key runs a sync `Denv` of its own, so it says nothing about AsyncDenv.
ASYNC_SCENARIOS = sorted(set(SCENARIOS) - {"bad_key"})


@pytest.mark.parametrize("name", ASYNC_SCENARIOS)
def test_every_scenario_replays_through_asyncdenv_to_the_same_values(name: str) -> None:
    assert _comparable(replay_async(name)) == _comparable(replay_sync(name))


def test_create_sandbox() -> None:
    env = replay_async("create_sandbox")
    assert env.status is EnvStatus.HEALTHY and env.labels["scenario"] == "create_sandbox"


def test_get_env() -> None:
    env, got = replay_async("get_env")
    assert got.id == env.id and got.status is EnvStatus.HEALTHY


def test_fork_with_count_2() -> None:
    env, forked = replay_async("fork")
    assert len({child.id for child in forked.envs}) == 2
    assert all(child.parent_id == env.id for child in forked.envs)


def test_list_envs_follows_cursors_as_an_async_iterator() -> None:
    with (
        replaying("list_envs.yaml") as wire,
        Blocking(
            AsyncDenv(CASSETTE_SERVER, CASSETTE_KEY, _sleep=_no_retry, detach=True)
        ) as blocking,
    ):
        created, listed, by_version = SCENARIOS["list_envs"](blocking)
    assert [e.id for e in listed] == [e.id for e in reversed(created)]
    assert [e.id for e in by_version] == [created[0].id]
    pages = [uri for uri in wire.uris() if uri.split("?")[0].endswith("/v1/envs")]
    assert "cursor=" not in pages[0] and "cursor=" in pages[1]


def test_errors_are_the_typed_exceptions() -> None:
    missing = replay_async("unknown_env")
    assert isinstance(missing, NotFound) and UNKNOWN_ENV in missing.message
    assert (missing.status, missing.code) == (404, "not_found")
    invalid = replay_async("count_above_limit")
    assert isinstance(invalid, InvalidRequest) and invalid.code == "limit_exceeded"


def test_a_list_is_fetched_only_as_it_is_iterated() -> None:
    async def run() -> None:
        async with AsyncDenv("http://127.0.0.1:1", CASSETTE_KEY) as client:
            client.list_envs()  # not iterated: nothing is sent, so no error either

    asyncio.run(run())


# -- the same facade


PUBLIC = sorted(
    name for name, member in vars(Denv).items() if callable(member) and not name.startswith("_")
)


@pytest.mark.parametrize("name", PUBLIC)
def test_every_denv_call_is_an_asyncdenv_call_with_the_same_parameters(name: str) -> None:
    sync, async_ = getattr(Denv, name), getattr(AsyncDenv, name)
    assert inspect.signature(sync).parameters == inspect.signature(async_).parameters
    assert async_.__doc__ == sync.__doc__
    if name.startswith("list_"):
        assert inspect.isasyncgenfunction(AsyncDenv._list)
    else:
        assert inspect.iscoroutinefunction(async_)


def test_the_constructor_does_no_io_and_the_server_is_found_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads: list[threading.Thread] = []

    def resolve(server: str | None, key: str | None, **_: Any) -> tuple[str, str]:
        threads.append(threading.current_thread())
        return "http://127.0.0.1:1", CASSETTE_KEY

    monkeypatch.setattr("denv.client._async_base.resolve_server", resolve)
    monkeypatch.setattr(denv.client.local, "resolve_server", resolve)
    client = AsyncDenv()
    assert not threads and repr(client) == "AsyncDenv(server=None)"

    async def first_use() -> None:
        await client._api()
        await client._api()
        await client.aclose()

    asyncio.run(first_use())
    assert len(threads) == 1 and threads[0] is not threading.main_thread()
    assert repr(client) == "AsyncDenv(server='http://127.0.0.1:1')"


def test_a_closed_client_refuses_calls() -> None:
    async def run() -> None:
        client = AsyncDenv("http://127.0.0.1:1", CASSETTE_KEY)
        async with client:
            pass
        with pytest.raises(RuntimeError, match="closed"):
            await client.get_env(UNKNOWN_ENV)

    asyncio.run(run())


def test_the_key_is_in_no_repr_and_no_error(closed_port_url: str) -> None:
    key = "dak_" + "SeCrEt0123456789" * 2 + "abcdefghijk"

    async def run() -> str:
        async with AsyncDenv(closed_port_url, key, max_retries=0) as client:
            with pytest.raises(DenvError) as info:
                await client.get_env(UNKNOWN_ENV)
            api = await client._api()
            return f"{client!r} {api!r} {info.value} {info.value!r}"

    assert key not in asyncio.run(run())
