"""The subnet of each env network, carved by the server from its own pool.

Docker's default address pools hold about 30 bridge networks (172.17-31/16 and
192.168/16 in /20s); every env has a network of its own, so the server hands Docker an
explicit subnet instead: a /27 (30 addresses, room for a multi-service env) out of
``--subnet-pool`` (default 10.213.0.0/16: 2048 envs). A candidate is skipped when it
overlaps a Docker network (of any server sharing the engine) or a route of this host;
when Docker still answers "Pool overlaps" (another server took it a moment ago), the pool
learns what is in use again and the caller retries with the next candidate.

    pool = SubnetPool("10.213.0.0/16", 27)
    subnet = pool.allocate(lambda: docker_subnets())   # "10.213.4.32/27", None when all used
    pool.release(subnet)
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from denv.server.config import DEFAULT_SUBNET_POOL, DEFAULT_SUBNET_PREFIX

log = logging.getLogger(__name__)

OVERLAP_RETRIES = 8  # "Pool overlaps" answers (servers racing for a subnet) before giving up

Net = ipaddress.IPv4Network


def parse_pool(pool: str, prefix: int) -> Net:
    """The pool as a network; ValueError naming the fix when it cannot hold one subnet."""
    try:
        net = ipaddress.IPv4Network(pool, strict=True)
    except ValueError as exc:
        raise ValueError(f"--subnet-pool {pool!r} is not an IPv4 network ({exc})") from exc
    if not net.prefixlen <= prefix <= 29:
        raise ValueError(
            f"--subnet-size /{prefix} does not fit --subnet-pool {pool}: "
            f"pick a size between /{net.prefixlen} and /29"
        )
    return net


def host_routes(path: Path = Path("/proc/net/route")) -> list[Net]:
    """The IPv4 destinations this host routes to directly (not the default route)."""
    nets: list[Net] = []
    try:
        lines = path.read_text().splitlines()[1:]
    except OSError:
        return nets
    for line in lines:
        fields = line.split()
        if len(fields) < 8:
            continue
        dest = ipaddress.IPv4Address(int(fields[1], 16).to_bytes(4, "little"))
        mask = ipaddress.IPv4Address(int(fields[7], 16).to_bytes(4, "little"))
        if int(mask) == 0:
            continue  # the default route covers everything: not a clash
        nets.append(ipaddress.IPv4Network(f"{dest}/{mask}", strict=False))
    return nets


class SubnetPool:
    """Hands out the subnets of one pool, skipping those in use; thread-safe."""

    def __init__(self, pool: str = DEFAULT_SUBNET_POOL, prefix: int = DEFAULT_SUBNET_PREFIX):
        self.network = parse_pool(pool, prefix)
        self.prefix = prefix
        self._count = 1 << (prefix - self.network.prefixlen)
        # Servers sharing an engine start at different places, so they seldom race.
        self._next = secrets.randbelow(self._count)
        self._lock = threading.Lock()
        self._in_use: list[Net] = []
        self._mine: set[Net] = set()
        self._learned = False

    def _subnet(self, index: int) -> Net:
        base = int(self.network.network_address) + (index << (32 - self.prefix))
        return ipaddress.IPv4Network((base, self.prefix))

    def learn(self, used: Iterable[str]) -> None:
        """What is in use now: the given subnets (Docker's) and this host's routes."""
        nets: list[Net] = []
        for text in used:
            try:
                net = ipaddress.ip_network(text, strict=False)
            except ValueError:
                continue
            if isinstance(net, ipaddress.IPv4Network) and net.overlaps(self.network):
                nets.append(net)
        nets += [r for r in host_routes() if r.overlaps(self.network)]
        with self._lock:
            self._in_use = nets
            self._learned = True

    def allocate(self, used: Callable[[], Iterable[str]]) -> str | None:
        """The next free subnet, None when every one is in use (the node says so in its own
        terms); ``used()`` lists Docker's subnets when the pool must learn."""
        for attempt in range(2):
            with self._lock:
                if self._learned and attempt == 0:
                    found = self._take()
                    if found:
                        return found
            self.learn(used())
            with self._lock:
                found = self._take()
                if found:
                    return found
        return None

    def _take(self) -> str | None:
        for step in range(self._count):
            index = (self._next + step) % self._count
            net = self._subnet(index)
            if net in self._mine or any(net.overlaps(u) for u in self._in_use):
                continue
            self._next = (index + 1) % self._count
            self._mine.add(net)
            return str(net)
        return None

    def overlapped(self, subnet: str) -> None:
        """Docker said ``subnet`` overlaps: keep it out until the pool learns again."""
        with self._lock:
            net = ipaddress.IPv4Network(subnet)
            self._mine.discard(net)
            self._in_use.append(net)
            self._learned = False  # the next allocation asks Docker what is in use

    def release(self, subnet: str | None) -> None:
        """A network of ours is gone: its subnet may be handed out again."""
        if not subnet:
            return
        with self._lock:
            self._mine.discard(ipaddress.IPv4Network(subnet))
