"""End to end: DenvProvider with every way OpenEnv clients are made.

Async clients, `with` blocks, provider-owned start, AutoEnv's keyword arguments, MCP tool
calls (over /ws and over /mcp through the ingress), several clients at once,
from_denv_version, egress allow, and the embedded default (reusing and starting a local
server; no Docker).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import LocalDenv, clean
from denv.openenv import DenvProvider, fork_clients, from_denv_version
from openenv.core import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient
from provider_helpers import ECHO_IMAGE, assert_gone, message, state_of

from denv import Denv, DenvConfigError

pytestmark = pytest.mark.e2e


def provider(server: LocalDenv, **kwargs: Any) -> DenvProvider:
    return DenvProvider(server=server.url, api_key=server.key, **kwargs)


def test_async_client_and_async_forks(denv_server: LocalDenv) -> None:
    async def episode() -> list[str]:
        p = provider(denv_server)
        root = await GenericEnvClient.from_docker_image(ECHO_IMAGE, provider=p)
        ids = [p.env_id]
        async with root:
            await root.reset()
            await root.step(message("async prefix"))
            children = await asyncio.to_thread(fork_clients, root, 2)
            assert all(type(c) is GenericEnvClient for c in children)
            ids += [c.provider.env_id for c in children]
            results = await asyncio.gather(
                *(c.step(message(f"async {i}")) for i, c in enumerate(children))
            )
            assert [r.observation["echoed_message"] for r in results] == ["async 0", "async 1"]
            states = await asyncio.gather(*(c.state() for c in children))
            assert [s["step_count"] for s in states] == [2, 2]
            assert (await root.state())["step_count"] == 1
            for child in children:
                await child.close()
        return [i for i in ids if i]

    assert_gone(denv_server, asyncio.run(episode()))


def test_provider_owned_start_in_with_blocks(denv_server: LocalDenv) -> None:
    with provider(denv_server, image=ECHO_IMAGE) as p:
        with GenericEnvClient(provider=p).sync() as env:
            env.reset()
            assert env.step(message("owned")).observation["echoed_message"] == "owned"
            env_id = p.env_id
            # The same base URL serves OpenEnv's HTTP routes.
            base = str(p.base_url)
            assert httpx.get(f"{base}/health", trust_env=False).status_code == 200
            reset = httpx.post(f"{base}/reset", json={}, trust_env=False, timeout=30)
            assert reset.status_code == 200, reset.text
        assert p.env_id is None  # the client's close stopped it
    assert env_id is not None
    assert_gone(denv_server, [env_id])


def test_autoenv_keyword_arguments(denv_server: LocalDenv) -> None:
    from openenv import AutoEnv

    p = provider(denv_server)
    env = AutoEnv.from_env(
        "echo",
        docker_image=ECHO_IMAGE,
        container_provider=p,
        wait_timeout=90.0,
        env_vars={"ECHO_GREETING": "hi"},
        skip_install=True,
    )
    env_id = p.env_id
    try:
        # AutoEnv hands back an async client; plain calls from sync code work on it.
        assert env.step(message("auto")).observation["echoed_message"] == "auto"
    finally:
        env.close()
    assert_gone(denv_server, [env_id])


def test_mcp_tool_calls_over_ws_and_mcp(denv_server: LocalDenv) -> None:
    p = provider(denv_server)
    with MCPToolClient.from_docker_image(ECHO_IMAGE, provider=p).sync() as env:
        assert {t.name for t in env.list_tools()} == {"echo_message", "echo_with_length"}
        assert env.call_tool("echo_message", message="hi") == "hi"
        assert p.base_url is not None
        with MCPToolClient(base_url=p.base_url, mode="production").sync() as direct:
            assert direct.call_tool("echo_with_length", message="abc") == {
                "message": "abc",
                "length": 3,
            }
        env_id = p.env_id
    assert_gone(denv_server, [env_id])


def test_several_clients_at_once(denv_server: LocalDenv) -> None:
    def one(i: int) -> str:
        p = provider(denv_server)
        client = GenericEnvClient.from_docker_image(ECHO_IMAGE, provider=p).sync()
        try:
            client.reset()
            assert client.step(message(f"c{i}")).observation["echoed_message"] == f"c{i}"
            assert state_of(client)["last_message"] == f"c{i}"
            return str(p.env_id)
        finally:
            client.close()

    with ThreadPoolExecutor(3) as pool:
        env_ids = list(pool.map(one, range(3)))
    assert len(set(env_ids)) == 3
    assert_gone(denv_server, env_ids)


def test_from_denv_version(denv_server: LocalDenv) -> None:
    p = provider(denv_server)
    root = GenericEnvClient.from_docker_image(ECHO_IMAGE, provider=p).sync()
    try:
        root.reset()
        root.step(message("saved"))
        with Denv(denv_server.url, denv_server.key) as denv:
            version = denv.snapshot(str(p.env_id))
    finally:
        root.close()
    env = GenericEnvClient.from_denv_version(version.id, provider=provider(denv_server)).sync()
    plain = from_denv_version(GenericEnvClient, version.id, provider=provider(denv_server)).sync()
    try:
        for client in (env, plain):
            assert state_of(client)["last_message"] == "saved"
        env.step(message("only here"))
        assert state_of(plain)["last_message"] == "saved"
        ids = [env.provider.env_id, plain.provider.env_id]
        # The default runs a version's env live too: its fork copies the running server.
        (child,) = fork_clients(env, 1)
        ids.append(child.provider.env_id)
        with child:
            assert child.provider.start == "live"
            assert state_of(child)["last_message"] == "only here"
        # `live` belongs to creates; a fork that sends it is refused, naming it.
        answer = httpx.post(
            f"{denv_server.url}/v1/envs/{env.provider.env_id}/fork",
            json={"live": True},
            headers={"Authorization": f"Bearer {denv_server.key}"},
        )
        assert answer.status_code == 422 and "kind says how it forks" in answer.text
    finally:
        env.close()
        plain.close()
    assert_gone(denv_server, [p_id for p_id in ids if p_id])


def test_egress_allow_publishes_the_port(denv_server: LocalDenv) -> None:
    # Volume forks: each child is a container of its own, with its port published. (A live
    # child serves in its parent's container and is reached through the ingress.)
    p = provider(denv_server, egress="allow", fork="volume")
    root = GenericEnvClient.from_docker_image(ECHO_IMAGE, provider=p).sync()
    try:
        assert p.base_url is not None and "/ingress/" not in p.base_url
        root.reset()
        root.step(message("open"))
        (child,) = fork_clients(root, 1)
        try:
            assert "/ingress/" not in str(child.provider.base_url)
            assert state_of(child)["last_message"] == "open"
        finally:
            child.close()
    finally:
        root.close()


def test_warm_fork_carries_the_state(denv_server: LocalDenv) -> None:
    # warm=1: the server keeps a booted spare of this configuration; a fork takes it once it
    # has booted (until then children start cold), and the child still sees the root's state.
    p = provider(denv_server, warm=1)
    root = GenericEnvClient.from_docker_image(ECHO_IMAGE, provider=p).sync()
    seen: list[str] = []
    try:
        root.reset()
        root.step(message("before the warm fork"))
        with Denv(denv_server.url, denv_server.key) as denv:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                child = p.fork()
                try:
                    start = str(denv.get_env(str(child.env_id)).start)
                    seen.append(start)
                    if start == "warm":
                        client = GenericEnvClient(base_url=child.base_url, provider=child).sync()
                        assert state_of(client)["last_message"] == "before the warm fork"
                        client.step(message("warm child"))
                        assert state_of(root)["last_message"] == "before the warm fork"
                        client.close()
                        break
                finally:
                    child.close()
    finally:
        root.close()
    assert seen and seen[-1] == "warm", f"no warm child within the deadline: {seen}"


def test_embedded_default_reuses_the_local_server(
    denv_server: LocalDenv, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DENV_SERVER", raising=False)
    monkeypatch.delenv("DENV_API_KEY", raising=False)
    monkeypatch.setenv("DENV_STATE_DIR", str(denv_server.state_dir))
    p = DenvProvider()
    assert p.server == denv_server.url and p.api_key == denv_server.key
    p.close()


def test_embedded_default_starts_a_local_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state_dir = tmp_path / "own-state"
    monkeypatch.delenv("DENV_SERVER", raising=False)
    monkeypatch.delenv("DENV_API_KEY", raising=False)
    monkeypatch.setenv("DENV_STATE_DIR", str(state_dir))
    try:
        with DenvProvider() as p:
            url = p.server
            with Denv(url, p.api_key) as denv:
                assert denv.health().status == "ok"
    finally:
        info = json.loads((state_dir / "server.json").read_text())
        os.kill(int(info["pid"]), signal.SIGTERM)
        clean(state_dir)


def test_no_server_and_no_docker_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DENV_SERVER", raising=False)
    monkeypatch.setenv("DENV_STATE_DIR", str(tmp_path / "none"))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")  # a real absence
    with pytest.raises(DenvConfigError) as info:
        DenvProvider().start_container(ECHO_IMAGE)
    text = str(info.value)
    assert "Docker Engine" in text and "DENV_SERVER" in text and "install" in text
    assert not (tmp_path / "none" / "server.json").exists()
