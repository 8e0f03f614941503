"""End to end: ``denv serve --isolation gvisor`` (issue 45) on Debian's real runsc.

Every env's container runs under the runtime ``denv gvisor install`` registered with the
Docker Engine (``make test`` runs it): a gVisor sandbox with a kernel of its own. OpenEnv's
echo env starts, steps through ingress over a real WebSocket and forks by snapshot with its
state carried into each child; live forks are refused, naming why. A stdlib probe app, run
under gvisor and under the session's runc server side by side, shows what the sandbox's own
kernel changes: syscalls that runc passes to the host's kernel get no kernel under gvisor,
and privileged calls stay refused.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
from conftest import Clients, LocalDenv, docker_engine, instance_id, start_server
from denv.openenv import DenvProvider, fork_clients
from openenv.core import GenericEnvClient
from outside_host import outside_host
from provider_helpers import ECHO_IMAGE, PROBE_IMAGE, message, state_of

from denv import Conflict
from denv.server.gvisor import runtime

pytestmark = pytest.mark.e2e

HOST_RELEASE = Path("/proc/sys/kernel/osrelease").read_text().strip()

# The hardening tests' app (its routes in its docstring): /probe, /connect/, /bomb, /hog.
APP = (Path(__file__).parent / "hardening_app.py").read_text()
# A server of no framework, on asyncio's event loop (epoll), whose state is only its memory:
# a token drawn at its start and a count of GET /count. Nothing under /work. (A server that
# closes its connections first keeps each in TIME_WAIT for 60 s, and a sandbox holding one
# cannot be saved by this runsc: this one, like uvicorn, waits for its client to close.)
MEMORY_APP = """
import asyncio, json, secrets
TOKEN, COUNT = secrets.token_hex(8), [0]
async def serve(reader, writer):
    while head := await reader.read(65536):  # keep-alive, as uvicorn: the client closes first
        if head.split(b" ")[1] == b"/count":
            COUNT[0] += 1
        body = json.dumps({"token": TOKEN, "count": COUNT[0]}).encode()
        writer.write(b"HTTP/1.1 200 OK\\r\\ncontent-type: application/json\\r\\n"
                     b"content-length: %d\\r\\n\\r\\n%s" % (len(body), body))
        await writer.drain()
    writer.close()
async def main():
    server = await asyncio.start_server(serve, "0.0.0.0", 8000)
    await server.serve_forever()
asyncio.run(main())
"""


@pytest.fixture(scope="module")
def gvisor_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    docker_engine(ECHO_IMAGE, PROBE_IMAGE)
    runtime.check(docker.from_env().info().get("Runtimes", {}))  # fails naming make gvisor's fix
    limits = ("--env-pids", "128", "--env-memory", "512")
    with start_server(
        tmp_path_factory.mktemp("denv-gvisor"), "--isolation", "gvisor", *limits
    ) as srv:
        yield srv


def provider(server: LocalDenv) -> DenvProvider:
    return DenvProvider(server=server.url, api_key=server.key)


def runtimes_of(env_ids: list[str]) -> dict[str, str]:
    """The OCI runtime of each env's containers, by env id."""
    engine = docker.from_env()
    found: dict[str, str] = {}
    for env_id in env_ids:
        for c in engine.containers.list(all=True, filters={"label": f"denv.env={env_id}"}):
            found[env_id] = c.attrs["HostConfig"]["Runtime"]
    return found


def kernel_of(env_id: str) -> str:
    engine = docker.from_env()
    (container,) = engine.containers.list(filters={"label": f"denv.env={env_id}"})
    return container.exec_run(["uname", "-r"]).output.decode().strip()


def test_the_registered_runtime_is_this_packages_script() -> None:
    # On the installed wheel: the script the wheel ships is the one the engine runs.
    assert runtime.WRAPPER.read_bytes() == runtime.SCRIPT.read_bytes(), (
        f"{runtime.WRAPPER} is stale: run denv gvisor install"
    )


def test_openenv_env_steps_and_forks_with_its_state_under_gvisor(
    gvisor_server: LocalDenv, clients: Clients
) -> None:
    client = GenericEnvClient.from_docker_image(ECHO_IMAGE, provider=provider(gvisor_server))
    with client.sync() as root:
        root.reset()
        for i in range(3):
            root.step(message(f"prefix {i}"))
        before = state_of(root)
        root_id = root.provider.env_id
        children = fork_clients(root, 4)
        try:
            ids = [c.provider.env_id for c in children]
            steps = [c.step(message(f"branch {n}")) for n, c in enumerate(children)]
            states = [state_of(c) for c in children]
            assert [s.observation["metadata"]["step"] for s in steps] == [4] * 4, steps
            assert {s.observation["echoed_message"] for s in steps} == {
                f"branch {n}" for n in range(4)
            }
            assert [s["step_count"] for s in states] == [4] * 4, states
            assert state_of(root)["step_count"] == before["step_count"] == 3  # root unchanged
            envs = [clients(gvisor_server).get_env(i) for i in ids]
            assert not any(e.live for e in envs) and {e.parent_id for e in envs} == {root_id}
            # The root's WebSocket session was open: this runsc cannot save a connected TCP
            # endpoint, so the children booted from /work, and the session went on.
            assert {e.start for e in envs} == {"cold"}
            assert root.step(message("after the fork")).observation["metadata"]["step"] == 4
            every = [root_id, *ids]
            assert runtimes_of(every) == dict.fromkeys(every, runtime.RUNTIME)
            assert {kernel_of(i) for i in every} != {HOST_RELEASE}
        finally:
            for c in children:
                c.close()


