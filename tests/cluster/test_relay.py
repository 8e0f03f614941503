"""Ingress across machines (issue 27): the control plane reaches each node's envs only
through that node's relay, which refuses whoever lacks the cluster's key.

On the session's 3-node cluster (``cluster`` fixture): every node agent runs a relay on the
node's address; the control plane's ingress reaches an env on a node other than the head
(egress deny, the default) over HTTP and an OpenEnv WebSocket session, and the connection it
holds while the session is open is one to that node's relay. A client without the key
derived from the cluster's Ray token gets a refusal and never reaches the env; with the key
it does, and only at env addresses. (The nodes share this machine's Docker Engine, so its
bridges are routable from here; that the relay is the *only* way in waits for nodes in their
own network namespaces: docs/cluster.md.)
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cluster_helpers import LocalCluster, standin_boot

from denv.cluster import local, ray_auth
from denv.server.ingress.relay import HANDSHAKE_TIMEOUT_S, RelayError, open_socket, split_address

pytestmark = pytest.mark.e2e

ECHO_IMAGE = "denv-echo-env:latest"


@pytest.fixture(scope="module")
def relays(cluster: LocalCluster) -> dict[str, str]:
    """Node name -> its relay's "host:port", as ``denv cluster status`` reports it."""
    found = {n["name"]: n["relay"] for n in local.status(cluster.dir)["nodes"]}
    assert set(found) == set(cluster.nodes)
    return found


@pytest.fixture(scope="module")
def remote_env(cluster: LocalCluster) -> Iterator[dict[str, Any]]:
    """An echo env (egress deny) on a node other than the head; every env made is deleted."""
    with httpx.Client(
        base_url=cluster.url,
        headers={"Authorization": f"Bearer {cluster.api_key}"},
        timeout=300,
        trust_env=False,
    ) as c:
        made: list[dict[str, Any]] = []
        try:
            for _ in cluster.nodes:  # placement spreads fresh envs: one lands off the head
                res = c.post("/v1/sandboxes", json={"image": ECHO_IMAGE})
                assert res.status_code == 201, res.text
                made.append(res.json())
                if made[-1]["node"] != cluster.head:
                    break
            env = made[-1]
            assert env["node"] != cluster.head, [e["node"] for e in made]
            assert env["status"] == "healthy" and env["egress"] == "deny", env
            yield env
        finally:
            for e in made:
                c.delete(f"/v1/envs/{e['id']}")


def _connections_to(address: str) -> int:
    """Established TCP connections of this machine whose peer is ``address``."""
    out = subprocess.run(
        ["ss", "-Htn", "state", "established"], capture_output=True, text=True, check=True
    ).stdout
    return sum(1 for line in out.splitlines() if line.split()[-1] == address)


