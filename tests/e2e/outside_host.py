"""An "outside" host that an egress test makes itself: a network namespace on this machine.

Egress tests need a target beyond the host that a leak would reach, and tests may send
traffic only to this machine. So the test makes its own: a network namespace joined to
the host by a veth pair, the namespace end at an address of a random /30 in 198.18.0.0/15,
with listeners on TCP 443 and 80 and on UDP 53 (a DNS server that knows one name and
echoes any datagram that is not a DNS query). To a container it looks like any outside
host: its packets leave the Docker bridge and are routed by the host over the veth (an
allow network's are masqueraded to the host's veth address, so replies come back by the
same way); the namespace's default route points back at the host.

Why 198.18.0.0/15: it is reserved for benchmarking (RFC 2544), so no registry, resolver
or other real host has an address in it; Docker's default address pools are 172.17-31/16
and 192.168/16, denv's ``--subnet-pool`` default is 10.213.0.0/16, and no other test here
uses it. The /30 is drawn at random (parallel runs get different ones) and refused if it
overlaps any address, route (every table) or Docker network subnet this machine has.

    with outside_host() as outside:
        targets = outside.tcp_targets()       # [("198.18.x.y", 443), ("198.18.x.y", 80)]
        outside.seen                          # ("tcp", 443, "<peer>") per connection
"""

from __future__ import annotations

import ipaddress
import json
import random
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

RANGE = ipaddress.IPv4Network("198.18.0.0/15")
TCP_PORTS = (443, 80)
UDP_PORT = 53
START_TIMEOUT_S = 10.0
# What the UDP probe sends; the namespace's UDP listener echoes it.
UDP_PAYLOAD = b"denv-egress-probe"

# Runs in the namespace: binds every listener, says "ready", then one line per connection
# ("tcp 443 <peer>") or datagram ("udp 53 <peer>"); exits when its stdin closes.
LISTENER = r"""
import socket, sys, threading
address, name, tcp_ports, udp_port = sys.argv[1], sys.argv[2].lower(), sys.argv[3], sys.argv[4]
lock = threading.Lock()
def say(*words):
    with lock:
        print(*words, flush=True)
def question(query):
    # (qname, qtype, end of the question) of a one-question DNS query; ValueError otherwise
    if len(query) < 12 or query[2] & 0x80 or query[4:6] != b"\x00\x01":
        raise ValueError("not a DNS query")
    labels, i = [], 12
    while query[i]:
        labels.append(query[i + 1 : i + 1 + query[i]].decode())
        i += 1 + query[i]
    return ".".join(labels).lower(), int.from_bytes(query[i + 1 : i + 3], "big"), i + 5
def reply(query):
    try:
        qname, qtype, end = question(query)
    except (ValueError, IndexError, UnicodeDecodeError):
        return query  # the UDP probe: echo
    known = qname == name
    answers = 1 if known and qtype == 1 else 0  # an A record; none for other types
    flags = 0x8180 | (0 if known else 3)  # response, recursion available; NXDOMAIN if unknown
    head = query[:2] + flags.to_bytes(2, "big") + bytes([0, 1, 0, answers, 0, 0, 0, 0])
    record = b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x05\x00\x04" + socket.inet_aton(address)
    return head + query[12:end] + record * answers
def tcp(sock, port):
    while True:
        conn, peer = sock.accept()
        say("tcp", port, peer[0])
        conn.close()
def udp(sock, port):
    while True:
        data, peer = sock.recvfrom(4096)
        say("udp", port, peer[0])
        sock.sendto(reply(data), peer)
servers = []
for port in map(int, tcp_ports.split(",")):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((address, port))
    s.listen(64)
    servers.append((tcp, s, port))
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((address, int(udp_port)))
servers.append((udp, s, int(udp_port)))
for serve, s, port in servers:
    threading.Thread(target=serve, args=(s, port), daemon=True).start()
say("ready")
sys.stdin.read()
"""


class OutsideHostError(RuntimeError):
    """The namespace, its veth or its listener could not be set up."""


@dataclass
class OutsideHost:
    """A namespace at ``address`` (host end of its veth: ``host_address``) with listeners."""

    namespace: str
    host_link: str
    address: str
    host_address: str
    dns_name: str
    seen: list[tuple[str, int, str]] = field(default_factory=list)

    def tcp_targets(self, host: str | None = None) -> list[tuple[str, int]]:
        """(host, port) of every TCP listener; ``host`` defaults to the address."""
        return [(host or self.address, port) for port in TCP_PORTS]

    def udp_target(self) -> tuple[str, int, str]:
        """The UDP listener as a probe target: (address, port, "udp")."""
        return (self.address, UDP_PORT, "udp")

    def wait_seen(self, count: int, timeout: float = 5.0) -> list[tuple[str, int, str]]:
        """What the listeners saw, once they saw at least ``count`` (or ``timeout`` passed)."""
        deadline = time.monotonic() + timeout
        while len(self.seen) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return list(self.seen)


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise OutsideHostError(
            f"`ip {' '.join(args)}` failed ({result.stderr.strip()}): the egress tests make a "
            "network namespace and need root (or CAP_NET_ADMIN) and iproute2"
        )


