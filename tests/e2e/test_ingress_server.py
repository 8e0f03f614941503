"""A deny env created through the real server, driven through its ingress URL.

The server (``denv_server``, tests/conftest.py) runs the real OpenEnv echo env image on an
internal network; the test reaches it only through ``/ingress/<token>``: HTTP (health,
schema, reset) and the WebSocket that OpenEnv clients step over, by several clients at
once. From inside the env, the host (bridge gateway: the server's port and a port this
test listens on) cannot be reached. After DELETE the ingress URL answers 404.
"""

from __future__ import annotations

import hashlib
import json
import select
import socket
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from conftest import LocalDenv, docker_engine

pytestmark = pytest.mark.e2e

IMAGE = "denv-echo-env:latest"
PORT = 8000

PROBE = r"""
import json, socket, sys
out = []
for host, port in json.loads(sys.argv[1]):
    try:
        socket.create_connection((host, port), timeout=3).close()
        out.append("connected")
    except Exception as exc:
        out.append(type(exc).__name__)
print(json.dumps(out))
"""


def _docker() -> Any:
    return docker_engine(IMAGE)


@pytest.fixture(scope="module")
def deny_env(denv_server: LocalDenv) -> Iterator[dict[str, Any]]:
    _docker()
    headers = {"Authorization": f"Bearer {denv_server.key}"}
    with httpx.Client(base_url=denv_server.url, headers=headers, timeout=180, trust_env=False) as c:
        res = c.post(
            "/v1/sandboxes",
            json={"image": IMAGE, "ports": [PORT], "env": {"MAX_CONCURRENT_ENVS": "16"}},
        )
        assert res.status_code == 201, res.text
        env: dict[str, Any] = res.json()
        try:
            yield env
        finally:
            assert c.delete(f"/v1/envs/{env['id']}").status_code == 204


def base_url(env: dict[str, Any]) -> str:
    (endpoint,) = env["endpoints"]
    assert endpoint["via"] == "ingress"
    return str(endpoint["url"]).rstrip("/")


def test_http_through_ingress(denv_server: LocalDenv, deny_env: dict[str, Any]) -> None:
    assert deny_env["egress"] == "deny" and deny_env["status"] == "healthy"
    base = base_url(deny_env)
    assert base.startswith(f"{denv_server.url}/ingress/")
    token = urlsplit(base).path.split("/")[2]
    assert len(token) >= 22  # >= 128 bits of URL-safe base64
    with httpx.Client(trust_env=False, timeout=30) as http:
        assert http.get(f"{base}/health").status_code == 200
        assert "action" in http.get(f"{base}/schema").json()
        reset = http.post(f"{base}/reset", json={})
        assert reset.status_code == 200, reset.text
        assert reset.json()["observation"]["metadata"]["status"] == "ready"
        wrong = http.get(base[: -len(token)] + token[::-1] + "/health")
        assert wrong.status_code == 404
        assert wrong.json()["code"] == "not_found" and token not in wrong.text


def test_ingress_carries_bodies_larger_than_the_api_limit(deny_env: dict[str, Any]) -> None:
    # The API caps bodies at 1 MiB; env traffic through ingress is the env's business.
    message = "x" * (2 * 1024 * 1024)
    with httpx.Client(trust_env=False, timeout=60) as http:
        res = http.post(f"{base_url(deny_env)}/step", json={"action": {"message": message}})
    assert res.status_code == 200, res.text[:500]
    assert res.json()["observation"]["echoed_message"] == message


def test_openenv_websocket_steps_through_ingress(deny_env: dict[str, Any]) -> None:
    from openenv.core.generic_client import GenericEnvClient

    times: list[float] = []
    with GenericEnvClient(base_url=base_url(deny_env)).sync() as env:
        env.reset()
        for i in range(200):
            message = f"step-{i}"
            start = time.perf_counter()
            result = env.step({"message": message})
            times.append(time.perf_counter() - start)
            assert result.observation["echoed_message"] == message
    print(
        f"ingress: 200 OpenEnv WebSocket steps through the server, "
        f"median {statistics.median(times) * 1e6:.0f} us per step"
    )


