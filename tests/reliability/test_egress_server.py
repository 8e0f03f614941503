"""Egress deny holds for envs the server makes, with the server listening on every address.

tests/e2e/test_egress.py checks the network policy on hand-made networks; this reuses its
probes (and its rule for outside targets: only the package registries this machine's pip
and apt configuration names, by name and by the address they resolve to here; never any
other outside or private address) against envs created through the API of a server bound
to 0.0.0.0, so its port is open on the gateway of every env network. From inside a deny
env: the host (gateway and every host address, on the server's port and on a port this
test listens on), another deny env, an allow env and the registries: 0 connect. Positive
controls: the host reaches the server on the gateway, the deny env reaches itself, and an
allow env reaches the registries the host reaches.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from conftest import LocalDenv, start_server
from reliability_helpers import E2E_DIR, api, container_of, delete_all, report, standin

sys.path.insert(0, str(E2E_DIR))
import test_egress as probes

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    with start_server(tmp_path_factory.mktemp("denv-egress"), "--host", "0.0.0.0") as srv:
        yield srv


@pytest.fixture(scope="module")
def envs(server: LocalDenv) -> Iterator[dict[str, dict[str, Any]]]:
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


def docker_client() -> Any:
    docker = pytest.importorskip("docker")
    return docker.from_env()


def network_of(client: Any, env: dict[str, Any]) -> tuple[str, str]:
    """(gateway, the env agent's IP) on the env's own network."""
    net = client.networks.get(f"denv-{env['id'].lower()}")
    gateway = str(net.attrs["IPAM"]["Config"][0]["Gateway"])
    ct = client.containers.get(container_of(env))
    ip = str(ct.attrs["NetworkSettings"]["Networks"][net.name]["IPAddress"])
    return gateway, ip


def probe(client: Any, env: dict[str, Any], targets: list[tuple[str, int]]) -> list[str]:
    ct = client.containers.get(container_of(env))
    result = ct.exec_run(
        ["python3", "-c", probes.PROBE, json.dumps(targets), str(probes.PROBE_TIMEOUT_S)]
    )
    assert result.exit_code == 0, result.output.decode(errors="replace")
    outcomes: list[str] = json.loads(result.output)
    return outcomes


def leaks(outcomes: list[str], targets: list[tuple[str, int]]) -> list[str]:
    return [f"{h}:{p}" for (h, p), o in zip(targets, outcomes, strict=True) if o == "connected"]


def test_deny_env_made_by_the_server_reaches_nothing(
    server: LocalDenv, envs: dict[str, dict[str, Any]], request: pytest.FixtureRequest
) -> None:
    client = docker_client()
    port = urlsplit(server.url).port
    assert port is not None
    gateway, own_ip = network_of(client, envs["deny"])
    listener = probes.Listener()
    try:
        host_targets = [
            (address, p)
            for address in sorted({gateway, *probes.host_addresses()})
            for p in (port, listener.port)
        ]
        env_targets = [
            (network_of(client, envs[name])[1], 8000) for name in ("other_deny", "allow")
        ]
        hosts = probes.registry_hosts()
        addresses = sorted({a for h in hosts for a in probes.resolve_on_host(h)})
        registry_targets = [(t, p) for t in [*hosts, *addresses] for p in probes.PORTS]
        targets = host_targets + env_targets + registry_targets
        outcomes = probe(client, envs["deny"], targets)
        found = leaks(outcomes, targets)
        assert not listener.accepted, listener.accepted
    finally:
        listener.close()
    # Positive controls: the probes would notice a connection.
    assert probes.host_reaches(gateway, port), "the server does not listen on the gateway"
    assert probe(client, envs["deny"], [(own_ip, 8000)]) == ["connected"]
    for host, p in env_targets:
        assert probes.host_reaches(host, p), f"{host}:{p} does not listen"
    report(
        request,
        f"egress: {len(targets)} attempts from a deny env ({len(host_targets)} host, "
        f"{len(env_targets)} other envs, {len(registry_targets)} registry "
        f"[{', '.join(hosts)}]), {len(found)} succeeded",
    )
    assert not found, f"a deny env reached {found}"


def test_allow_env_made_by_the_server_reaches_the_registries(
    envs: dict[str, dict[str, Any]], request: pytest.FixtureRequest
) -> None:
    hosts = probes.registry_hosts()
    addresses = [
        a for h in hosts for a in probes.resolve_on_host(h) if ":" not in a
    ]  # containers here have no IPv6
    candidates = [(t, p) for t in [*hosts, *sorted(set(addresses))] for p in probes.PORTS]
    reachable = [t for t in candidates if probes.host_reaches(*t)]
    if not reachable:
        pytest.skip("this machine reaches none of its package registries: nothing to compare")
    outcomes = probe(docker_client(), envs["allow"], reachable)
    failed = [f"{h}:{p}" for (h, p), o in zip(reachable, outcomes, strict=True) if o != "connected"]
    report(
        request,
        f"egress: {len(reachable)} registry attempts from an allow env, "
        f"{len(reachable) - len(failed)} succeeded",
    )
    assert not failed, f"an allow env could not reach {failed}"
