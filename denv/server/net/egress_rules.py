"""The egress firewall's rules, as iptables arguments: which chains, and what each holds.

An egress ``allow`` env (``dva…`` bridge) may reach the internet but, by default, not the
server's host, link-local addresses or private networks; an allowlist env (``dvl…`` bridge)
reaches only what its allowlist names. Two chains per family hold the rules:

- ``DENV-EGRESS-IN``, jumped to from ``INPUT`` for ``dva+``/``dvl+``: what reaches the host;
- ``DENV-EGRESS-FWD`` in the ``mangle`` table, jumped to from its ``FORWARD``: what is
  routed onward. Not in ``filter``'s ``DOCKER-USER``, Docker's place for user rules: Docker
  deletes and re-inserts its jump to ``DOCKER-USER`` whenever it makes or removes a network,
  and in between, traffic of a new bridge meets Docker's own ACCEPT first (seen here: an
  allowlist env reached everything while other tests made networks). Docker never touches
  ``mangle``; the price is that ``mangle`` cannot REJECT, so a refused routed connection is
  dropped (the attempt times out) where the host (``INPUT``) answers at once.

Each chain is per-env rules first (inserted at the top, tagged ``denv-egress env <bridge>``:
an allowlist's destinations, or a whole bridge let through for a server started with
``--allow-private-egress``), then the generic rules (tagged ``denv-egress generic``):
replies pass, traffic within an env's own bridge passes (Docker's isolation still drops it
between bridges), DNS to the host's resolvers passes (an allow env keeps its names), then
private ranges (and, in ``DENV-EGRESS-IN``, everything) are refused for ``dva+`` and every
new connection for ``dvl+``. A missing per-env rule closes an env, never opens one.

An env's rules are ``EnvRule`` records and the refused ranges ``PRIVATE_RANGES``; the seam's
egress policy (``denv.server.node.egress``) resolves an allowlist into them, so it imports
them from here and this module imports nothing of the server.

Nothing here runs iptables: ``firewall`` applies these rules and keeps them in place.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

IN_CHAIN = "DENV-EGRESS-IN"
FWD_CHAIN = "DENV-EGRESS-FWD"
ALLOW_PREFIX = "dva"
ALLOWLIST_PREFIX = "dvl"
GENERIC_TAG = "denv-egress generic"
ENV_TAG = "denv-egress env"
_REJECT = {
    "iptables": ["REJECT", "--reject-with", "icmp-admin-prohibited"],
    "ip6tables": ["REJECT", "--reject-with", "icmp6-adm-prohibited"],
}
TABLE = {IN_CHAIN: "filter", FWD_CHAIN: "mangle"}  # the chain of a rule says its table


# What an egress-allow env cannot reach by default (besides the host itself, refused in
# DENV-EGRESS-IN): private, shared (CGN) and link-local ranges of each family.
PRIVATE_RANGES = {
    "iptables": [
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "169.254.0.0/16",
    ],
    "ip6tables": ["fc00::/7", "fe80::/10"],
}


@dataclass(frozen=True)
class EnvRule:
    """One destination an env may reach: an IPv4 network, a port or all ports (None).

    ``host``: the destination is the server's host itself (``0.0.0.0/0``: any of its
    addresses), which only ``INPUT`` sees; otherwise both ``INPUT`` (for a host address in
    ``dest``) and the routed path are opened.
    """

    dest: str
    port: int | None = None
    host: bool = False


def comment(tag: str) -> list[str]:
    return ["-m", "comment", "--comment", tag]


def _quote(word: str) -> str:
    return f'"{word}"' if " " in word else word


def render(action: str, chain: str, rule: list[str]) -> str:
    """A rule as an ``iptables-restore`` line (``-A``, ``-I`` or ``-D``)."""
    return " ".join([action, chain, *map(_quote, rule)])


def generic_rules(tool: str, resolvers: list[str]) -> dict[str, list[list[str]]]:
    """The generic rules of each chain, in order, for one tool; ``resolvers``: the host's
    nameservers an allow env may ask."""
    v6 = tool == "ip6tables"
    tag = comment(GENERIC_TAG)
    reject = _REJECT[tool]
    common: list[list[str]] = [
        ["-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", *tag, "-j", "RETURN"],
    ]
    dns: list[list[str]] = []
    for address in resolvers:
        if (ipaddress.ip_address(address).version == 6) != v6:
            continue
        for proto in ("udp", "tcp"):
            dns.append(
                [
                    *("-i", ALLOW_PREFIX + "+", "-d", address, "-p", proto, "--dport", "53"),
                    *(*tag, "-j", "RETURN"),
                ]
            )
    fwd = [
        *common,
        ["-i", ALLOW_PREFIX + "+", "-o", ALLOW_PREFIX + "+", *tag, "-j", "RETURN"],
        ["-i", ALLOWLIST_PREFIX + "+", "-o", ALLOWLIST_PREFIX + "+", *tag, "-j", "RETURN"],
        *dns,
        *(
            ["-i", ALLOW_PREFIX + "+", "-d", net, *tag, "-j", "DROP"]
            for net in PRIVATE_RANGES[tool]
        ),
        ["-i", ALLOWLIST_PREFIX + "+", *tag, "-j", "DROP"],
    ]
    inp = [
        *common,
        *dns,
        ["-i", ALLOW_PREFIX + "+", *tag, "-j", *reject],
        ["-i", ALLOWLIST_PREFIX + "+", *tag, "-j", *reject],
    ]
    return {FWD_CHAIN: fwd, IN_CHAIN: inp}


def jumps() -> list[tuple[str, list[str]]]:
    """(parent chain, rule) of each jump; the table is the target chain's."""
    return [
        (parent, ["-i", prefix + "+", "-j", target])
        for parent, target in (("INPUT", IN_CHAIN), ("FORWARD", FWD_CHAIN))
        for prefix in (ALLOW_PREFIX, ALLOWLIST_PREFIX)
    ]


def env_rules(tool: str, bridge: str, rules: list[EnvRule]) -> list[tuple[str, list[str]]]:
    """(chain, rule) of each per-env rule of ``bridge``, in order, for one tool."""
    tag = comment(f"{ENV_TAG} {bridge}")
    if bridge.startswith(ALLOW_PREFIX):  # --allow-private-egress: the bridge as before
        return [(chain, ["-i", bridge, *tag, "-j", "RETURN"]) for chain in (IN_CHAIN, FWD_CHAIN)]
    if tool == "ip6tables":
        return []  # allowlists hold IPv4 destinations only: IPv6 stays refused
    # A destination is routed (FORWARD) unless it is one of the host's own addresses
    # (INPUT): each entry gets both rules, so a CIDR covering the host works too.
    out: list[tuple[str, list[str]]] = []
    for rule in rules:
        for proto in ("tcp", "udp") if rule.port else (None,):
            match = ["-i", bridge]
            if not (rule.host and rule.dest == "0.0.0.0/0"):
                match += ["-d", rule.dest]
            if proto:
                match += ["-p", proto, "--dport", str(rule.port)]
            out.append((IN_CHAIN, [*match, *tag, "-j", "ACCEPT"]))
            if not rule.host:
                out.append((FWD_CHAIN, [*match, *tag, "-j", "RETURN"]))
    return out
