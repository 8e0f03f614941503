"""A live child's network namespace (``--live-netns on``) on real namespaces, no engine.

A process in a network namespace of its own stands for an env's container (``eth0`` on a
veth pair from the host, at an address of 198.18.0.0/15, the benchmarking range no real
host uses); each "child" is a process in user and network namespaces of its own that
configures its end itself with the launcher's own code, as a live child does. The node's
side (``LiveNet``) makes the container's bridge, rules and host route, and each child's
pair. Checked: the host reaches a child at its address (host route, forwarding in the
container), a child cannot reach its sibling, an address whose pair is still there is not
handed out again, and ``forget`` leaves no host route. Needs root, as the server does.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from denv.server.docker.live import host_routes, launcher_ctl, netns

LAUNCHER = str(launcher_ctl.LAUNCHER_DIR)
# A child: waits for its network on stdin, sets it up with the launcher's own code, drops
# nothing (not the point here), answers on :8000 and, for "connect HOST", tries that host.
CHILD = f"""
import json, socket, sys
sys.path.insert(0, {LAUNCHER!r})
from _denv_live import configure_netns
net = json.loads(sys.stdin.readline())
configure_netns(net["if"], net["addr"], net["gw"])
srv = socket.socket()
srv.bind(("0.0.0.0", 8000))
srv.listen(8)
print("ready", flush=True)
while True:
    conn, _ = srv.accept()
    with conn:
        words = conn.recv(256).decode().split()
        out = "child"
        if words and words[0] == "connect":
            s = socket.socket()
            s.settimeout(1.0)
            try:
                s.connect((words[1], 8000))
                out = "open"
            except OSError as exc:
                out = type(exc).__name__
        conn.sendall(out.encode())
