"""A network namespace per live child (``denv serve --live-netns on``): the node's side.

Each live child is cloned into a network namespace of its own (the launcher adds
CLONE_NEWNET). The node connects it to its container like a container to a host:

- **Once per container** (its first live server, :meth:`LiveNet.ensure`), in the container's
  network namespace: a bridge ``denv-live`` holding the gateway address of a subnet of the
  container's own (``SUBNETS`` cut in ``/PREFIX``s, one no Docker network uses), IPv6 off on
  it, forwarding on, and static iptables rules: a new connection from a child to the
  container itself (its parent's port, at any address) is refused, so is one from the
  container's own processes to a child (the parent, the image's other processes), and
  nothing is routed from a child back to a child (siblings); children's egress leaves
  masqueraded as the container's address, so the host's egress rules, keyed on the env's
  bridge, hold for them as for the container. The host routes that subnet to the
  container's address (the route goes with the env's network when it is removed).
- **Per child** (:meth:`LiveNet.attach`, before the child runs env code again): one
  netlink request in the container's namespace makes a veth pair whose child end is made
  directly in the child's namespace (``eth0``, its MAC following its address), then the
  bridge end is made an *isolated* port (the bridge passes no frame between two children)
  and up, with a permanent neighbour entry for the child's address. The child brings up
  ``lo`` and ``eth0``, sets its address and default route itself (it holds every
  capability of its own user namespace, which owns the new network namespace), drops them
  and serves the env's own port at its own address; ingress connects there.
- **Per delete**: the pair dies with the child's namespace. Its address is handed out
  again only once the pair is gone: the bridge end is named after the address, so making
  it again while the old one is there fails (EEXIST) and the next free address is taken.

Measured in docs/live-forks.md ("A network namespace per child").
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import os
import socket
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Any

from denv.server.docker.live import netlink

# raised here too (a child's network could not be made), by the netlink requests first
from denv.server.docker.live.netlink import NetError as NetError

log = logging.getLogger(__name__)

# Where children's subnets come from: the shared address space of RFC 6598, which Docker's
# default pools do not use and denv's own egress rules refuse as a destination.
SUBNETS = ipaddress.IPv4Network("100.64.0.0/10")
PREFIX = 22  # 1,021 children per container, 1,024 containers per node
BRIDGE = "denv-live"
CHILD_IF = "eth0"
PAIR_PREFIX = "dl"  # the bridge end of a child's pair: dl<host index in hex>
ATTACH_TRIES = 64  # addresses tried per child while earlier pairs are still there


@dataclass
class ContainerNet:
    """The children's network of one container: its subnet and the addresses taken."""

    container: str
    pid: int  # the container's pid 1 (its network namespace)
    subnet: ipaddress.IPv4Network
    bridge: int  # the bridge's index in the container's namespace
    via: str = ""  # the container's address: the host route's gateway
    taken: dict[int, str] = field(default_factory=dict)  # host index -> env
    dns: bool = False  # the gateway forwards to Docker's embedded resolver
    next: int = 2  # where the search for a free address starts (1 is the gateway)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # A netlink socket in the container's namespace, made at its first child and kept
    # until the container goes (``forget``): requests on it take ``sending``.
    nl: socket.socket | None = None
    sending: threading.Lock = field(default_factory=threading.Lock)

    @property
    def gateway(self) -> str:
        return str(self.subnet.network_address + 1)

    def address(self, index: int) -> str:
        return str(self.subnet.network_address + index)


