"""End to end: `DenvProvider.wait_warm()` on the server's report of an env's warm pool.

A user who asked for `warm=n` spares waits until they are booted, sees progress on the
way, and then every child of a `fork(k <= n)` starts from a spare (`provider.start`).
A pool that cannot fill is reported, not waited on until the timeout.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import LocalDenv, start_server
from denv.openenv import DenvProvider, WarmPoolStalled
from openenv.core import GenericEnvClient
from provider_helpers import ECHO_IMAGE, PROBE_APP, PROBE_IMAGE, assert_gone

from denv import Denv

pytestmark = pytest.mark.e2e


@pytest.fixture
def server_env(denv_server: LocalDenv, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalDenv]:
    monkeypatch.setenv("DENV_SERVER", denv_server.url)
    monkeypatch.setenv("DENV_API_KEY", denv_server.key)
    yield denv_server


def probe_provider(server: LocalDenv, warm: int) -> DenvProvider:
    """A provider of the stdlib probe app (plain HTTP, boots in about a second)."""
    provider = DenvProvider(server.url, server.key, warm=warm, websocket=False)
    base_url = provider.start_container(PROBE_IMAGE, command=["python3", "-c", PROBE_APP])
    provider.wait_for_ready(base_url)
    return provider


def test_wait_warm_then_every_child_of_the_fork_starts_warm(server_env: LocalDenv) -> None:
    provider = DenvProvider(warm=2)
    root = GenericEnvClient.from_docker_image(ECHO_IMAGE, provider=provider).sync()
    children: list[DenvProvider] = []
    try:
        root.reset()
        assert provider.start == "cold"  # a plain start from an image boots
        seen: list[Any] = []
        pool = provider.wait_warm(timeout_s=300, progress=seen.append)
        assert (str(pool.state), pool.target, pool.ready) == ("ready", 2, 2)
        assert seen, "no progress was reported"
        assert (seen[-1].ready, seen[-1].target) == (2, 2)
        readies = [p.ready for p in seen]
        assert readies == sorted(readies), f"progress went backwards: {readies}"
        with Denv(server_env.url, server_env.key) as denv:
            assert denv.warm_pool(provider.env_id or "").ready == 2  # the facade's view
        children = provider.fork(2)
        assert [c.start for c in children] == ["warm", "warm"]
    finally:
        ids = [provider.env_id, *(c.env_id for c in children)]
        for child in children:
            child.close()
        root.close()
    assert_gone(server_env, [i for i in ids if i])


def test_wait_warm_without_spares_returns_at_once(denv_server: LocalDenv) -> None:
    provider = probe_provider(denv_server, warm=0)
    try:
        pool = provider.wait_warm(timeout_s=5)
        assert (str(pool.state), pool.target, pool.ready) == ("none", 0, 0)
        child = provider.fork()
        try:
            assert child.start == "cold"
        finally:
            child.close()
    finally:
        provider.close()


def test_wait_warm_reports_a_pool_that_cannot_fill(tmp_path: Path) -> None:
    # Room for one spare on the whole server, and the env asks for two.
    with start_server(tmp_path / "state", "--warm-max-spares", "1") as srv:
        provider = probe_provider(srv, warm=2)
        try:
            with pytest.raises(WarmPoolStalled) as caught:
                provider.wait_warm(timeout_s=300)
            pool: Any = caught.value.pool
            assert (str(pool.state), pool.target, pool.ready) == ("stalled", 2, 1)
            assert "no room for another spare" in str(caught.value)
            assert "--warm-max-spares" in str(caught.value)
        finally:
            provider.close()


def test_warm_pool_of_another_keys_env_is_not_found(denv_server: LocalDenv) -> None:
    import denv
    from denv.server.auth import create_api_key

    provider = probe_provider(denv_server, warm=0)
    try:
        other = create_api_key(denv_server.state_dir)
        with Denv(denv_server.url, other) as d, pytest.raises(denv.NotFound):
            d.warm_pool(provider.env_id or "")
    finally:
        provider.close()