"""


def _wait_new_netns(pid: int) -> None:
    host = os.readlink("/proc/self/ns/net")
    deadline = time.monotonic() + 10
    while os.readlink(f"/proc/{pid}/ns/net") == host:
        assert time.monotonic() < deadline, "unshare did not make a namespace in 10 s"
        time.sleep(0.005)


def _ip(*args: str, pid: int | None = None) -> str:
    pre = ["nsenter", f"--net=/proc/{pid}/ns/net", "--"] if pid else []
    return subprocess.run([*pre, "ip", *args], check=True, capture_output=True, text=True).stdout


# Where the fake containers' addresses are (the fixture below), as an engine's networks
# would hold a real container's.
FAKE_CONTAINERS = ipaddress.IPv4Network("198.18.0.0/15")


@pytest.fixture
def container() -> Iterator[int]:
    """A "container": its own network namespace, eth0 to the host on a random /30."""
    taken = subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True).stdout
    while True:
        base = (
            f"198.{random.randint(18, 19)}.{random.randint(0, 255)}.{random.randrange(0, 256, 4)}"
        )
        prefix = base.rsplit(".", 1)[0] + "."
        if prefix not in taken:
            break
    last = int(base.rsplit(".", 1)[1])
    host_ip, ctr_ip = f"{prefix}{last + 1}", f"{prefix}{last + 2}"
    link = f"dlt{random.randrange(1 << 20):05x}"
    proc = subprocess.Popen(["unshare", "--net", "sleep", "600"])
    try:
        _wait_new_netns(proc.pid)
        _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", str(proc.pid))
        _ip("addr", "add", f"{host_ip}/30", "dev", link)
        _ip("link", "set", link, "up")
        _ip("addr", "add", f"{ctr_ip}/30", "dev", "eth0", pid=proc.pid)
        _ip("link", "set", "eth0", "up", pid=proc.pid)
        _ip("link", "set", "lo", "up", pid=proc.pid)
        _ip("route", "add", "default", "via", host_ip, pid=proc.pid)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", link)  # gone with the namespace already, as a rule


class Child:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            ["unshare", "--user", "--map-root-user", "--net", sys.executable, "-c", CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        _wait_new_netns(self.proc.pid)
        self.addr = ""

    def go(self, net: dict[str, str]) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(net) + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ready"
        self.addr = net["addr"].split("/")[0]

    def ask(self, text: str, at: str | None = None) -> str:
        with socket.create_connection((at or self.addr, 8000), timeout=5) as s:
            s.sendall(text.encode())
            return s.recv(256).decode()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def test_children_get_addresses_apart_and_nothing_is_left(container: int) -> None:
    nets = netns.LiveNet()
    kids: list[Child] = []
    net = nets.ensure("ctr-test", container)
    subnet = str(net.subnet)
    try:
        routes = subprocess.run(
            ["ip", "-4", "route", "show", subnet], capture_output=True, text=True, check=True
        ).stdout
        assert "via" in routes, routes
        a, b = Child(), Child()
        kids += [a, b]
        a.go(nets.attach(net, "env_a", a.proc.pid))
        b.go(nets.attach(net, "env_b", b.proc.pid))
        assert a.addr != b.addr
        assert a.ask("hello") == "child" and b.ask("hello") == "child"  # from the host
        # What a cluster node's relay admits (denv.cluster.relay.with_live_children): a
        # child's address, through its container's; not the bridge's own.
        assert host_routes.routed_via(a.addr) == net.via != ""
        assert host_routes.routed_via(net.gateway) is None
        assert host_routes.routed_via(str(net.subnet.network_address + 1000)) == net.via
        assert host_routes.routed_via(str(net.subnet.broadcast_address)) is None
        assert a.ask(f"connect {b.addr}") != "open"  # the sibling: isolated ports
        # The container itself, where nothing listens: rejected by its rule (no route to
        # host), not refused by its stack (ConnectionRefusedError) as without the rule.
        assert a.ask(f"connect {net.gateway}") in ("OSError", "TimeoutError")

        # a's env deleted while its pair is still there: its address is not handed out.
        nets.release("ctr-test", "env_a")
        net.next = int(ipaddress.ip_address(a.addr)) - int(net.subnet.network_address)
        c = Child()
        kids.append(c)
        c.go(nets.attach(net, "env_c", c.proc.pid))
        assert c.addr not in (a.addr, b.addr)
        assert c.ask("hello") == "child" and a.ask("hello") == "child"
    finally:
        for kid in kids:
            kid.kill()
        nets.forget("ctr-test")
    left = subprocess.run(
        ["ip", "-4", "route", "show", subnet], capture_output=True, text=True, check=True
    ).stdout
    assert left == "", f"the host route to the children was left: {left}"
    assert host_routes.routed_via(a.addr) is None  # its route gone, no longer admitted


def test_forget_leaves_another_containers_route_to_the_same_subnet(container: int) -> None:
    """A container's network may go first (taking its route), and another container then
    claims the same subnet: the first one's ``forget`` must not take the second's route.
    (In CI a fork's children became unreachable that way.)"""
    nets = netns.LiveNet()
    net = nets.ensure("ctr-test", container)
    subnet = str(net.subnet)
    got = subprocess.run(["ip", "route", "get", net.via], capture_output=True, text=True)
    link = got.stdout.split(" dev ")[1].split()[0]
    try:
        # the other container's route to the same subnet, in place of this one's
        subprocess.run(["ip", "route", "replace", subnet, "dev", link], check=True)
        nets.forget("ctr-test")
        left = subprocess.run(
            ["ip", "-4", "route", "show", subnet], capture_output=True, text=True, check=True
        ).stdout
        assert f"dev {link}" in left, f"forget removed another container's route: {left!r}"
    finally:
        subprocess.run(["ip", "route", "del", subnet], capture_output=True)


def test_a_prune_keeps_the_route_a_container_claims_while_it_runs(container: int) -> None:
    """A server's start prunes stale routes while another server's container may be claiming
    its own: a route claimed after the prune read the routes is not touched, even when the
    prune's list of running containers (read after) misses that container. (Read the other
    way round, the fresh route looked stale, and the children behind it were cut off.)"""
    nets = netns.LiveNet()
    claimed: list[netns.ContainerNet] = []

    def running() -> set[str]:
        claimed.append(nets.ensure("ctr-late", container))  # claims its route now
        out = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
        vias = {ln.split(" via ")[1].split()[0] for ln in out.splitlines() if " via " in ln}
        return vias - {claimed[0].via}  # every other route kept: this test prunes nothing

    try:
        host_routes.prune_routes(running, [FAKE_CONTAINERS])
        left = subprocess.run(
            ["ip", "-4", "route", "show", str(claimed[0].subnet)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert f"via {claimed[0].via}" in left, "the prune removed a route claimed meanwhile"
    finally:
        nets.forget("ctr-late")


def test_a_prune_removes_only_routes_via_the_engines_networks(container: int) -> None:
    """A stale route is one via an address of the engine's networks that no running
    container has. A route via any other address (another tool's, or this test's fake
    container, which a server starting beside the tests once pruned mid-test) stays."""
    nets = netns.LiveNet()
    net = nets.ensure("ctr-prune", container)

    def routed() -> str:
        return subprocess.run(
            ["ip", "-4", "route", "show", str(net.subnet)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    try:
        assert host_routes.prune_routes(set, []) == []  # not via an engine network: not ours
        assert f"via {net.via}" in routed()
        assert host_routes.prune_routes(set, [FAKE_CONTAINERS]) == [str(net.subnet)]
        assert routed() == ""
    finally:
        nets.forget("ctr-prune")


def _bridge_mac(pid: int) -> str:
    out = _ip("-o", "link", "show", "denv-live", pid=pid)
    return out.split("link/ether ")[1].split()[0]


def test_deleting_a_child_leaves_its_siblings_gateway_where_it_was(container: int) -> None:
    """The bridge keeps its own MAC: left to the kernel it takes its lowest port's, so the
    first child's delete changed the gateway's MAC under its sibling, whose cached one then
    led nowhere, and whose connections hung (16% of fork(2)s in a loop, before the fix)."""
    nets = netns.LiveNet()
    kids: list[Child] = []
    net = nets.ensure("ctr-test", container)
    try:
        a, b = Child(), Child()
        kids += [a, b]
        a.go(nets.attach(net, "env_a", a.proc.pid))
        b.go(nets.attach(net, "env_b", b.proc.pid))
        assert a.ask("hello") == "child" and b.ask("hello") == "child"  # both know the gateway
        before = _bridge_mac(container)
        a.kill()  # its namespace, and its pair (the bridge's lowest port), go
        deadline = time.monotonic() + 10
        while any(n.startswith(netns.PAIR_PREFIX + "2") for n in netns._link_names(container)):
            assert time.monotonic() < deadline, "the deleted child's pair stayed"
            time.sleep(0.05)
        assert _bridge_mac(container) == before, "the gateway's MAC changed with a delete"
        assert b.ask("hello") == "child"  # its replies still reach the gateway
    finally:
        for kid in kids:
            kid.kill()
        nets.forget("ctr-test")
