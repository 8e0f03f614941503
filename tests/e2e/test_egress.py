"""Egress deny holds on a real Docker Engine: a container on a deny network reaches nothing.

From inside a container on a ``dvd…`` internal network, with the host guard installed:
the host (every address of this machine, on a port where the test listens on 0.0.0.0),
containers of other envs (deny and allow), and an "outside" host must all be unreachable.
The outside host is a network namespace this test makes (tests/e2e/outside_host.py: a
veth pair, an address in 198.18.0.0/15, listeners on TCP 443 and 80 and a DNS server on
UDP 53); it is tried by address (TCP and UDP) and by a name only its DNS server knows
(the containers' embedded DNS forwards to it). A container on an allow network must reach
that same host by address and by name, and the host must reach into the deny container:
the positive controls that prove the probes would notice a leak. Every target is on this
machine: tests never send traffic to an outside address, so no registry, resolver or
other public or private address is probed; the namespace stands in for them.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import docker_engine
from outside_host import OutsideHost, outside_host

from denv.server.net.policy import (
    allow_network_options,
    deny_network_options,
    install_host_guard,
    remove_host_guard,
)

pytestmark = pytest.mark.e2e

IMAGE = "denv-base-probe:latest"
PROBE_TIMEOUT_S = 3.0
SERVICE_PORT = 8000

# A probe target: (host, port) over TCP, or (host, port, "udp").
Target = tuple[str, int] | tuple[str, int, str]

# Runs inside a container: tries every target in argv[1] at once, prints the results. TCP
# is "connected" once the handshake completes; UDP once the listener echoes the datagram.
PROBE = r"""
import json, socket, sys, threading
targets, timeout = json.loads(sys.argv[1]), float(sys.argv[2])
results = [None] * len(targets)
def attempt(i, host, port, proto="tcp"):
    try:
        if proto == "udp":
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.settimeout(timeout)
            s.sendto(b"denv-egress-probe", (host, port))
            answer = s.recv(256)
            s.close()
            results[i] = "connected" if answer == b"denv-egress-probe" else repr(answer)
        else:
            socket.create_connection((host, port), timeout=timeout).close()
            results[i] = "connected"
    except Exception as exc:
        results[i] = type(exc).__name__ + ": " + str(exc)
