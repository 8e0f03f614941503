"""End to end: each live child in a network namespace of its own (``--live-netns on``).

One server of its own, started with ``--live-netns on``, and one live echo env (egress
deny) forked twice. Every check runs from the host in a process's network namespace
(``nsenter --net``): a child's, its sibling's, its parent's (the container's). A child
cannot connect to its sibling's port (the bridge ports are isolated) nor to its parent's
(at the container's address or through the gateway), the parent cannot connect to a child,
and yet each child serves the env's own port at its own address, through ingress, to a real
OpenEnv client. Egress deny holds for a child: an "outside" host (tests/e2e/outside_host.py)
sees nothing from it, while a child of an egress-allow env reaches it (so the check can
fail). After the deletes nothing is left: no host route to the children's subnet, no pair
in the container, no container.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
from conftest import Clients, LocalDenv, start_server
from openenv.core import GenericEnvClient
from outside_host import OutsideHost, outside_host
from provider_helpers import ECHO_IMAGE, assert_gone, container_pid_of, live_pid, message

from denv import Denv, Env

pytestmark = pytest.mark.e2e

ENV_PORT = 8000  # the echo env's port: every child serves it, each at its own address
SUBNETS = "100.64.0.0/10"

# Run in a process's network namespace: each "host:port" target's outcome, one JSON list.
PROBE = """
import json, socket, sys
out = []
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    s = socket.socket()
    s.settimeout(1.5)
    try:
        s.connect((host, int(port)))
        out.append("open")
    except OSError as exc:
        out.append(type(exc).__name__)
    finally:
        s.close()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    with start_server(tmp_path_factory.mktemp("denv-netns"), "--live-netns", "on") as srv:
        yield srv


