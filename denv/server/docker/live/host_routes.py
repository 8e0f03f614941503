"""This host's routes to live children's subnets (``denv serve --live-netns on``): which
container an address of a child is reached through (``routed_via``, what a cluster node's
relay admits), and the routes a stopped server left behind (``prune_routes``). The routes
themselves are made and removed with their container's network (``netns.LiveNet``)."""

from __future__ import annotations

import contextlib
import ipaddress
import struct
from collections.abc import Callable

from denv.server.docker.live import netns


def routed_via(ip: str, route_table: str = "/proc/net/route") -> str | None:
    """The container a live child's address is reached through: the gateway of this host's
    route to the children's subnet holding ``ip`` (one this module made), read from the
    kernel's table without a subprocess; None when ``ip`` is no such child's address (not in
    ``netns.SUBNETS``, not routed, or a subnet's network, gateway or broadcast address)."""
    try:
        addr = ipaddress.IPv4Address(ip)
    except ValueError:
        return None
    if addr not in netns.SUBNETS:
        return None
    with open(route_table) as f:
        rows = f.read().splitlines()[1:]
    for row in rows:
        fields = row.split()  # Iface Destination Gateway Flags RefCnt Use Metric Mask ...
        if len(fields) < 8:
            continue
        dest, gateway, mask = (_le_address(x) for x in (fields[1], fields[2], fields[7]))
        if gateway == ipaddress.IPv4Address(0):
            continue
        subnet = ipaddress.IPv4Network(f"{dest}/{mask}", strict=False)
        if subnet.prefixlen == netns.PREFIX and subnet.subnet_of(netns.SUBNETS) and addr in subnet:
            offset = int(addr) - int(subnet.network_address)
            if offset in (0, 1, subnet.num_addresses - 1):
                return None
            return str(gateway)
    return None


def _le_address(hex_le: str) -> ipaddress.IPv4Address:
    """An address as /proc/net/route writes it (hex, in the host's byte order)."""
    return ipaddress.IPv4Address(struct.pack("=I", int(hex_le, 16)))


def prune_routes(
    running: Callable[[], set[str]], engine_subnets: list[ipaddress.IPv4Network]
) -> list[str]:
    """Remove this host's routes to children's subnets whose gateway is an address of the
    engine's networks (``engine_subnets``) that no running container has (``running()``:
    their addresses): left by a server that stopped without removing them. A route via any
    other address is not an env container's, and stays (another tool's, a test's). Returns
    the subnets removed.

    The routes are read before the containers: a container that claims its route between
    the two reads is then running when the second is made (read the other way round, its
    fresh route would look stale, and its children would be cut off)."""
    out = netns.run_ip(["ip", "-4", "route", "show", "root", str(netns.SUBNETS)])
    keep = running()
    removed = []
    for line in out.splitlines():
        words = line.split()
        if "via" not in words or not words[0].endswith(f"/{netns.PREFIX}"):
            continue  # not a route this module makes (a link's own subnet, another tool's)
        via = words[words.index("via") + 1]
        try:
            at = ipaddress.IPv4Address(via)
        except ValueError:
            continue
        if via not in keep and any(at in net for net in engine_subnets):
            with contextlib.suppress(netns.NetError):
                netns.run_ip(["ip", "route", "del", words[0], "via", via])
                removed.append(words[0])
    return removed
