"""End to end: DenvProvider under the real OpenEnv client stack, real server, real echo env.

The seed usage runs as written (from_docker_image(image, provider=DenvProvider()), reset,
a prefix, eight single forks, each branch stepping on its own, close, nothing left), then
fork(n) from one snapshot and fork_clients. One root env is booted per module (~5 s).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from conftest import LocalDenv
from denv.openenv import DenvProvider, fork_client, fork_clients
from openenv.core import GenericEnvClient
from openenv.core.sync_client import SyncEnvClient
from provider_helpers import ECHO_IMAGE, assert_gone, live_env_ids, message, state_of

from denv import Denv

pytestmark = pytest.mark.e2e

PREFIX = ["one", "two", "three"]
LABEL = ("suite", "test-provider")


@pytest.fixture(scope="module")
def server_env(denv_server: LocalDenv) -> Iterator[LocalDenv]:
    """DENV_SERVER / DENV_API_KEY point at the test server, so DenvProvider() runs as written."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DENV_SERVER", denv_server.url)
        mp.setenv("DENV_API_KEY", denv_server.key)
        yield denv_server


@pytest.fixture(scope="module")
def root(server_env: LocalDenv) -> Iterator[Any]:
    """A sync echo client on a live env, reset and stepped through PREFIX."""
    provider = DenvProvider(labels=dict([LABEL]))
    client = GenericEnvClient.from_docker_image(ECHO_IMAGE, provider=provider).sync()
    client.reset()
    for text in PREFIX:
        client.step(message(text))
    root_id = provider.env_id
    yield client
    client.close()
    provider.close()
    assert root_id is not None
    assert_gone(server_env, [root_id])
    assert live_env_ids(server_env, LABEL) == []


def test_seed_usage_eight_single_forks(server_env: LocalDenv) -> None:
    # As in issue 4's "Done when", with the echo env's actions.
    root = GenericEnvClient.from_docker_image(ECHO_IMAGE, provider=DenvProvider()).sync()
    root.reset()
    for text in PREFIX:
        root.step(message(text))
    before = state_of(root)
    branches = [root.provider.fork() for _ in range(8)]
    clients = [GenericEnvClient(base_url=b.base_url, provider=b).sync() for b in branches]
    env_ids = [root.provider.env_id, *(b.env_id for b in branches)]
    assert len(set(env_ids)) == 9 and all(b.base_url for b in branches)
    for i, client in enumerate(clients):
        assert state_of(client)["step_count"] == len(PREFIX)
        result = client.step(message(f"branch {i}"))
        assert result.observation["echoed_message"] == f"branch {i}"
    for i, client in enumerate(clients):
        assert state_of(client)["last_message"] == f"branch {i}"
        assert state_of(client)["step_count"] == len(PREFIX) + 1
    assert state_of(root) == before
    for client in clients:
        client.close()
    root.close()
    assert_gone(server_env, [i for i in env_ids if i])


def test_fork_n_starts_children_of_one_snapshot(server_env: LocalDenv, root: Any) -> None:
    before = state_of(root)
    children = root.provider.fork(3)
    assert len(children) == 3 and all(isinstance(c, DenvProvider) for c in children)
    with Denv(server_env.url, server_env.key) as denv:
        envs = [denv.get_env(c.env_id) for c in children]
    assert len({e.version_id for e in envs}) == 1, "fork(n) must take one snapshot"
    assert {e.parent_id for e in envs} == {root.provider.env_id}
    assert all(str(e.status) == "healthy" for e in envs)
    clients = [GenericEnvClient(base_url=c.base_url, provider=c).sync() for c in children]
    for i, client in enumerate(clients):
        client.step(message(f"fork-n {i}"))
        client.step(message(f"fork-n {i} again"))
    states = [state_of(c) for c in clients]
    assert [s["last_message"] for s in states] == [f"fork-n {i} again" for i in range(3)]
    assert all(s["episode_id"] == before["episode_id"] for s in states)
    assert state_of(root) == before
    for client in clients:
        client.close()
    assert_gone(server_env, [e.id for e in envs])


def test_fork_clients_keep_class_and_own_their_envs(server_env: LocalDenv, root: Any) -> None:
    children = fork_clients(root, 2)
    assert all(isinstance(c, SyncEnvClient) for c in children)
    assert all(type(c.async_client) is GenericEnvClient for c in children)
    env_ids = [c.provider.env_id for c in children]
    assert all(env_ids) and len(set(env_ids)) == 2
    children[0].step(message("left"))
    children[1].step(message("right"))
    assert state_of(children[0])["last_message"] == "left"
    assert state_of(children[1])["last_message"] == "right"
    for child in children:
        child.close()  # deletes the child's env, not the root's
    assert_gone(server_env, env_ids)
    assert state_of(root)["last_message"] == PREFIX[-1]


def test_fork_client_in_a_with_block(server_env: LocalDenv, root: Any) -> None:
    with fork_client(root) as child:
        env_id = child.provider.env_id
        assert child.step(message("scoped")).observation["echoed_message"] == "scoped"
    assert_gone(server_env, [env_id])


def test_fork_of_a_fork(server_env: LocalDenv, root: Any) -> None:
    child = fork_client(root)
    try:
        child.step(message("generation 1"))
        grandchild = fork_client(child)
        try:
            assert state_of(grandchild)["last_message"] == "generation 1"
            assert state_of(grandchild)["step_count"] == len(PREFIX) + 1
        finally:
            grandchild.close()
    finally:
        child.close()
    assert state_of(root)["step_count"] == len(PREFIX)