def test_a_fork_resumes_the_parents_sandbox_memory_included(
    gvisor_server: LocalDenv, clients: Clients
) -> None:
    """A fork of kind auto checkpoints the parent's sandbox and each child resumes from it:
    the server's memory (a token drawn at its start, a count) continues in every child, and
    each child counts on its own."""
    denv = clients(gvisor_server)
    env = denv.create_sandbox(PROBE_IMAGE, command=["python3", "-c", MEMORY_APP], wait="healthy")
    parent = env.endpoints[0].url
    for _ in range(3):
        at_fork = get(parent + "/count")
    assert at_fork["count"] == 3
    began = time.monotonic()
    made = denv.fork(env.id, 4, kind="auto", wait="healthy")
    print(f"gvisor fork(4) by restore: {time.monotonic() - began:.2f} s")
    children = [c.endpoints[0].url for c in made.envs]
    assert [c.start for c in made.envs] == ["restored"] * 4
    # Each child's first count continues the parent's memory: same token, 3 + 1.
    assert [get(c + "/count") for c in children] == [{"token": at_fork["token"], "count": 4}] * 4
    assert get(children[0] + "/count")["count"] == 5  # its own, not its siblings'
    assert [get(c + "/health")["count"] for c in children[1:]] == [4, 4, 4]
    assert get(parent + "/health") == at_fork  # the parent was not counted by its children
    every = [env.id, *(c.id for c in made.envs)]
    assert runtimes_of(every) == dict.fromkeys(every, runtime.RUNTIME)
    for child in made.envs:
        denv.delete_env(child.id)
    denv.delete_env(env.id)


def test_live_is_refused_under_gvisor_naming_why(
    gvisor_server: LocalDenv, clients: Clients
) -> None:
    denv = clients(gvisor_server)
    with pytest.raises(Conflict) as refused:
        denv.create_sandbox(ECHO_IMAGE, live=True)
    assert refused.value.code == "live_unsupported"
    assert "--isolation gvisor" in str(refused.value) and "kind volume" in str(refused.value)
    assert list(denv.list_envs()) == []  # nothing was started, nothing is left


def probe_env(server: LocalDenv, clients: Clients, **options: Any) -> tuple[str, str]:
    env = clients(server).create_sandbox(PROBE_IMAGE, command=["python3", "-c", APP], **options)
    return env.id, env.endpoints[0].url


def get(url: str, timeout: float = 30) -> dict[str, Any]:
    with httpx.Client(trust_env=False, timeout=timeout) as http:
        res = http.get(url)
    assert res.status_code == 200, res.text
    found: dict[str, Any] = res.json()
    return found


def test_gvisors_kernel_answers_what_runc_passes_to_the_hosts(
    gvisor_server: LocalDenv, denv_server: LocalDenv, clients: Clients
) -> None:
    _, on_runc = probe_env(denv_server, clients)
    _, on_gvisor = probe_env(gvisor_server, clients)
    runc, gvisor = get(on_runc + "/probe"), get(on_gvisor + "/probe")
    print(json.dumps({"runc": runc, "gvisor": gvisor}, indent=1))
    assert runc["release"] == HOST_RELEASE
    assert gvisor["release"] != HOST_RELEASE and HOST_RELEASE not in gvisor["proc_version"]
    # The host's kernel runs these for a runc container; under gvisor no kernel has them.
    assert set(runc["syscalls"].values()) == {"ok"}, runc["syscalls"]
    assert set(gvisor["syscalls"].values()) == {"ENOSYS"}, gvisor["syscalls"]
    # Privileged calls stay refused under either, and no device node opens onto a host disk.
    for found in (runc, gvisor):
        assert all(v.startswith("refused") for v in found["privileged"].values()), found