def _used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network this machine has: addresses, routes (all tables), Docker subnets."""
    nets: list[ipaddress.IPv4Network] = []
    addrs = subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True, check=True)
    for link in json.loads(addrs.stdout):
        for info in link.get("addr_info", []):
            nets.append(ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False))
    routes = subprocess.run(
        ["ip", "-j", "-4", "route", "show", "table", "all"],
        capture_output=True,
        text=True,
        check=True,
    )
    for route in json.loads(routes.stdout):
        if route.get("dst", "default") != "default":
            nets.append(ipaddress.IPv4Network(route["dst"], strict=False))
    ids = subprocess.run(["docker", "network", "ls", "-q"], capture_output=True, text=True)
    if ids.returncode == 0 and ids.stdout.split():
        inspect = subprocess.run(
            ["docker", "network", "inspect", *ids.stdout.split()],
            capture_output=True,
            text=True,
        )
        for net in json.loads(inspect.stdout or "[]"):
            for config in (net.get("IPAM") or {}).get("Config") or []:
                subnet = ipaddress.ip_network(config.get("Subnet", "::/128"), strict=False)
                if isinstance(subnet, ipaddress.IPv4Network):
                    nets.append(subnet)
    return nets


def pick_subnet(within: ipaddress.IPv4Network = RANGE) -> ipaddress.IPv4Network:
    """A random /30 of ``within`` (default RANGE) that overlaps nothing this machine uses."""
    used = _used_networks()
    for _ in range(100):
        start = int(within.network_address) + 4 * random.randrange(within.num_addresses // 4)
        candidate = ipaddress.IPv4Network(f"{ipaddress.IPv4Address(start)}/30")
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise OutsideHostError(f"no free /30 in {within}: this machine routes all of it")


def _start_listener(outside: OutsideHost) -> subprocess.Popen[str]:
    ports = ",".join(map(str, TCP_PORTS))
    proc = subprocess.Popen(
        [
            *("ip", "netns", "exec", outside.namespace, sys.executable, "-c", LISTENER),
            *(outside.address, outside.dns_name, ports, str(UDP_PORT)),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            words = line.split()
            if words == ["ready"]:
                ready.set()
            elif len(words) == 3:
                outside.seen.append((words[0], int(words[1]), words[2]))
        ready.set()  # it exited: let the waiter see that

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(START_TIMEOUT_S) or proc.poll() is not None:
        proc.kill()
        _, err = proc.communicate(timeout=5)
        raise OutsideHostError(f"the listener in {outside.namespace} did not start: {err}")
    return proc


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.stdin is not None:
        proc.stdin.close()  # the listener exits when its stdin closes
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


@contextmanager
def outside_host(within: str | None = None) -> Iterator[OutsideHost]:
    """Make the namespace, veth, addresses, routes and listeners; remove them all on exit.

    ``within``: the range its /30 is drawn from instead of 198.18.0.0/15, e.g. a private
    or link-local one ("10.0.0.0/8", "169.254.0.0/16") for a host that stands for the
    machine's private networks (still a namespace on this machine; nothing leaves it).

    The listener goes first (a process in the namespace would keep it, and its veth,
    alive), then the namespace (which deletes both veth ends, their addresses and routes).
    """
    suffix = secrets.token_hex(4)
    subnet = pick_subnet(ipaddress.IPv4Network(within) if within else RANGE)
    outside = OutsideHost(
        namespace=f"denv-outside-{suffix}",
        host_link=f"oh{suffix}h",  # not dvd…: the host guard must not cover it
        address=str(subnet[2]),
        host_address=str(subnet[1]),
        dns_name=f"outside-{suffix}.denv.test",  # .test: reserved, resolvable nowhere else
    )
    ns_link = f"oh{suffix}n"
    proc: subprocess.Popen[str] | None = None
    try:
        _ip("netns", "add", outside.namespace)
        _ip("link", "add", outside.host_link, "type", "veth", "peer", "name", ns_link)
        _ip("link", "set", ns_link, "netns", outside.namespace)
        # The host's route to the namespace is the /30 on its veth end.
        _ip("addr", "add", f"{outside.host_address}/30", "dev", outside.host_link)
        _ip("link", "set", outside.host_link, "up")
        _ip("-n", outside.namespace, "addr", "add", f"{outside.address}/30", "dev", ns_link)
        _ip("-n", outside.namespace, "link", "set", ns_link, "up")
        _ip("-n", outside.namespace, "link", "set", "lo", "up")
        _ip("-n", outside.namespace, "route", "add", "default", "via", outside.host_address)
        proc = _start_listener(outside)
        yield outside
    finally:
        if proc is not None:
            _stop(proc)
        for args in (
            ["netns", "del", outside.namespace],
            ["link", "del", outside.host_link],  # only if the namespace did not take it along
        ):
            subprocess.run(["ip", *args], capture_output=True, check=False)