def test_concurrent_clients_through_ingress(deny_env: dict[str, Any]) -> None:
    from openenv.core.generic_client import GenericEnvClient

    def client(i: int) -> int:
        with GenericEnvClient(base_url=base_url(deny_env)).sync() as env:
            env.reset()
            for j in range(25):
                message = f"client-{i}-step-{j}-{time.monotonic_ns()}"
                assert env.step({"message": message}).observation["echoed_message"] == message
        return 25

    with ThreadPoolExecutor(8) as pool:
        checked = sum(pool.map(client, range(8)))
    print(f"ingress: 8 concurrent OpenEnv clients, {checked} unique steps, 0 crossed or lost")


def test_server_logs_show_the_token_only_redacted(
    denv_server: LocalDenv, deny_env: dict[str, Any]
) -> None:
    from openenv.core.generic_client import GenericEnvClient

    base = base_url(deny_env)
    token = urlsplit(base).path.split("/")[2]
    with httpx.Client(trust_env=False, timeout=30) as http:
        assert http.get(f"{base}/health?token={token}").status_code == 200
    with GenericEnvClient(base_url=base).sync() as env:  # its WebSocket is logged, accepted
        env.reset()
    logs = [denv_server.state_dir / n for n in ("server.log", "server.out")]
    text = "".join(p.read_text(errors="replace") for p in logs)
    digest = hashlib.sha256(token.encode()).hexdigest()
    assert f'"WebSocket /ingress/sha256:{digest[:8]}/ws" [accepted]' in text
    assert token not in text and denv_server.key not in text
    print(f"ingress: the token in {len(text)} chars of server.log and console: 0 times")


def test_deny_env_cannot_reach_the_host(denv_server: LocalDenv, deny_env: dict[str, Any]) -> None:
    docker = _docker()
    (container,) = docker.containers.list(filters={"label": f"denv.env={deny_env['id']}"})
    (network,) = container.attrs["NetworkSettings"]["Networks"].keys()
    net = docker.networks.get(network)
    assert net.attrs["Internal"] is True
    assert net.attrs["Options"]["com.docker.network.bridge.name"].startswith("dvd")
    gateway = net.attrs["IPAM"]["Config"][0]["Gateway"]

    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen()
    server_port = urlsplit(denv_server.url).port
    targets = [[gateway, server_port], [gateway, listener.getsockname()[1]]]
    try:
        result = container.exec_run(["python3", "-c", PROBE, json.dumps(targets)])
        assert result.exit_code == 0, result.output
        outcomes = json.loads(result.output)
        # A connection that got through waits in the backlog (no thread blocked in accept()
        # left to fail when the listener closes).
        arrived, _, _ = select.select([listener], [], [], 0)
    finally:
        listener.close()
    reached = outcomes.count("connected")
    print(f"deny env via server: {len(targets)} attempts on the host, {reached} succeeded")
    assert "connected" not in outcomes and not arrived


def test_deleted_env_ingress_is_404(denv_server: LocalDenv) -> None:
    _docker()
    headers = {"Authorization": f"Bearer {denv_server.key}"}
    with httpx.Client(base_url=denv_server.url, headers=headers, timeout=180, trust_env=False) as c:
        res = c.post("/v1/sandboxes", json={"image": IMAGE, "ports": [PORT]})
        assert res.status_code == 201, res.text
        env = res.json()
        base = base_url(env)
        assert httpx.get(f"{base}/health", trust_env=False).status_code == 200
        assert c.delete(f"/v1/envs/{env['id']}").status_code == 204
    gone = httpx.get(f"{base}/health", trust_env=False)
    assert gone.status_code == 404 and gone.json()["code"] == "not_found"
