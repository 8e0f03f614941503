"""The reference envs on a real Docker Engine, with real OpenEnv clients, without denv.

What denv's fork will do is done here by hand, so the envs are checked on their own: the
parent's volume is copied while its containers are paused (what a snapshot does), and a
child is started over the copy (a cold fork) or handed the copy after it booted (a warm
fork: the echo env reads /work per session). Each module-scoped fixture boots one
container set; the images come from `make images`.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
from conftest import docker_engine
from openenv.core import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient

pytestmark = pytest.mark.e2e
logger = logging.getLogger(__name__)

ECHO_IMAGE = "denv-echo-env:latest"
REDIS_IMAGE = "denv-redis:latest"
COUNTER_IMAGE = "denv-redis-counter-env:latest"
TEST_LABEL = "denv.test"
BOOT_TIMEOUT_S = 120.0


class Engine(NamedTuple):
    client: Any  # docker.DockerClient (the SDK has no type hints)
    labels: dict[str, str]  # on everything this module starts, for cleanup


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    client = docker_engine(ECHO_IMAGE, REDIS_IMAGE, COUNTER_IMAGE)
    labels = {TEST_LABEL: f"envs-{uuid.uuid4().hex[:8]}"}
    yield Engine(client, labels)
    selector = f"{TEST_LABEL}={labels[TEST_LABEL]}"
    for c in client.containers.list(all=True, filters={"label": selector}):
        c.remove(force=True)
    for n in client.networks.list(filters={"label": selector}):
        n.remove()
    client.close()


def _host_port(container: Any, port: int) -> int:
    container.reload()
    return int(container.ports[f"{port}/tcp"][0]["HostPort"])


def wait_healthy(container: Any, url: str, timeout_s: float = BOOT_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        container.reload()
        if container.status == "exited":
            tail = container.logs(tail=30).decode(errors="replace")
            pytest.fail(f"{container.name} exited before /health answered:\n{tail}")
        time.sleep(0.05)
    tail = container.logs(tail=30).decode(errors="replace")
    pytest.fail(f"{container.name}: /health did not answer within {timeout_s}s:\n{tail}")


def run_echo(engine: Engine, work: Path) -> tuple[Any, str, float]:
    """Start the echo env with `work` as /work; return (container, base URL, boot seconds)."""
    start = time.monotonic()
    container = engine.client.containers.run(
        ECHO_IMAGE,
        detach=True,
        labels=engine.labels,
        ports={"8000/tcp": ("127.0.0.1", None)},
        volumes={str(work): {"bind": "/work", "mode": "rw"}},
    )
    url = f"http://127.0.0.1:{_host_port(container, 8000)}"
    wait_healthy(container, url)
    return container, url, time.monotonic() - start


@contextmanager
def paused(*containers: Any) -> Iterator[None]:
    """What a denv snapshot does around copying volumes."""
    for c in containers:
        c.pause()
    try:
        yield
    finally:
        for c in containers:
            c.unpause()


def copy_volume(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)


def echo_step(message: str) -> dict[str, Any]:
    return {"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": message}}


# ---------------------------------------------------------------------------------------
# echo


@pytest.fixture(scope="module")
def echo(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("echo-parent-work")
    container, url, boot_s = run_echo(engine, work)
    logger.info("echo env: docker run to first healthy /health in %.2fs", boot_s)
    yield {"container": container, "url": url, "work": work, "boot_s": boot_s}
    container.remove(force=True)


def test_echo_health_and_boot_time(echo: dict[str, Any], record_property: Any) -> None:
    record_property("echo_boot_s", round(echo["boot_s"], 2))
    assert httpx.get(f"{echo['url']}/health").json() == {"status": "healthy"}


def test_echo_reset_step_state_over_websocket(echo: dict[str, Any]) -> None:
    with GenericEnvClient(base_url=echo["url"]).sync() as env:
        ready = env.reset(episode_id="ep-ws")
        assert ready.observation["metadata"]["status"] == "ready"
        result = env.step(echo_step("hello"))
        assert result.observation["result"]["data"] == "hello"
        result = env.step({"message": "plain"})
        assert result.observation["echoed_message"] == "plain"
        assert result.reward == pytest.approx(0.5)
        state = env.state()
    assert state == {"episode_id": "ep-ws", "step_count": 2, "last_message": "plain"}


def test_echo_mcp_tools(echo: dict[str, Any]) -> None:
    async def call() -> tuple[list[str], Any, Any]:
        async with MCPToolClient(base_url=echo["url"]) as tools:
            names = sorted(t.name for t in await tools.list_tools())
            plain = await tools.call_tool("echo_message", message="hi")
            sized = await tools.call_tool("echo_with_length", message="four")
            return names, plain, sized

    names, plain, sized = asyncio.run(call())
    assert names == ["echo_message", "echo_with_length"]
    assert plain == "hi"
    assert sized == {"message": "four", "length": 4}

    with GenericEnvClient(base_url=echo["url"]).sync() as env:
        env.reset()
        step = env.step(
            {"type": "call_tool", "tool_name": "echo_with_length", "arguments": {"message": "abc"}}
        )
        listed = env.step({"type": "list_tools"})
    assert step.observation["result"]["data"] == {"message": "abc", "length": 3}
    assert {t["name"] for t in listed.observation["tools"]} == {"echo_message", "echo_with_length"}


def test_echo_state_is_saved_under_work(echo: dict[str, Any]) -> None:
    with GenericEnvClient(base_url=echo["url"]).sync() as env:
        env.reset(episode_id="ep-file")
        env.step(echo_step("on disk"))
        state = env.state()
    saved = (echo["work"] / ".denv" / "state.json").read_text()
    assert '"episode_id": "ep-file"' in saved
    assert state["last_message"] == "on disk"
    # Every new session (and plain HTTP GET /state) starts from the saved episode.
    assert httpx.get(f"{echo['url']}/state").json() == state


def test_echo_fork_by_hand_cold_and_warm(
    engine: Engine, echo: dict[str, Any], tmp_path: Path
) -> None:
    parent_url = echo["url"]
    with GenericEnvClient(base_url=parent_url).sync() as env:
        env.reset(episode_id="ep-fork")
        for i in range(5):
            env.step(echo_step(f"prefix {i}"))
        parent_state = env.state()
    assert parent_state["step_count"] == 5

    snapshot = tmp_path / "snapshot"
    with paused(echo["container"]):
        copy_volume(echo["work"], snapshot)

    # Warm: a server that booted over an empty /work gets the fork's volume afterwards.
    child_work = tmp_path / "child-work"
    child_work.mkdir()
    child, child_url, _ = run_echo(engine, child_work)
    try:
        copy_volume(snapshot, child_work)
        with GenericEnvClient(base_url=child_url).sync() as env:
            assert env.state() == parent_state
            env.step(echo_step("branch only"))
            child_state = env.state()
        assert child_state["step_count"] == 6
        assert child_state["last_message"] == "branch only"

        # Cold: the child's server restarts over its volume and continues its own branch.
        child.restart(timeout=0)
        child_url = f"http://127.0.0.1:{_host_port(child, 8000)}"  # a new random host port
        wait_healthy(child, child_url)
        with GenericEnvClient(base_url=child_url).sync() as env:
            assert env.state() == child_state
    finally:
        child.remove(force=True)

    with GenericEnvClient(base_url=parent_url).sync() as env:
        assert env.state() == parent_state, "stepping the branch changed the parent"


# ---------------------------------------------------------------------------------------
# redis-counter: two services, state in Redis


class Counter(NamedTuple):
    containers: list[Any]  # redis, agent
    network: Any
    url: str


def run_counter(engine: Engine, data: Path) -> Counter:
    """Redis over `data` and the counter server on a network of their own."""
    suffix = uuid.uuid4().hex[:10]
    net = engine.client.networks.create(f"denv-test-{suffix}", labels=engine.labels)
    redis = engine.client.containers.run(
        REDIS_IMAGE,
        name=f"denv-test-redis-{suffix}",
        detach=True,
        labels=engine.labels,
        network=net.name,
        volumes={str(data): {"bind": "/data", "mode": "rw"}},
    )
    _wait_redis(redis)
    agent = engine.client.containers.run(
        COUNTER_IMAGE,
        detach=True,
        labels=engine.labels,
        network=net.name,
        environment={"REDIS_URL": f"redis://{redis.name}:6379/0"},
        ports={"8000/tcp": ("127.0.0.1", None)},
    )
    url = f"http://127.0.0.1:{_host_port(agent, 8000)}"
    wait_healthy(agent, url)
    return Counter([redis, agent], net, url)


def _wait_redis(redis: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code, out = redis.exec_run(["redis-cli", "ping"])
        if code == 0 and out.strip() == b"PONG":
            return
        time.sleep(0.1)
    pytest.fail(f"redis did not answer PING: {redis.logs(tail=20).decode(errors='replace')}")


def remove_counter(counter: Counter) -> None:
    for c in reversed(counter.containers):
        c.remove(force=True)
    counter.network.remove()


@pytest.fixture(scope="module")
def counter(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    data = tmp_path_factory.mktemp("redis-parent-data")
    parent = run_counter(engine, data)
    yield {"containers": parent.containers, "url": parent.url, "data": data}
    remove_counter(parent)


def counter_state(url: str) -> dict[str, Any]:
    with GenericEnvClient(base_url=url).sync() as env:
        state: dict[str, Any] = env.state()
    return state


def test_counter_reset_step_state(counter: dict[str, Any]) -> None:
    with GenericEnvClient(base_url=counter["url"]).sync() as env:
        assert env.reset(episode_id="ep-c").observation["count"] == 0
        assert env.step({"delta": 5}).observation["count"] == 5
        assert env.step({"delta": -2}).observation["count"] == 3
    assert counter_state(counter["url"]) == {"episode_id": "ep-c", "step_count": 2, "count": 3}


def test_counter_fork_by_hand_carries_redis_data(
    engine: Engine, counter: dict[str, Any], tmp_path: Path
) -> None:
    with GenericEnvClient(base_url=counter["url"]).sync() as env:
        env.reset(episode_id="ep-cf")
        for delta in (1, 2, 3):
            env.step({"delta": delta})
    parent_state = counter_state(counter["url"])

    child_data = tmp_path / "child-data"
    with paused(*counter["containers"]):
        copy_volume(counter["data"], child_data)
    child = run_counter(engine, child_data)
    try:
        assert counter_state(child.url) == parent_state
        with GenericEnvClient(base_url=child.url).sync() as env:
            assert env.step({"delta": 100}).observation["count"] == 106
    finally:
        remove_counter(child)
    assert counter_state(counter["url"]) == parent_state, "stepping the branch changed the parent"
