"""Egress deny holds for envs the server makes, with the server listening on every address.

tests/e2e/test_egress.py checks the network policy on hand-made networks; this reuses its
probes and its outside host (tests/e2e/outside_host.py: a network namespace this test
makes, joined to the host by a veth, at an address in 198.18.0.0/15, with listeners on TCP
443 and 80 and UDP 53) against envs created through the API of a server bound to 0.0.0.0,
so its port is open on the gateway of every env network. From inside a deny env: the host
(gateway and every host address, on the server's port and on a port this test listens
on), another deny env, an allow env and the outside host by address (TCP and UDP): 0
connect, and the outside host sees nothing. Positive controls: the host reaches the
server on the gateway, the deny env reaches itself, and an allow env reaches the outside
host. Every target is on this machine: tests never send traffic to an outside address.
The outside host is not tried by name here: the server's envs use the host's resolvers,
so a name lookup would leave the machine. DNS out of deny envs is tested against a resolver
of the test's own in tests/reliability/test_egress_dns.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from conftest import LocalDenv, docker_engine, start_server
from reliability_helpers import (
    E2E_DIR,
    STANDIN,
    api,
    container_of,
    delete_all,
    report,
    standin,
)

sys.path.insert(0, str(E2E_DIR))
import test_egress as probes
from outside_host import OutsideHost, outside_host

from denv.server.config import HOST_GUARD_CHECK_S
from denv.server.net.policy import GUARD_COMMENT, host_lock, remove_host_guard

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    # Beyond loopback (so envs can reach the host's address); plain HTTP needs --insecure.
    state = tmp_path_factory.mktemp("denv-egress")
    with start_server(state, "--host", "0.0.0.0", "--insecure") as srv:
        yield srv


@pytest.fixture(scope="module")
def client() -> Any:
    return docker_engine(STANDIN)


@pytest.fixture(scope="module")
def outside() -> Iterator[OutsideHost]:
    with outside_host() as host:
        yield host


@pytest.fixture(scope="module")
def envs(client: Any, server: LocalDenv) -> Iterator[dict[str, dict[str, Any]]]:
    with api(server) as c:
        made = {
            "deny": standin(c),
            "other_deny": standin(c),
            "allow": standin(c, egress="allow"),
        }
        try:
            yield made
        finally:
            delete_all(c)


def network_of(client: Any, env: dict[str, Any]) -> tuple[str, str]:
    """(gateway, the env agent's IP) on the env's own network."""
    net = client.networks.get(f"denv-{env['id'].lower()}")
    gateway = str(net.attrs["IPAM"]["Config"][0]["Gateway"])
    ct = client.containers.get(container_of(env))
    ip = str(ct.attrs["NetworkSettings"]["Networks"][net.name]["IPAddress"])
    return gateway, ip


def probe(client: Any, env: dict[str, Any], targets: list[probes.Target]) -> list[str]:
    ct = client.containers.get(container_of(env))
    result = ct.exec_run(
        ["python3", "-c", probes.PROBE, json.dumps(targets), str(probes.PROBE_TIMEOUT_S)]
    )
    assert result.exit_code == 0, result.output.decode(errors="replace")
    outcomes: list[str] = json.loads(result.output)
    return outcomes


def leaks(outcomes: list[str], targets: list[probes.Target]) -> list[str]:
    return [probes.describe(t) for t, o in zip(targets, outcomes, strict=True) if o == "connected"]


def test_deny_env_made_by_the_server_reaches_nothing(
    client: Any,
    server: LocalDenv,
    envs: dict[str, dict[str, Any]],
    outside: OutsideHost,
    request: pytest.FixtureRequest,
) -> None:
    port = urlsplit(server.url).port
    assert port is not None
    gateway, own_ip = network_of(client, envs["deny"])
    listener = probes.Listener()
    try:
        host_targets: list[probes.Target] = [
            (address, p)
            for address in sorted({gateway, *probes.host_addresses()})
            for p in (port, listener.port)
        ]
        env_targets: list[probes.Target] = [
            (network_of(client, envs[name])[1], 8000) for name in ("other_deny", "allow")
        ]
        outside_targets = [*outside.tcp_targets(), outside.udp_target()]
        targets = host_targets + env_targets + outside_targets
        before = len(outside.seen)
        outcomes = probe(client, envs["deny"], targets)
        found = leaks(outcomes, targets)
        assert not listener.accepted, listener.accepted
        seen = outside.wait_seen(before + 1, timeout=1.0)[before:]
        assert not seen, f"the outside host saw traffic from a deny env: {seen}"
    finally:
        listener.close()
    # Positive controls: the probes would notice a connection.
    assert probes.host_reaches(gateway, port), "the server does not listen on the gateway"
    assert probe(client, envs["deny"], [(own_ip, 8000)]) == ["connected"]
    for host, p, *_ in env_targets + outside.tcp_targets():
        assert probes.host_reaches(host, p), f"{host}:{p} does not listen"
    report(
        request,
        f"egress: {len(targets)} attempts from a deny env ({len(host_targets)} host, "
        f"{len(env_targets)} other envs, {len(outside_targets)} outside host "
        f"{outside.address}), {len(found)} succeeded",
    )
    assert not found, f"a deny env reached {found}"


def test_allow_env_made_by_the_server_reaches_the_outside_host(
    client: Any,
    envs: dict[str, dict[str, Any]],
    outside: OutsideHost,
    request: pytest.FixtureRequest,
) -> None:
    targets: list[probes.Target] = [*outside.tcp_targets(), outside.udp_target()]
    before = len(outside.seen)
    outcomes = probe(client, envs["allow"], targets)
    failed = [
        probes.describe(t) for t, o in zip(targets, outcomes, strict=True) if o != "connected"
    ]
    report(
        request,
        f"egress: {len(targets)} attempts from an allow env to the outside host "
        f"{outside.address}, {len(targets) - len(failed)} succeeded",
    )
    assert not failed, f"an allow env could not reach {failed} ({outcomes})"
    # The connections reached the namespace's listeners (masqueraded to the host's end).
    seen = outside.wait_seen(before + len(targets))[before:]
    assert {(proto, p) for proto, p, _ in seen} >= {("tcp", 443), ("tcp", 80), ("udp", 53)}
    assert {peer for _, _, peer in seen} == {outside.host_address}, seen


def guard_rules(tool: str) -> list[str]:
    """The host guard's rules as installed (``<tool> -S INPUT``), read, not probed."""
    out = subprocess.run([tool, "-S", "INPUT"], capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if GUARD_COMMENT in line]


def test_a_removed_host_guard_is_restored_and_reported_in_health(
    client: Any,
    server: LocalDenv,
    envs: dict[str, dict[str, Any]],
    request: pytest.FixtureRequest,
) -> None:
    with api(server) as c:
        before = c.get("/v1/health").json()["host_guard"]
    assert (before["ipv4"], before["ipv6"], before["reason"]) == ("ok", "ok", None), before
    # What a firewall reload does. Under the machine-wide lock that every denv server's
    # check takes, so that another server running here (a user's own) cannot put the rule
    # back between the removal and the look that proves it gone.
    with host_lock():
        remove_host_guard()
        assert not guard_rules("iptables") and not guard_rules("ip6tables")
    deadline = time.monotonic() + 3 * HOST_GUARD_CHECK_S
    with api(server) as c:
        while True:
            after = c.get("/v1/health").json()["host_guard"]
            if after["restores"] > before["restores"] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    waited = time.monotonic() - deadline + 3 * HOST_GUARD_CHECK_S
    assert len(guard_rules("iptables")) == 1 and len(guard_rules("ip6tables")) == 1
    if after["restores"] == before["restores"]:
        # Another denv server on this machine (its own check) put the rule back first: ours
        # then found it in place. Both outcomes leave the guard installed exactly once.
        assert (after["ipv4"], after["ipv6"]) == ("ok", "ok"), after
        who = "another denv server on this machine (this one then found it in place)"
    else:
        who = f"this server after {waited:.1f} s"
        assert after["restores"] == before["restores"] + 1, after
        assert after["ipv4"] in ("restored", "ok") and after["last_restored_at"], after
    # And it holds again: the deny env does not reach its gateway on the server's port.
    port = urlsplit(server.url).port
    assert port is not None
    gateway, _ = network_of(client, envs["deny"])
    found = leaks(probe(client, envs["deny"], [(gateway, port)]), [(gateway, port)])
    report(
        request,
        f"host guard: removed from iptables and ip6tables, restored by {who} "
        f"(health: ipv4 {after['ipv4']}, ipv6 {after['ipv6']}, restores {after['restores']}); "
        f"the deny env then reached the host {len(found)} times",
    )
    assert not found
