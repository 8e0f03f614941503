"""End to end: live siblings, and their parent, cannot reach each other's ports, on a server
with ``--live-netns off`` (children in their container's network namespace, kept apart by
per-port rules; with it on, the default, see test_live_netns.py).

A process of a live env is run from the host in that env's network namespace and cgroup
(`nsenter --net`, then its pid written into the env's cgroup: what any process the env
starts gets), and connects to the ports of the other live servers of its container. The
connection to another server's port is reset; the env's own port answers; ingress reaches
every env as before; and a deleted child's rule and cgroup are gone once the container
forks again, its port taken by the new child.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx
import pytest
from conftest import Clients, LocalDenv, start_server
from provider_helpers import ECHO_IMAGE, assert_gone
from test_live_fork import listening_pid

from denv import Env

pytestmark = pytest.mark.e2e

# Run in the env's network namespace: join the env's cgroup, then try each port.
PROBE = """
import socket, sys
open(sys.argv[1], "w").write("0")  # this process into the env's cgroup
for port in sys.argv[2:]:
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect(("127.0.0.1", int(port)))
        print(port, "open")
    except OSError as exc:
        print(port, type(exc).__name__)
    finally:
        s.close()
"""


def cgroup_dir(pid: int) -> Path:
    line = next(x for x in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if x[:3] == "0::")
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    mount = next(m.split()[1] for m in mounts if m.split()[2] == "cgroup2")
    return Path(mount) / line[3:].lstrip("/")


def rules(pid: int) -> str:
    """The live servers' port rules in ``pid``'s network namespace."""
    cmd = ["nsenter", f"--net=/proc/{pid}/ns/net", "--", "iptables", "-w", "5", "-S", "DENV-LIVE"]
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=30).stdout


def probe(pid: int, ports: list[int]) -> dict[int, str]:
    """From a new process in ``pid``'s network namespace and cgroup: each port's outcome."""
    out = subprocess.run(
        [
            *("nsenter", f"--net=/proc/{pid}/ns/net", "--", sys.executable, "-c", PROBE),
            str(cgroup_dir(pid) / "cgroup.procs"),
            *map(str, ports),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return {int(p): what for p, what in (line.split() for line in out.splitlines())}


@pytest.fixture(scope="module")
def server_off(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    with start_server(tmp_path_factory.mktemp("denv-apart"), "--live-netns", "off") as srv:
        yield srv


def test_live_servers_cannot_reach_each_others_ports(
    server_off: LocalDenv, clients: Clients
) -> None:
    d = clients(server_off)
    parent = d.create_sandbox(ECHO_IMAGE, live=True)
    ids = [parent.id]
    try:
        children = d.fork(parent.id, 2, kind="live").envs
        ids += [c.id for c in children]
        container = docker.from_env().containers.list(filters={"label": f"denv.env={parent.id}"})
        cid = str(container[0].id)
        envs: list[Env] = [d.get_env(i) for i in ids]
        port = {e.id: e.endpoints[0].port for e in envs}
        pid = {e.id: listening_pid(cid, port[e.id]) for e in envs}
        assert len(set(pid.values())) == 3
        assert len({cgroup_dir(p) for p in pid.values()}) == 3  # a cgroup each

        a, b = children[0].id, children[1].id
        seen = probe(pid[a], [port[a], port[b], port[parent.id]])
        assert seen == {port[a]: "open", port[b]: "ConnectionRefusedError",
                        port[parent.id]: "ConnectionRefusedError"}  # fmt: skip
        seen = probe(pid[parent.id], [port[parent.id], port[a], port[b]])
        assert seen == {port[parent.id]: "open", port[a]: "ConnectionRefusedError",
                        port[b]: "ConnectionRefusedError"}  # fmt: skip

        # Every env still answers through its ingress URL.
        for e in envs:
            assert d.get_env(e.id).status == "healthy"
            r = httpx.get(f"{e.endpoints[0].url.rstrip('/')}/health", timeout=10)
            assert r.status_code == 200, (e.id, r.text)

        # A deleted child's rule and cgroup go with the container's next fork, in the
        # transaction that adds the new child's rule on b's port, free again: the new child
        # serves there, reachable from itself, not from its sibling; nothing names b.
        gone = cgroup_dir(pid[b])
        d.delete_env(b)
        c = d.fork(parent.id, 1, kind="live").envs[0]
        ids.append(c.id)
        port[c.id] = d.get_env(c.id).endpoints[0].port
        assert port[c.id] == port[b]
        pid[c.id] = listening_pid(cid, port[c.id])
        seen = probe(pid[c.id], [port[c.id], port[a]])
        assert seen == {port[c.id]: "open", port[a]: "ConnectionRefusedError"}
        assert probe(pid[a], [port[c.id]]) == {port[c.id]: "ConnectionRefusedError"}
        assert not gone.exists()
        assert b not in rules(pid[a])
    finally:
        for env_id in ids:
            d.delete_env(env_id)
    assert_gone(server_off, ids)