def run_ip(args: list[str], stdin: str | None = None) -> str:
    """Run one of iproute2's, iptables' or nsenter's commands; ``NetError`` naming the fix."""
    try:
        proc = subprocess.run(args, input=stdin, capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise NetError(
            f"{args[0]} is not installed on this host (live children's networks need "
            "iproute2, iptables and nsenter): install it, or run `denv serve --live-netns off`"
        ) from exc
    if proc.returncode != 0:
        raise NetError(f"{' '.join(args[:4])}...: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def _rules(subnet: ipaddress.IPv4Network) -> str:
    """The container's static rules (``iptables-restore --noflush``: Docker's own stay)."""
    return "\n".join(
        [
            "*filter",
            f"-A INPUT -i {BRIDGE} -m conntrack --ctstate NEW "
            "-j REJECT --reject-with icmp-admin-prohibited",
            f"-A FORWARD -i {BRIDGE} -o {BRIDGE} -j DROP",
            f"-A OUTPUT -o {BRIDGE} -m conntrack --ctstate NEW "
            "-j REJECT --reject-with icmp-admin-prohibited",
            "COMMIT",
            "*nat",
            f"-A POSTROUTING -s {subnet} ! -o {BRIDGE} -j MASQUERADE",
            "COMMIT",
            "",
        ]
    )


# In the container's namespace, once: the bridge with IPv6 off (so no process of the
# container reaches a child by a link-local address), forwarding on, the rules. The bridge
# gets a MAC of its own: left to the kernel it takes its lowest port's, so deleting the child
# of that port changed the gateway's MAC under its siblings, whose cached one then led
# nowhere (a sibling's replies were lost: its connections hung, 16% of them in a loop).
_SETUP = r"""set -e
echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6 2>/dev/null || true
ip link add {bridge} address {mac} type bridge
echo 1 > /proc/sys/net/ipv6/conf/{bridge}/disable_ipv6 2>/dev/null || true
ip addr add {gateway}/{prefix} dev {bridge}
ip link set {bridge} up
echo 1 > /proc/sys/net/ipv4/ip_forward
iptables-restore -w 5 --noflush
# Docker's embedded resolver (127.0.0.11, at ports its own NAT rules name) is the
# container's loopback: a child's queries to the gateway are sent there.
for proto in udp tcp; do
  port=$(iptables -w 5 -t nat -S DOCKER_OUTPUT 2>/dev/null |
    sed -n "s/.*-p $proto .*--to-destination 127.0.0.11:\([0-9]*\).*/\1/p" | head -n 1)
  [ -n "$port" ] || continue
  echo 1 > /proc/sys/net/ipv4/conf/{bridge}/route_localnet
  iptables -w 5 -t nat -A PREROUTING -i {bridge} -d {gateway} -p $proto --dport 53 \
    -j DNAT --to-destination 127.0.0.11:$port
  iptables -w 5 -I INPUT 1 -i {bridge} -d 127.0.0.11 -p $proto --dport $port -j ACCEPT
  echo "dns $proto"
done
"""


class LiveNet:
    """The children's networks of this node's containers. Safe to call from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nets: dict[str, ContainerNet] = {}
        self._making: dict[str, threading.Lock] = {}

    def ensure(self, container: str, pid: int) -> ContainerNet:
        """The container's children's network (``pid``: its pid 1), made at its first call;
        after a server restart, found again in the container's namespace."""
        with self._lock:
            net = self._nets.get(container)
            making = self._making.setdefault(container, threading.Lock())
        if net is not None and net.pid == pid:
            return net
        with making:
            with self._lock:
                net = self._nets.get(container)
            if net is not None and net.pid == pid:
                return net
            net = self._found(container, pid) or self._make(container, pid)
            with self._lock:
                self._nets[container] = net
            return net

    def known(self, container: str) -> ContainerNet | None:
        with self._lock:
            return self._nets.get(container)

    def _found(self, container: str, pid: int) -> ContainerNet | None:
        """The bridge a running container already has (made before this server started),
        with the addresses its children's pairs hold."""
        with netlink.open_in(pid) as nl:
            addrs = netlink.dump_addrs(nl)
        mine = [a for a in addrs if a[0] == BRIDGE]
        if not mine:
            return None
        _, ip, plen, index = mine[0]
        subnet = ipaddress.IPv4Network(f"{ip}/{plen}", strict=False)
        nat = run_ip(["nsenter", f"--net=/proc/{pid}/ns/net", "--", "iptables", "-w", "5",
                    "-t", "nat", "-S", "PREROUTING"])  # fmt: skip
        via = _container_address(pid)
        net = ContainerNet(container, pid, subnet, index, via, dns=f"-i {BRIDGE} " in nat)
        # Addresses are handed out in turn from past the highest pair there: the children
        # of before the restart keep theirs (a pair still there refuses its name: EEXIST).
        held = [0]
        for name in _link_names(pid):
            if name.startswith(PAIR_PREFIX):
                with contextlib.suppress(ValueError):
                    held.append(int(name[len(PAIR_PREFIX) :], 16))
        net.next = max(held) + 1
        self._route(net, via)
        return net

    def _make(self, container: str, pid: int) -> ContainerNet:
        addr = _container_address(pid)
        subnet = self._claim_subnet(addr)
        gateway = subnet.network_address + 1
        mac = ":".join(f"{b:02x}" for b in netlink.mac_of(str(gateway)))
        script = _SETUP.format(bridge=BRIDGE, gateway=gateway, prefix=PREFIX, mac=mac)
        try:
            out = run_ip(
                ["nsenter", f"--net=/proc/{pid}/ns/net", "--", "/bin/sh", "-c", script],
                stdin=_rules(subnet),
            )
        except NetError:
            with contextlib.suppress(NetError):
                run_ip(["ip", "route", "del", str(subnet), "via", addr])
            raise
        with netlink.open_in(pid) as nl:
            index = next((a[3] for a in netlink.dump_addrs(nl) if a[0] == BRIDGE), 0)
        if not index:
            raise NetError(f"the bridge {BRIDGE} was not made in the env's network namespace")
        net = ContainerNet(container, pid, subnet, index, addr, dns="dns udp" in out)
        log.info("live children of %s: %s via %s", container[:12], subnet, addr)
        return net

    def _route(self, net: ContainerNet, via: str) -> None:
        run_ip(["ip", "route", "replace", str(net.subnet), "via", via])

    def _claim_subnet(self, via: str) -> ipaddress.IPv4Network:
        """A subnet no container of this host has, claimed by adding its host route via
        ``via`` (the route is the claim: other servers on this host read the routes, and of
        two that pick the same subnet at once, the second's ``ip route add`` fails)."""
        for _ in range(ATTACH_TRIES):
            out = run_ip(["ip", "-4", "route", "show", "root", str(SUBNETS)])
            used = {ipaddress.IPv4Network(x.split()[0], strict=False) for x in out.splitlines()}
            with self._lock:
                used |= {n.subnet for n in self._nets.values()}
            free = (s for s in SUBNETS.subnets(new_prefix=PREFIX) if not any(map(s.overlaps, used)))
            subnet = next(free, None)
            if subnet is None:
                raise NetError(f"every /{PREFIX} of {SUBNETS} is in use by a live container")
            try:
                proc = subprocess.run(
                    ["ip", "route", "add", str(subnet), "via", via], capture_output=True, text=True
                )
            except FileNotFoundError as exc:
                raise NetError("ip (iproute2) is not installed on this host") from exc
            if proc.returncode == 0:
                return subnet
            if "File exists" not in proc.stderr:
                raise NetError(f"ip route add {subnet} via {via}: {proc.stderr.strip()}")
        raise NetError("no subnet for the env's live children: other servers took each one tried")

    def attach(self, net: ContainerNet, env_id: str, pid: int) -> dict[str, Any]:
        """Connect the child ``pid`` (in its own network namespace) to the container's
        bridge: what its launcher sets up itself (``net`` of its ``setup``)."""
        with net.sending:
            if net.nl is None:
                net.nl = netlink.open_in(net.pid)
            for _ in range(ATTACH_TRIES):
                index = self._take(net, env_id)
                ip = net.address(index)
                try:
                    err = netlink.add_pair(
                        net.nl, net.bridge, f"{PAIR_PREFIX}{index:x}", CHILD_IF, ip, pid
                    )
                except OSError as exc:  # a socket mid-request is not used again
                    net.nl.close()
                    net.nl = None
                    self.release(net.container, env_id)
                    raise NetError(f"connecting the child to its container: {exc}") from exc
                if err == 0:
                    addr = f"{ip}/{net.subnet.prefixlen}"
                    cfg = {"addr": addr, "gw": net.gateway, "if": CHILD_IF}
                    return {**cfg, "dns": net.gateway} if net.dns else cfg
                if err != errno.EEXIST:  # EEXIST: the address's last pair is still going
                    self.release(net.container, env_id)
                    raise NetError(f"connecting the child to its container: {os.strerror(err)}")
        self.release(net.container, env_id)
        raise NetError(
            "no free address for the child: its container's last deletes are still going"
        )

    def _take(self, net: ContainerNet, env_id: str) -> int:
        size = net.subnet.num_addresses
        with net.lock:
            net.taken = {i: e for i, e in net.taken.items() if e != env_id}
            for step in range(size):
                index = 2 + (net.next - 2 + step) % (size - 3)
                if index not in net.taken:
                    net.taken[index] = env_id
                    net.next = index + 1
                    return index
        raise NetError(f"the container's {size - 3} child addresses are all taken")

    def release(self, container: str, env_id: str) -> None:
        """The child ``env_id`` was deleted: its address may be taken again (once its pair,
        which dies with its namespace, is gone: see :meth:`attach`)."""
        net = self.known(container)
        if net is None:
            return
        with net.lock:
            net.taken = {i: e for i, e in net.taken.items() if e != env_id}

    def forget(self, container: str) -> None:
        """The container is being removed: its host route goes (its network's removal would
        take it too), then what this node knew of it."""
        with self._lock:
            net = self._nets.pop(container, None)
            self._making.pop(container, None)
        if net is not None:
            with net.sending:
                if net.nl is not None:
                    net.nl.close()  # it would keep the container's namespace alive
                    net.nl = None
            # Only the route via this container: when its network went first (taking the
            # route), another container may hold the same subnet by now.
            with contextlib.suppress(NetError):
                run_ip(["ip", "route", "del", str(net.subnet), "via", net.via])


def _link_names(pid: int) -> list[str]:
    return [name for name, _ in _links(pid)]


def _links(pid: int) -> list[tuple[str, int]]:
    out = run_ip(["nsenter", f"--net=/proc/{pid}/ns/net", "--", "ip", "-o", "link", "show"])
    links = []
    for line in out.splitlines():
        index, name = line.split(":")[:2]
        links.append((name.strip().split("@")[0], int(index)))
    return links


def _container_address(pid: int) -> str:
    out = run_ip(["nsenter", f"--net=/proc/{pid}/ns/net", "--", "ip", "-4", "-o", "addr", "show",
                "dev", "eth0"])  # fmt: skip
    words = out.split()
    if len(words) < 4:
        raise NetError("the env's container has no IPv4 address on eth0")
    return words[3].split("/")[0]