def nsexec(pid: int, *argv: str) -> str:
    return subprocess.run(
        ["nsenter", f"--net=/proc/{pid}/ns/net", "--", *argv],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


def probe(pid: int, targets: list[tuple[str, int]]) -> list[str]:
    """From a new process in ``pid``'s network namespace: each target's outcome."""
    out = nsexec(pid, sys.executable, "-c", PROBE, *(f"{h}:{p}" for h, p in targets))
    return list(json.loads(out))


def address(pid: int, dev: str = "eth0") -> str:
    return nsexec(pid, "ip", "-4", "-o", "addr", "show", "dev", dev).split()[3].split("/")[0]


def routes_via(container_addr: str) -> list[str]:
    """This host's routes to children's subnets through the container at ``container_addr``
    (only its own: other servers on this machine add and remove theirs meanwhile)."""
    out = subprocess.run(
        ["ip", "-4", "route", "show", "root", SUBNETS], capture_output=True, text=True, check=True
    ).stdout
    return [line for line in out.splitlines() if f" via {container_addr} " in f"{line} "]


def gateway(pid: int) -> str:
    words = nsexec(pid, "ip", "-4", "route", "show", "default").split()
    return words[words.index("via") + 1]


def health(env: Env) -> int:
    return httpx.get(f"{env.endpoints[0].url.rstrip('/')}/health", timeout=10).status_code


@pytest.fixture(scope="module")
def outside() -> Iterator[OutsideHost]:
    with outside_host() as host:
        yield host


def test_children_are_apart_and_served(
    server: LocalDenv, outside: OutsideHost, clients: Clients
) -> None:
    d = clients(server)
    parent = d.create_sandbox(ECHO_IMAGE, live=True)
    ids = [parent.id]
    try:
        children = d.fork(parent.id, 2, kind="live").envs
        ids += [c.id for c in children]
        a, b = (d.get_env(c.id) for c in children)
        assert a.endpoints[0].port == b.endpoints[0].port == ENV_PORT
        pid = {e: live_pid(e) for e in ids}
        netns = {e: Path(f"/proc/{p}/ns/net").readlink() for e, p in pid.items()}
        assert len(set(netns.values())) == 3  # a network namespace each
        addr = {e: address(pid[e]) for e in (a.id, b.id)}
        parent_addr = address(pid[parent.id])
        gw = gateway(pid[a.id])
        assert addr[a.id] != addr[b.id]
        new_routes = routes_via(parent_addr)
        assert len(new_routes) == 1, new_routes  # the container's children's subnet

        # Each child serves its own address; nothing else of the container reaches it.
        assert probe(pid[a.id], [(addr[a.id], ENV_PORT)]) == ["open"]
        seen = probe(
            pid[a.id],
            [(addr[b.id], ENV_PORT), (parent_addr, ENV_PORT), (gw, ENV_PORT)],
        )
        assert "open" not in seen, seen  # sibling, parent at its address, through the gateway
        seen = probe(pid[parent.id], [(addr[a.id], ENV_PORT), (addr[b.id], ENV_PORT)])
        assert "open" not in seen, seen
        assert probe(pid[parent.id], [(parent_addr, ENV_PORT)]) == ["open"]

        # Every env answers through ingress, and a child steps with a real OpenEnv client.
        for env_id in ids:
            assert health(d.get_env(env_id)) == 200, env_id
        url = a.endpoints[0].url
        with GenericEnvClient(base_url=url).sync() as client:
            client.reset()
            result = client.step(message("from a child in its own netns"))
            observation = dict(result.observation)
            assert observation["echoed_message"] == "from a child in its own netns"

        # Egress deny holds for a child as for its container.
        before = len(outside.seen)
        assert "open" not in probe(pid[a.id], outside.tcp_targets())
        assert not outside.wait_seen(before + 1, timeout=1.0)[before:]

        # A grandchild joins the same bridge, apart from its parent.
        grand = d.fork(a.id, 1, kind="live").envs[0]
        ids.append(grand.id)
        gpid = live_pid(grand.id)
        gaddr = address(gpid)
        assert health(d.get_env(grand.id)) == 200
        assert "open" not in probe(gpid, [(addr[a.id], ENV_PORT), (addr[b.id], ENV_PORT)])
        assert "open" not in probe(pid[a.id], [(gaddr, ENV_PORT)])

        # A deleted child's pair goes with its namespace.
        container_pid = container_pid_of(parent.id)
        pairs = _pairs(container_pid)
        assert len(pairs) == 3, pairs
        d.delete_env(b.id)
        _wait(lambda: len(_pairs(container_pid)) == 2, "the deleted child's pair to go")
    finally:
        for env_id in reversed(ids):
            d.delete_env(env_id)
    assert_gone(server, ids)
    assert not routes_via(parent_addr), "a host route to children was left"


def test_egress_allow_child_reaches_outside(
    server: LocalDenv, outside: OutsideHost, clients: Clients
) -> None:
    """The control for the deny check above: an allow env's child does reach the outside
    host, as its container's address (masqueraded), not its own; and resolves names."""
    d = clients(server)
    parent = d.create_sandbox(ECHO_IMAGE, live=True, egress="allow")
    ids = [parent.id]
    try:
        child = d.fork(parent.id, 1, kind="live").envs[0]
        ids.append(child.id)
        cpid = live_pid(child.id)
        before = len(outside.seen)
        assert probe(cpid, outside.tcp_targets()[:1]) == ["open"]
        seen = outside.wait_seen(before + 1, timeout=5.0)[before:]
        assert seen and not seen[0][2].startswith("100."), seen
        # Names resolve in the child as in its container: Docker's embedded resolver (the
        # container's 127.0.0.11) answers through the gateway; here, the container's name.
        found = docker.from_env().containers.list(filters={"label": f"denv.env={parent.id}"})
        ip = next(iter(found[0].attrs["NetworkSettings"]["Networks"].values()))["IPAddress"]
        resolve = f"import socket; print(socket.gethostbyname({found[0].name!r}))"
        out = subprocess.run(
            ["nsenter", "-t", str(cpid), "-n", "-m", "--", "python3", "-c", resolve],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.stdout.strip() == ip, out.stderr
    finally:
        for env_id in reversed(ids):
            d.delete_env(env_id)
    assert_gone(server, ids)


def _pairs(container_pid: int) -> list[str]:
    out = nsexec(container_pid, "ip", "-o", "link", "show", "master", "denv-live")
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]


def _wait(cond: Any, what: str, timeout: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"waited {timeout:g} s for {what}"
        time.sleep(0.1)


def test_after_a_restart_children_keep_their_addresses_and_fork_on(tmp_path: Path) -> None:
    """A server started again finds a running container's bridge and subnet (no second
    route), its children keep serving at their addresses, a new fork takes an address no
    living child holds, and the deletes leave no route."""
    state = tmp_path / "state"
    # detach: the envs outlive this first client and its server (a lease would expire
    # while no server renews it); the second client deletes them
    with (
        start_server(state, "--live-netns", "on", cleanup=False) as srv,
        Denv(srv.url, srv.key, detach=True) as d,
    ):
        parent = d.create_sandbox(ECHO_IMAGE, live=True)
        a = d.fork(parent.id, 1, kind="live").envs[0]
        a_addr = address(live_pid(a.id))
        parent_addr = address(live_pid(parent.id))
    with start_server(state, "--live-netns", "on") as srv, Denv(srv.url, api_key=srv.key) as d:
        ids = [parent.id, a.id]
        try:
            assert health(d.get_env(a.id)) == 200
            c = d.fork(a.id, 1, kind="live").envs[0]
            ids.append(c.id)
            assert health(d.get_env(c.id)) == 200
            c_addr = address(live_pid(c.id))
            assert c_addr != a_addr
            assert len(routes_via(parent_addr)) == 1, "a second route after the restart"
            assert "open" not in probe(live_pid(c.id), [(a_addr, ENV_PORT)])
        finally:
            for env_id in reversed(ids):
                d.delete_env(env_id)
        assert_gone(srv, ids)
    assert not routes_via(parent_addr), "a host route to children was left"