threads = [threading.Thread(target=attempt, args=(i, *t)) for i, t in enumerate(targets)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(results))
"""


# ---------------------------------------------------------------------------- targets


def host_reaches(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
        return True
    except OSError:
        return False


def host_addresses() -> list[str]:
    """This machine's own IPv4 addresses (not loopback): the host, seen from a container."""
    out = subprocess.run(
        ["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    addresses = []
    for link in json.loads(out):
        for info in link.get("addr_info", []):
            if not ipaddress.ip_address(info["local"]).is_loopback:
                addresses.append(info["local"])
    return sorted(set(addresses))


# ---------------------------------------------------------------------------- fixture


class Listener:
    """A TCP server on 0.0.0.0:<free port> that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(64)
        self.port = int(self.sock.getsockname()[1])
        self.accepted: list[Any] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            self.accepted.append(peer)
            conn.close()

    def close(self) -> None:
        self.sock.close()


@dataclass
class Fleet:
    client: Any
    deny_a: Any  # network
    deny_b: Any
    allow: Any
    probe_a: Any  # container on deny_a that runs the probes
    peer_a: Any  # a second container on deny_a (same env: must stay reachable)
    service_b: Any  # on deny_b: another deny env
    service_w: Any  # on allow: another allow env, and the allow-side prober
    listener: Listener
    outside: OutsideHost  # the namespace that stands in for any host beyond this machine
    guard_was_installed_here: bool
    counts: dict[str, int] = field(default_factory=dict)

    def ip(self, container: Any, network: Any) -> str:
        container.reload()
        return str(container.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"])

    def gateway(self, network: Any) -> str:
        network.reload()
        return str(network.attrs["IPAM"]["Config"][0]["Gateway"])

    def probe(self, container: Any, targets: list[Target]) -> list[str]:
        result = container.exec_run(
            ["python3", "-c", PROBE, json.dumps(targets), str(PROBE_TIMEOUT_S)]
        )
        assert result.exit_code == 0, result.output.decode(errors="replace")
        outcomes: list[str] = json.loads(result.output)
        return outcomes


def docker_client() -> Any:
    return docker_engine(IMAGE, build="make image-probe")


@pytest.fixture(scope="module")
def outside() -> Iterator[OutsideHost]:
    with outside_host() as host:
        yield host


@pytest.fixture(scope="module")
def fleet(outside: OutsideHost) -> Iterator[Fleet]:
    client = docker_client()
    run_id = secrets.token_hex(4)
    labels = {"denv.managed": "true", "denv.instance": f"test-egress-{run_id}"}
    guard_new = install_host_guard()
    networks: list[Any] = []
    containers: list[Any] = []
    listener = Listener()

    def network(opts: dict[str, Any]) -> Any:
        net = client.networks.create(**opts)
        networks.append(net)
        return net

    def container(net: Any, service: str) -> Any:
        ct = client.containers.run(
            IMAGE,
            ["python3", "-m", "http.server", str(SERVICE_PORT)],
            detach=True,
            network=net.name,
            # The embedded DNS forwards to the outside host only: a name probe can resolve
            # nothing else, and never asks a resolver beyond this machine.
            dns=[outside.address],
            labels={**labels, "denv.service": service},
        )
        containers.append(ct)
        return ct

    try:
        env = f"env_EGRESS{run_id.upper()}"
        deny_a = network(deny_network_options(env + "A", {**labels, "denv.env": env + "A"}))
        deny_b = network(deny_network_options(env + "B", {**labels, "denv.env": env + "B"}))
        allow = network(allow_network_options(env + "W", {**labels, "denv.env": env + "W"}))
        fleet = Fleet(
            client,
            deny_a,
            deny_b,
            allow,
            container(deny_a, "agent"),
            container(deny_a, "peer"),
            container(deny_b, "agent"),
            container(allow, "agent"),
            listener,
            outside,
            guard_new,
        )
        for ct in (fleet.probe_a, fleet.peer_a, fleet.service_b, fleet.service_w):
            _wait_listening(fleet, ct)
        yield fleet
    finally:
        for ct in containers:
            ct.remove(force=True)
        for net in networks:
            net.remove()
        listener.close()
        if guard_new:
            remove_host_guard()  # only if no one (e.g. a running server) had installed it


def _wait_listening(fleet: Fleet, container: Any) -> None:
    deadline = time.monotonic() + 30
    while True:
        result = container.exec_run(
            ["python3", "-c", PROBE, json.dumps([["127.0.0.1", SERVICE_PORT]]), "1"]
        )
        if result.exit_code == 0 and json.loads(result.output) == ["connected"]:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"container {container.short_id} never listened on {SERVICE_PORT}")
        time.sleep(0.2)


def describe(target: Target) -> str:
    """``host:port``, with ``/udp`` for a UDP target."""
    return f"{target[0]}:{target[1]}" + ("/udp" if len(target) > 2 else "")


def _assert_all_fail(fleet: Fleet, targets: list[Target], what: str) -> None:
    outcomes = fleet.probe(fleet.probe_a, targets)
    leaks = [describe(t) for t, o in zip(targets, outcomes, strict=True) if o == "connected"]
    print(f"egress deny, {what}: {len(targets)} attempts, {len(leaks)} succeeded")
    assert not leaks, f"a deny env reached {what}: {leaks}"


# ---------------------------------------------------------------------------- tests


def test_deny_env_cannot_reach_the_host(fleet: Fleet) -> None:
    port = fleet.listener.port
    addresses = sorted({fleet.gateway(fleet.deny_a), *host_addresses()})
    targets = [(address, port) for address in addresses]
    before = len(fleet.listener.accepted)
    _assert_all_fail(fleet, targets, "the host")
    assert len(fleet.listener.accepted) == before, fleet.listener.accepted
    # The listener is up: the host itself reaches it on the same addresses.
    assert host_reaches(fleet.gateway(fleet.deny_a), port)


def test_deny_env_cannot_reach_other_envs(fleet: Fleet) -> None:
    others = [
        (fleet.ip(fleet.service_b, fleet.deny_b), SERVICE_PORT),
        (fleet.ip(fleet.service_w, fleet.allow), SERVICE_PORT),
    ]
    _assert_all_fail(fleet, others, "other envs")
    # Positive controls: its own env's peer answers, and so do the others, from the host.
    assert fleet.probe(fleet.probe_a, [(fleet.ip(fleet.peer_a, fleet.deny_a), SERVICE_PORT)]) == [
        "connected"
    ]
    for host, port in others:
        assert host_reaches(host, port), f"{host}:{port} is not listening"


def outside_targets(outside: OutsideHost) -> list[Target]:
    """The outside host by address (TCP and UDP) and by its name (TCP)."""
    return [
        *outside.tcp_targets(),
        outside.udp_target(),
        *outside.tcp_targets(outside.dns_name),
    ]


def test_deny_env_cannot_reach_an_outside_host(fleet: Fleet) -> None:
    outside = fleet.outside
    before = len(outside.seen)
    _assert_all_fail(fleet, outside_targets(outside), f"the outside host {outside.address}")
    # Not even a DNS query for its name got there.
    seen = outside.wait_seen(before + 1, timeout=1.0)[before:]
    assert not seen, f"the outside host saw traffic from a deny env: {seen}"
    # The listeners are up: the host itself reaches them.
    for target in outside.tcp_targets():
        assert host_reaches(*target), f"{describe(target)} is not listening"


def test_allow_env_reaches_the_outside_host(fleet: Fleet) -> None:
    outside = fleet.outside
    targets = outside_targets(outside)
    before = len(outside.seen)
    outcomes = fleet.probe(fleet.service_w, targets)
    failed = [describe(t) for t, o in zip(targets, outcomes, strict=True) if o != "connected"]
    print(f"egress allow: {len(targets)} attempts, {len(targets) - len(failed)} succeeded")
    assert not failed, (
        f"an allow env could not reach {failed} ({outcomes}): the deny probes prove nothing"
    )
    # The connections reached the namespace's listeners (masqueraded to the host's end). The
    # listener's lines come in late under load (the last test's own connections too, after
    # `before` was taken): wait for what these probes make, not for a count of lines.
    wanted = {("tcp", 443), ("tcp", 80), ("udp", 53)}
    deadline = time.monotonic() + 10
    seen = outside.seen[before:]
    while not wanted <= {(p, port) for p, port, _ in seen} and time.monotonic() < deadline:
        time.sleep(0.05)
        seen = outside.seen[before:]
    assert {(proto, port) for proto, port, _ in seen} >= wanted, seen
    assert {peer for _, _, peer in seen} == {outside.host_address}, seen


def test_host_reaches_into_the_deny_env(fleet: Fleet) -> None:
    targets = [(fleet.ip(fleet.probe_a, fleet.deny_a), SERVICE_PORT)]
    targets.append((fleet.ip(fleet.service_b, fleet.deny_b), SERVICE_PORT))
    reached = sum(host_reaches(*t) for t in targets)
    print(f"host into deny envs: {len(targets)} attempts, {reached} succeeded")
    assert reached == len(targets)
