"""The host guard watch: states per family, restores counted, failures reported (no iptables)."""

from __future__ import annotations

import pytest

from denv.server.net import host_guard as guard
from denv.server.net.firewall import FirewallError
from denv.server.net.policy import HostGuardError


class FakeFirewall:
    """Which tools have the rule; ``broken`` tools fail to install it."""

    def __init__(self, broken: tuple[str, ...] = ()) -> None:
        self.present: set[str] = set()
        self.broken = broken

    def ensure(self, tool: str) -> str:
        if tool in self.present:
            return "ok"
        if tool in self.broken:
            raise HostGuardError(f"could not install the host guard ({tool}: no table)")
        self.present.add(tool)
        return "restored"


class FakeEgressRules:
    """The egress chains (``firewall.Firewall``): ``broken`` tools fail to install them."""

    def __init__(self) -> None:
        self.broken: tuple[str, ...] = ()

    def ensure(self, tool: str) -> bool:
        if tool in self.broken:
            raise FirewallError(f"{tool}-restore: line 2 failed")
        return False


@pytest.fixture
def egress_rules(monkeypatch: pytest.MonkeyPatch) -> FakeEgressRules:
    rules = FakeEgressRules()
    monkeypatch.setattr(guard, "Firewall", lambda resolvers: rules)
    return rules


@pytest.fixture
def firewall(monkeypatch: pytest.MonkeyPatch, egress_rules: FakeEgressRules) -> FakeFirewall:
    fw = FakeFirewall()
    monkeypatch.setattr(guard, "ensure_host_guard_on", fw.ensure)
    monkeypatch.setattr(guard.shutil, "which", lambda tool: f"/usr/sbin/{tool}")
    return fw


def test_envs_that_may_connect_are_unsafe_while_a_family_lacks_its_egress_rules(
    firewall: FakeFirewall, egress_rules: FakeEgressRules
) -> None:
    watch = guard.HostGuardWatch()
    watch.check()
    assert watch.egress_unsafe() is None
    egress_rules.broken = ("ip6tables",)
    assert watch.check() == {"ipv4": "ok", "ipv6": "missing"}
    unsafe = watch.egress_unsafe()
    assert unsafe is not None and "ipv6" in unsafe and "line 2 failed" in unsafe
    assert "egress 'deny'" in unsafe  # what still works
    assert "allow and allowlist" in str(watch.status()["reason"])
    egress_rules.broken = ()
    watch.check()
    assert watch.egress_unsafe() is None


def test_first_check_installs_without_counting_a_restore(firewall: FakeFirewall) -> None:
    watch = guard.HostGuardWatch()
    watch.check()
    status = watch.status()
    assert status["restores"] == 0 and status["reason"] is None
    assert status["last_restored_at"] is None
    assert watch.check() == {"ipv4": "ok", "ipv6": "ok"}


def test_a_removed_rule_is_restored_and_reported(firewall: FakeFirewall) -> None:
    watch = guard.HostGuardWatch()
    watch.check()
    firewall.present.discard("iptables")  # a firewall reload
    assert watch.check() == {"ipv4": "restored", "ipv6": "ok"}
    status = watch.status()
    assert status["ipv4"] == "restored" and status["restores"] == 1
    assert status["last_restored_at"] is not None
    watch.check()
    assert watch.status()["ipv4"] == "ok" and watch.status()["restores"] == 1


def test_an_ip6tables_failure_is_reported_not_raised(firewall: FakeFirewall) -> None:
    firewall.broken = ("ip6tables",)
    watch = guard.HostGuardWatch()
    watch.check()
    status = watch.status()
    assert status["ipv4"] == "ok" and status["ipv6"] == "missing"
    assert "ip6tables: no table" in status["reason"]


def test_an_iptables_failure_raises_and_is_reported(firewall: FakeFirewall) -> None:
    firewall.broken = ("iptables",)
    watch = guard.HostGuardWatch()
    with pytest.raises(HostGuardError, match="iptables"):
        watch.check()
    assert watch.status()["ipv4"] == "missing"


def test_a_missing_tool_is_reported(
    firewall: FakeFirewall, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guard.shutil, "which", lambda tool: None if tool == "ip6tables" else tool)
    watch = guard.HostGuardWatch()
    watch.check()
    assert watch.status()["ipv6"] == "missing"
    assert "ip6tables is not installed" in watch.status()["reason"]