def test_a_fork_bomb_under_gvisor_leaves_its_neighbours_and_the_host_alone(
    gvisor_server: LocalDenv, clients: Clients
) -> None:
    denv = clients(gvisor_server)
    bomber, bomber_url = probe_env(gvisor_server, clients)
    sibling, sibling_url = probe_env(gvisor_server, clients)
    try:  # a sandbox that died answers nothing: 30 s, not bomb's 20 s and more
        result: dict[str, Any] | str = get(bomber_url + "/bomb", timeout=30)
    except (httpx.HTTPError, AssertionError) as exc:
        result = f"no answer ({type(exc).__name__})"  # the sandbox itself ran out of pids
    host = sum(subprocess.run(["true"], check=False).returncode == 0 for _ in range(5))
    print(f"gvisor fork bomb: {result}; bomber {denv.get_env(bomber).status}")
    # gVisor's ptrace platform spends host threads per guest thread, under the same pids
    # cgroup: the guest gets EAGAIN or the sandbox ends, either way within its own limit.
    assert isinstance(result, str) or (result["error"] == "EAGAIN" and result["forked"] < 128)
    assert get(sibling_url + "/health") == {"ok": True}
    assert denv.get_env(sibling).status == "healthy"
    assert host == 5


def test_egress_rules_hold_under_gvisor(gvisor_server: LocalDenv, clients: Clients) -> None:
    # The outside host is a network namespace of this test's (tests/e2e/outside_host.py).
    with outside_host() as outside:
        target = f"{outside.address}:{outside.tcp_targets()[0][1]}"
        _, deny = probe_env(gvisor_server, clients)
        _, allow = probe_env(gvisor_server, clients, egress="allow")
        denied = get(f"{deny}/connect/{target}")["result"]
        seen_after_deny = list(outside.seen)
        allowed = get(f"{allow}/connect/{target}")["result"]
    print(f"gvisor egress: deny {denied}, allow {allowed}")
    assert denied != "connected" and seen_after_deny == []
    assert allowed == "connected"  # the positive control: the probe would see a leak


def test_a_memory_hog_under_gvisor_fails_its_env_alone(
    gvisor_server: LocalDenv, clients: Clients
) -> None:
    denv = clients(gvisor_server)
    hog, hog_url = probe_env(gvisor_server, clients)
    sibling, sibling_url = probe_env(gvisor_server, clients)
    with contextlib.suppress(httpx.HTTPError, AssertionError):  # it dies mid-request
        get(hog_url + "/hog", timeout=15)
    deadline = time.monotonic() + 60
    while (env := denv.get_env(hog)).status != "failed":
        assert time.monotonic() < deadline, env.status
        time.sleep(0.5)
    print(f"gvisor memory hog: {env.error}")
    assert env.error is not None
    assert get(sibling_url + "/health") == {"ok": True}
    assert denv.get_env(sibling).status == "healthy"


def test_warm_spares_are_refused_under_gvisor(gvisor_server: LocalDenv, clients: Clients) -> None:
    # A spare's /work is mounted after it boots, and a gVisor sandbox sees no mount made
    # after its start: a fork into spares got children at step 0, their /work not theirs.
    denv = clients(gvisor_server)
    env_id, _ = probe_env(gvisor_server, clients)
    for ask in (
        lambda: denv.create_sandbox(PROBE_IMAGE, command=["python3", "-c", APP], warm=1),
        lambda: denv.fork(env_id, 1, warm=1),
    ):
        with pytest.raises(Conflict) as refused:
            ask()
        said = str(refused.value)
        assert "warm spares are not available" in said and "--isolation gvisor" in said
    assert [e.id for e in denv.list_envs()] == [env_id]  # nothing else was started
    mine = [f"denv.instance={instance_id(gvisor_server.state_dir)}", "denv.warm"]
    assert not docker.from_env().containers.list(filters={"label": mine})


def test_compose_services_run_and_fork_under_gvisor(
    gvisor_server: LocalDenv, clients: Clients
) -> None:
    # Two services, one of them Redis (C): the counter's episode lives in Redis's volume.
    denv = clients(gvisor_server)
    compose = (Path(__file__).parents[2] / "envs" / "redis-counter" / "compose.yaml").read_text()
    version = denv.deploy("gvisor-counter", compose)
    (env,) = denv.envs_from_version(version.id, 1)
    with GenericEnvClient(base_url=env.endpoints[0].url).sync() as counter:
        counter.reset(episode_id="ep-gvisor")
        for delta in (1, 2, 3):
            counter.step({"delta": delta})
    children = denv.fork(env.id, 2).envs
    for child in children:
        with GenericEnvClient(base_url=child.endpoints[0].url).sync() as forked:
            assert forked.state()["count"] == 6
    every = [env.id, *(c.id for c in children)]
    engine = docker.from_env()
    found = {
        c.labels["denv.service"]: c.attrs["HostConfig"]["Runtime"]
        for i in every
        for c in engine.containers.list(filters={"label": f"denv.env={i}"})
    }
    assert found == {"redis": runtime.RUNTIME, "agent": runtime.RUNTIME}
