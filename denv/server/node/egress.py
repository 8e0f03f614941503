"""An env's egress policy: ``deny``, ``allow``, or an allowlist, as the API gives it.

An allowlist (``{"allow": ["name-or-cidr[:port]", ...]}``) is checked and resolved when the
env is created: each name is looked up by the server then (its IPv4 addresses at that
moment become the rules, and the env's ``/etc/hosts`` maps the name to the first one; the
env itself has no resolver), CIDRs and addresses are taken as they are, and
``host.docker.internal`` names the server's host. A port limits an entry to that TCP and
UDP port; without one every port is allowed. Everything else is refused.

Records keep a policy as one string (``EnvRecord.egress``, ``BootSpec.egress``): ``deny``,
``allow``, or the allowlist as canonical JSON with its resolved rules, so a fork's
children inherit exactly what their parent was given and equal policies share warm pools.
A policy's rules are the firewall's ``EnvRule`` records (``denv.server.net.egress_rules``,
with the private ranges an entry may not name).

    text = allowlist(["10.1.2.3:8000", "api.example.com:443"], allow_private=True)
    policy = parse(text)          # Policy(mode="allowlist", rules=(...), hosts=(...))
    public(text)                  # {"allow": ["10.1.2.3:8000", "api.example.com:443"]}
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
import subprocess
from dataclasses import dataclass, field
from typing import Any

from denv.server.net.egress_rules import PRIVATE_RANGES, EnvRule
from denv.server.node.errors import Invalid

MAX_ENTRIES = 64

HOST_NAME = "host.docker.internal"
_NAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
_PRIVATE = [ipaddress.IPv4Network(n) for n in PRIVATE_RANGES["iptables"]] + [
    ipaddress.IPv4Network("127.0.0.0/8"),
    ipaddress.IPv4Network("0.0.0.0/8"),
]
_FIX_PRIVATE = (
    "the server refuses the host, private and link-local destinations unless its operator "
    "started it with `denv serve --allow-private-egress`"
)


@dataclass(frozen=True)
class Policy:
    """A parsed egress string: the mode, and for an allowlist its entries and rules."""

    mode: str  # "deny" | "allow" | "allowlist"
    entries: tuple[str, ...] = ()
    rules: tuple[EnvRule, ...] = ()
    hosts: tuple[tuple[str, str], ...] = field(default=())  # (name, IPv4) for /etc/hosts

    @property
    def published(self) -> bool:
        """Whether the agent's ports are published on the host (else: through ingress)."""
        return self.mode == "allow"

    @property
    def internal(self) -> bool:
        """Whether the env's network is an internal one (nothing routed in or out)."""
        return self.mode == "deny"

    @property
    def resolver(self) -> bool:
        """Whether the env keeps the host's resolvers (only ``allow``)."""
        return self.mode == "allow"


# On an env's Docker network: its egress when it is not deny, so a restarted server can take
# back the network's firewall rules (``Engine.adopt_egress``).
EGRESS_LABEL = "denv.egress"


def egress_label(text: str) -> dict[str, str]:
    """The network labels that record an egress string (none for ``deny``)."""
    return {} if text == "deny" else {EGRESS_LABEL: text}


def parse(text: str) -> Policy:
    """The policy a record's egress string holds."""
    if text in ("deny", "allow"):
        return Policy(mode=text)
    doc = json.loads(text)
    return Policy(
        mode="allowlist",
        entries=tuple(doc["allow"]),
        rules=tuple(EnvRule(dest=d, port=p, host=h) for d, p, h in doc["rules"]),
        hosts=tuple((n, a) for n, a in doc["hosts"]),
    )


def egress_hosts(policy: Policy) -> dict[str, str]:
    """An allowlist env's ``/etc/hosts`` additions: its names, and the host if it is listed."""
    hosts = dict(policy.hosts)
    if any(rule.host for rule in policy.rules):
        hosts[HOST_NAME] = "host-gateway"  # Docker writes the host's address on its bridge
    return hosts


def public(text: str) -> str | dict[str, Any]:
    """The egress as the API shows it: ``deny``, ``allow`` or ``{"allow": [entries]}``."""
    policy = parse(text)
    return {"allow": list(policy.entries)} if policy.mode == "allowlist" else policy.mode


def from_request(value: str | list[str], *, allow_private: bool) -> str:
    """A request's egress (a mode, or the entries of ``{"allow": [...]}``) as a record's."""
    if isinstance(value, str):
        return value
    return allowlist(list(value), allow_private=allow_private)


