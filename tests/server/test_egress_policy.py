"""Egress policies as the server reads them: allowlist entries, their errors, the rules.

No Docker and no iptables. Name lookups go through ``socket.getaddrinfo``, replaced here by
a table (a real lookup of a made-up name would send a DNS query off this machine).
"""

from __future__ import annotations

import socket
from typing import Any

import pytest

from denv.server.errors import from_node
from denv.server.net.egress_rules import FWD_CHAIN, IN_CHAIN, EnvRule
from denv.server.net.firewall import Firewall
from denv.server.node import egress
from denv.server.node.errors import Invalid

NAMES = {"proxy.trainer.test": ["198.51.100.7", "198.51.100.8"], "lan.test": ["192.168.1.9"]}


@pytest.fixture(autouse=True)
def names(monkeypatch: pytest.MonkeyPatch) -> None:
    def lookup(name: str, *args: Any, **kwargs: Any) -> list[Any]:
        if name not in NAMES:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0)) for a in NAMES[name]]

    monkeypatch.setattr(egress.socket, "getaddrinfo", lookup)


def refused(entries: list[str], allow_private: bool = False) -> Invalid:
    with pytest.raises(Invalid) as info:
        egress.allowlist(entries, allow_private=allow_private)
    answer = from_node(info.value)  # as the API answers it
    assert (answer.status, answer.code) == (422, "invalid_request")
    return info.value


def test_an_allowlist_is_resolved_once_into_rules_and_hosts() -> None:
    text = egress.allowlist(["proxy.trainer.test:8100", "203.0.113.0/24"], allow_private=False)
    policy = egress.parse(text)
    assert policy.mode == "allowlist" and not policy.published and not policy.resolver
    assert policy.rules == (
        EnvRule(dest="198.51.100.7/32", port=8100),
        EnvRule(dest="198.51.100.8/32", port=8100),
        EnvRule(dest="203.0.113.0/24", port=None),
    )
    assert egress.egress_hosts(policy) == {"proxy.trainer.test": "198.51.100.7"}
    assert egress.public(text) == {"allow": ["proxy.trainer.test:8100", "203.0.113.0/24"]}
    assert egress.public("deny") == "deny" and egress.parse("allow").published


def test_the_host_and_private_networks_need_the_operators_flag() -> None:
    for entries in (["host.docker.internal:8100"], ["lan.test"], ["10.0.0.0/8"], ["0.0.0.0/0"]):
        assert "--allow-private-egress" in refused(entries).message, entries
    text = egress.allowlist(["host.docker.internal:8100", "lan.test"], allow_private=True)
    policy = egress.parse(text)
    assert EnvRule(dest="0.0.0.0/0", port=8100, host=True) in policy.rules
    assert egress.egress_hosts(policy)["host.docker.internal"] == "host-gateway"


def test_bad_entries_name_the_entry_and_the_fix() -> None:
    cases = {
        "[fd00::1]:80": "IPv4 only",
        "fd00::/8": "IPv4 only",
        "10.1.2.3:0": "from 1 to 65535",
        "a.test:http": "from 1 to 65535",
        "under_score!": "name-or-cidr[:port]",
        "nothing.test": "could not resolve",
    }
    for entry, fix in cases.items():
        error = refused(["203.0.113.1", entry])
        assert fix in error.message and entry in error.message, (entry, error.message)
        assert error.details == {"path": "egress.allow[1]"}
    assert "is empty" in refused([]).message
    assert "more than 64" in refused([f"203.0.113.{i}" for i in range(65)]).message


def test_the_firewall_rules_of_an_allowlist_env_and_of_the_generic_chains() -> None:
    fw = Firewall(["10.255.255.53"])
    rules = [EnvRule(dest="198.51.100.7/32", port=8100), EnvRule("0.0.0.0/0", 9000, host=True)]
    made = fw._env_rules("iptables", "dvl0123456789ab", rules)
    chains = [chain for chain, _ in made]
    # TCP and UDP of each: the routed path and the host for the address, the host for the host.
    assert chains.count(FWD_CHAIN) == 2 and chains.count(IN_CHAIN) == 4
    assert fw._env_rules("ip6tables", "dvl0123456789ab", rules) == []  # IPv6 stays refused
    generic = fw.generic("iptables")
    dns = [r for r in generic[FWD_CHAIN] if "53" in r and "10.255.255.53" in r]
    assert len(dns) == 2  # UDP and TCP to the resolver, before the private ranges
    last = generic[FWD_CHAIN][-1]  # mangle (Docker never moves it): DROP, not REJECT
    assert last[:2] == ["-i", "dvl+"] and last[-1] == "DROP"
    assert "REJECT" in generic[IN_CHAIN][-1]  # the host answers at once
    v6 = fw.generic("ip6tables")
    assert any("fe80::/10" in r for r in v6[FWD_CHAIN])
    assert v6[IN_CHAIN][-2][:2] == ["-i", "dva+"] and "REJECT" in v6[IN_CHAIN][-2]