def _env_ip(cluster: LocalCluster, env: dict[str, Any]) -> str:
    """The env's address on its node's bridge (from its node's engine)."""
    fmt = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
    name = f"denv-{env['id'].lower()}-agent"
    return subprocess.run(
        cluster.docker(env["node"], "inspect", "-f", fmt, name),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def test_every_node_has_a_relay_on_its_address(
    cluster: LocalCluster, relays: dict[str, str]
) -> None:
    assert all(relays.values()), relays
    hosts = {r.rpartition(":")[0] for r in relays.values()}
    assert len(set(relays.values())) == len(cluster.nodes)  # one port each
    assert not any(h.startswith("127.") for h in hosts), relays  # the node's address
    print(f"\n  relays: {relays}")


def test_an_env_on_another_node_answers_http_and_websocket_through_its_relay(
    cluster: LocalCluster, relays: dict[str, str], remote_env: dict[str, Any]
) -> None:
    from openenv.core.generic_client import GenericEnvClient

    url = remote_env["endpoints"][0]["url"]
    assert url.startswith(cluster.url + "/ingress/"), url
    relay = relays[remote_env["node"]]
    assert httpx.get(f"{url}/health", trust_env=False).json() == {"status": "healthy"}
    with GenericEnvClient(base_url=url).sync() as client:
        client.reset(episode_id="across")
        result = client.step({"message": "through the relay"})
        assert result.observation["echoed_message"] == "through the relay"
        # The session's WebSocket is held by the control plane as a connection to the
        # env's node's relay (the env's own address is never dialed by the control plane).
        assert _connections_to(relay) >= 1, f"no connection to relay {relay} during a session"
        assert client.state()["step_count"] == 1
    print(f"\n  env on {remote_env['node']}: HTTP and a WebSocket step through relay {relay}")


def test_the_relay_refuses_whoever_lacks_the_cluster_key(
    cluster: LocalCluster, relays: dict[str, str], remote_env: dict[str, Any]
) -> None:
    relay = relays[remote_env["node"]]
    ip = _env_ip(cluster, remote_env)
    key = ray_auth.relay_key(cluster.ray_token.read_text().strip())
    assert key is not None

    async def health(with_key: bytes, target: str = ip, port: int = 8000) -> bytes:
        sock = await open_socket(with_key, relay, target, port)
        loop = asyncio.get_running_loop()
        try:
            await loop.sock_sendall(sock, b"GET /health HTTP/1.0\r\nHost: env\r\n\r\n")
            answer = b""
            while chunk := await loop.sock_recv(sock, 65536):
                answer += chunk
            return answer
        finally:
            sock.close()

    # Without the key: refused, the env never reached.
    with pytest.raises(RelayError, match="refused the control plane's relay key"):
        asyncio.run(health(bytes(32)))
    # A plain HTTP request to the relay's port gets no HTTP answer (at the latest when the
    # relay gives up waiting for a handshake: how many bytes it waits for depends on the
    # request's bytes, so on the relay's address).
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.get(f"http://{relay}/health", trust_env=False, timeout=HANDSHAKE_TIMEOUT_S + 10)
    # With the key: the same env answers; the key opens env addresses only, never the node.
    status_line = asyncio.run(health(key)).split(b"\r\n", 1)[0]
    assert re.fullmatch(rb"HTTP/1\.[01] 200 OK", status_line), status_line
    host, port = cluster.url.removeprefix("http://").rsplit(":", 1)
    with pytest.raises(RelayError, match="no env address of that node"):
        asyncio.run(health(key, host, int(port)))
    print(f"\n  relay {relay}: no key refused, plain HTTP refused, key opens env {ip} only")


def test_an_agent_hands_out_its_envs_behind_its_relay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's side without Ray (a ``NodeAgent`` in this process, as Ray would run it):
    with the cluster's token it starts a relay, ``bring_up`` names the env's address behind
    it, ``wait_healthy`` probes the env's own address, and an ingress with the derived key
    reaches the deny env through the relay."""
    import fastapi
    import uvicorn

    from denv.cluster.agent import AgentConfig, NodeAgent
    from denv.server.ingress.proxy import mount_ingress, new_token
    from denv.server.ingress.routes import IngressTable
    from denv.server.volumes.mounts import unmount_all

    token = ray_auth.create_token_file(tmp_path / "ray-token")
    monkeypatch.setenv(ray_auth.MODE_VAR, "token")
    monkeypatch.setenv(ray_auth.PATH_VAR, str(token))
    monkeypatch.delenv(ray_auth.TOKEN_VAR, raising=False)
    agent = NodeAgent("relay-t", AgentConfig(state_root=str(tmp_path / "nodes")))
    booted = None
    try:
        # outside a Ray actor (this process may be a Ray driver): loopback
        assert agent.relay_address.startswith("127.0.0.1:"), agent.relay_address
        spec = standin_boot(agent, 60)
        booted = agent.call("bring_up", spec)
        assert split_address(booted.agent_ip)[1] == agent.relay_address, booted.agent_ip
        agent.call("wait_healthy", spec, booted, 60)
        table = IngressTable()
        route = new_token()
        table.register(route, booted.agent_ip, 8000)
        app = fastapi.FastAPI()
        mount_ingress(app, table, relay_key=ray_auth.relay_key(token.read_text()))
        server = uvicorn.Server(uvicorn.Config(app, port=0, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        try:
            while not server.started:
                time.sleep(0.05)
            port = server.servers[0].sockets[0].getsockname()[1]
            res = httpx.get(f"http://127.0.0.1:{port}/ingress/{route}/health", trust_env=False)
            assert res.status_code == 200, res.text
        finally:
            server.should_exit = True
            thread.join(10)
    finally:
        if booted is not None:
            agent.call("teardown", booted.env_id, list(booted.containers.values()))
        agent.close()
        unmount_all(tmp_path)  # the agent's pooled volume filesystems