def _bad(path: str, message: str) -> Invalid:
    return Invalid(message, path)


def _split_port(entry: str, path: str) -> tuple[str, int | None]:
    """``name-or-cidr[:port]``; an IPv6 address is refused (env networks are IPv4 only)."""
    if entry.startswith("[") or entry.count(":") > 1:
        raise _bad(
            path,
            f"egress entry {entry!r} is an IPv6 destination: env networks have IPv4 only, "
            "so no IPv6 destination can be allowed; give an IPv4 address, CIDR or a name",
        )
    target, _, port_text = entry.partition(":")
    if not port_text:
        return target, None
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise _bad(
            path,
            f"egress entry {entry!r}: the port {port_text!r} is not a number from 1 to 65535 "
            "(write name-or-cidr[:port], e.g. 10.1.2.3:8000 or api.example.com:443)",
        )
    return target, int(port_text)


def _local_networks() -> list[ipaddress.IPv4Network]:
    """The host's own IPv4 addresses (a destination there is the host itself)."""
    out = subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True, check=False)
    nets: list[ipaddress.IPv4Network] = []
    for link in json.loads(out.stdout or "[]"):
        for info in link.get("addr_info", []):
            nets.append(ipaddress.IPv4Network(f"{info['local']}/32"))
    return nets


def _resolve(name: str, entry: str, path: str) -> list[str]:
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise _bad(
            path,
            f"egress entry {entry!r}: the server could not resolve {name!r} ({exc}); names "
            "are looked up by the server when the env is created: check the name, or give "
            "its address or CIDR",
        ) from exc
    return sorted({str(info[4][0]) for info in infos})


def allowlist(entries: list[str], *, allow_private: bool, path: str = "egress.allow") -> str:
    """Check and resolve an allowlist; the record's egress string. ``Invalid`` naming the
    entry (``path``) and the fix when it cannot be."""
    if not entries:
        raise _bad(
            path,
            "egress allowlist is empty: list at least one destination, or use egress "
            "'deny' for an env that reaches nothing",
        )
    if len(entries) > MAX_ENTRIES:
        raise _bad(
            path,
            f"egress allowlist has {len(entries)} entries, more than {MAX_ENTRIES}: "
            "merge addresses into CIDRs",
        )
    local = _local_networks()
    rules: list[EnvRule] = []
    hosts: dict[str, str] = {}
    for i, entry in enumerate(entries):
        where = f"{path}[{i}]"
        if not isinstance(entry, str) or not entry.strip():
            raise _bad(where, "egress entry must be a non-empty string: name-or-cidr[:port]")
        target, port = _split_port(entry.strip(), where)
        if target.lower() == HOST_NAME:
            if not allow_private:
                raise _bad(where, f"egress entry {entry!r} names the server's host: {_FIX_PRIVATE}")
            rules.append(EnvRule(dest="0.0.0.0/0", port=port, host=True))
            continue
        try:
            nets = [ipaddress.IPv4Network(target, strict=False)]
        except ValueError:
            if not _NAME.match(target) or target.replace(".", "").isdigit():
                raise _bad(
                    where,
                    f"egress entry {entry!r} is neither an IPv4 address, a CIDR nor a host "
                    "name: write name-or-cidr[:port], e.g. 10.1.2.0/24:8000 or "
                    "api.example.com:443",
                ) from None
            addresses = _resolve(target, entry, where)
            hosts.setdefault(target.lower(), addresses[0])
            nets = [ipaddress.IPv4Network(f"{a}/32") for a in addresses]
        for net in nets:
            if net.prefixlen == 0 and not allow_private:
                raise _bad(
                    where,
                    f"egress entry {entry!r} covers every address, the host and private "
                    f"networks included: {_FIX_PRIVATE}; or use egress 'allow'",
                )
            if not allow_private and any(net.overlaps(p) for p in _PRIVATE + local):
                raise _bad(
                    where,
                    f"egress entry {entry!r} ({net}) is a private, link-local or host "
                    f"address: {_FIX_PRIVATE}",
                )
            rules.append(EnvRule(dest=str(net), port=port))
    doc = {
        "allow": [e.strip() for e in entries],
        "rules": [[r.dest, r.port, r.host] for r in rules],
        "hosts": sorted(hosts.items()),
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))
