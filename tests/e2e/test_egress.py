"""Egress deny holds on a real Docker Engine: a container on a deny network reaches nothing.

From inside a container on a ``dvd…`` internal network, with the host guard installed:
the host (every address of this machine, on a port where the test listens on 0.0.0.0),
containers of other envs (deny and allow), and the package registries that this machine
itself uses (taken at test time from pip's and apt's configuration, tried by name and by
the address they resolve to on the host, ports 443 and 80) must all be unreachable. A
container on an allow network must reach those same registries, and the host must reach
into the deny container: the positive controls that prove the probes would notice a leak.
No other outside or private-range address is ever a target.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from denv.server.netpolicy import (
    allow_network_options,
    deny_network_options,
    install_host_guard,
    remove_host_guard,
)

pytestmark = pytest.mark.e2e

IMAGE = "denv-base-probe:latest"
PORTS = (443, 80)
PROBE_TIMEOUT_S = 3.0
SERVICE_PORT = 8000

# Runs inside a container: tries every (host, port) in argv[1] at once, prints the results.
PROBE = r"""
import json, socket, sys, threading
targets = json.loads(sys.argv[1])
results = [None] * len(targets)
def attempt(i, host, port):
    try:
        socket.create_connection((host, port), timeout=float(sys.argv[2])).close()
        results[i] = "connected"
    except Exception as exc:
        results[i] = type(exc).__name__ + ": " + str(exc)
threads = [threading.Thread(target=attempt, args=(i, h, p)) for i, (h, p) in enumerate(targets)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(results))
"""


# ---------------------------------------------------------------------------- registries


def _url_host(url: str) -> str | None:
    parts = urlsplit(url.strip())
    return parts.hostname if parts.scheme in ("http", "https") and parts.hostname else None


def pip_index_hosts() -> set[str]:
    """Hosts of pip's index URLs (config and environment); pypi's when none is set."""
    urls: list[str] = []
    pip = [sys.executable, "-m", "pip"] if _has_pip() else [shutil.which("pip") or "pip"]
    try:
        out = subprocess.run(
            [*pip, "config", "list"], capture_output=True, text=True, timeout=60, check=False
        ).stdout
    except OSError:
        out = ""
    primary = False
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.endswith("index-url"):
            primary = primary or not key.endswith("extra-index-url")
            urls += value.strip().strip("'\"").split()
    for var in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        if os.environ.get(var):
            primary = primary or var == "PIP_INDEX_URL"
            urls += os.environ[var].split()
    hosts = {h for h in map(_url_host, urls) if h}
    if not primary:
        hosts.add("pypi.org")
    if "pypi.org" in hosts:
        hosts.add("files.pythonhosted.org")
    return hosts


def _has_pip() -> bool:
    return (
        subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode
        == 0
    )


def apt_source_hosts(root: Path = Path("/etc/apt")) -> set[str]:
    """Hosts of apt's enabled sources (one-line ``.list`` and deb822 ``.sources`` files)."""
    hosts: set[str] = set()
    lists = [root / "sources.list", *sorted((root / "sources.list.d").glob("*.list"))]
    for path in lists:
        if not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            # "deb [arch=amd64 signed-by=...] http://host/path suite components"
            words = re.sub(r"\[[^\]]*\]", " ", line.split("#", 1)[0]).split()
            host = (
                _url_host(words[1]) if len(words) >= 2 and words[0] in ("deb", "deb-src") else None
            )
            if host:
                hosts.add(host)
    for path in sorted((root / "sources.list.d").glob("*.sources")):
        for stanza in re.split(r"\n\s*\n", path.read_text(errors="replace")):
            fields = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line or line[:1].isspace():
                    continue
                key, _, value = line.partition(":")
                fields[key.strip().lower()] = value.strip()
            if fields.get("enabled", "yes").lower() == "no":
                continue
            hosts.update(h for h in map(_url_host, fields.get("uris", "").split()) if h)
    return hosts


def registry_hosts() -> list[str]:
    return sorted(pip_index_hosts() | apt_source_hosts())


def resolve_on_host(host: str) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return []
    return sorted({str(info[4][0]) for info in infos})


def host_reaches(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
        return True
    except OSError:
        return False


def host_addresses() -> list[str]:
    """This machine's own IPv4 addresses (not loopback): the host, seen from a container."""
    out = subprocess.run(
        ["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    addresses = []
    for link in json.loads(out):
        for info in link.get("addr_info", []):
            if not ipaddress.ip_address(info["local"]).is_loopback:
                addresses.append(info["local"])
    return sorted(set(addresses))


# ---------------------------------------------------------------------------- fixture


class Listener:
    """A TCP server on 0.0.0.0:<free port> that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(64)
        self.port = int(self.sock.getsockname()[1])
        self.accepted: list[Any] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            self.accepted.append(peer)
            conn.close()

    def close(self) -> None:
        self.sock.close()


@dataclass
class Fleet:
    client: Any
    deny_a: Any  # network
    deny_b: Any
    allow: Any
    probe_a: Any  # container on deny_a that runs the probes
    peer_a: Any  # a second container on deny_a (same env: must stay reachable)
    service_b: Any  # on deny_b: another deny env
    service_w: Any  # on allow: another allow env, and the allow-side prober
    listener: Listener
    guard_was_installed_here: bool
    counts: dict[str, int] = field(default_factory=dict)

    def ip(self, container: Any, network: Any) -> str:
        container.reload()
        return str(container.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"])

    def gateway(self, network: Any) -> str:
        network.reload()
        return str(network.attrs["IPAM"]["Config"][0]["Gateway"])

    def probe(self, container: Any, targets: list[tuple[str, int]]) -> list[str]:
        result = container.exec_run(
            ["python3", "-c", PROBE, json.dumps(targets), str(PROBE_TIMEOUT_S)]
        )
        assert result.exit_code == 0, result.output.decode(errors="replace")
        outcomes: list[str] = json.loads(result.output)
        return outcomes


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # no engine here: the e2e tests cannot run
        pytest.skip(f"no Docker Engine reachable ({exc}): start dockerd")
    try:
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        pytest.skip(f"image {IMAGE} is not on the Docker Engine: build it (scripts/base-image.sh)")
    run_id = secrets.token_hex(4)
    labels = {"denv.managed": "true", "denv.instance": f"test-egress-{run_id}"}
    guard_new = install_host_guard()
    networks: list[Any] = []
    containers: list[Any] = []
    listener = Listener()

    def network(opts: dict[str, Any]) -> Any:
        net = client.networks.create(**opts)
        networks.append(net)
        return net

    def container(net: Any, service: str) -> Any:
        ct = client.containers.run(
            IMAGE,
            ["python3", "-m", "http.server", str(SERVICE_PORT)],
            detach=True,
            network=net.name,
            labels={**labels, "denv.service": service},
        )
        containers.append(ct)
        return ct

    try:
        env = f"env_EGRESS{run_id.upper()}"
        deny_a = network(deny_network_options(env + "A", {**labels, "denv.env": env + "A"}))
        deny_b = network(deny_network_options(env + "B", {**labels, "denv.env": env + "B"}))
        allow = network(allow_network_options(env + "W", {**labels, "denv.env": env + "W"}))
        fleet = Fleet(
            client,
            deny_a,
            deny_b,
            allow,
            container(deny_a, "agent"),
            container(deny_a, "peer"),
            container(deny_b, "agent"),
            container(allow, "agent"),
            listener,
            guard_new,
        )
        for ct in (fleet.probe_a, fleet.peer_a, fleet.service_b, fleet.service_w):
            _wait_listening(fleet, ct)
        yield fleet
    finally:
        for ct in containers:
            ct.remove(force=True)
        for net in networks:
            net.remove()
        listener.close()
        if guard_new:
            remove_host_guard()  # only if no one (e.g. a running server) had installed it


def _wait_listening(fleet: Fleet, container: Any) -> None:
    deadline = time.monotonic() + 30
    while True:
        result = container.exec_run(
            ["python3", "-c", PROBE, json.dumps([["127.0.0.1", SERVICE_PORT]]), "1"]
        )
        if result.exit_code == 0 and json.loads(result.output) == ["connected"]:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"container {container.short_id} never listened on {SERVICE_PORT}")
        time.sleep(0.2)


def _assert_all_fail(fleet: Fleet, targets: list[tuple[str, int]], what: str) -> None:
    outcomes = fleet.probe(fleet.probe_a, targets)
    leaks = [f"{h}:{p}" for (h, p), o in zip(targets, outcomes, strict=True) if o == "connected"]
    print(f"egress deny, {what}: {len(targets)} attempts, {len(leaks)} succeeded")
    assert not leaks, f"a deny env reached {what}: {leaks}"


# ---------------------------------------------------------------------------- tests


def test_deny_env_cannot_reach_the_host(fleet: Fleet) -> None:
    port = fleet.listener.port
    addresses = sorted({fleet.gateway(fleet.deny_a), *host_addresses()})
    targets = [(address, port) for address in addresses]
    before = len(fleet.listener.accepted)
    _assert_all_fail(fleet, targets, "the host")
    assert len(fleet.listener.accepted) == before, fleet.listener.accepted
    # The listener is up: the host itself reaches it on the same addresses.
    assert host_reaches(fleet.gateway(fleet.deny_a), port)


def test_deny_env_cannot_reach_other_envs(fleet: Fleet) -> None:
    others = [
        (fleet.ip(fleet.service_b, fleet.deny_b), SERVICE_PORT),
        (fleet.ip(fleet.service_w, fleet.allow), SERVICE_PORT),
    ]
    _assert_all_fail(fleet, others, "other envs")
    # Positive controls: its own env's peer answers, and so do the others, from the host.
    assert fleet.probe(fleet.probe_a, [(fleet.ip(fleet.peer_a, fleet.deny_a), SERVICE_PORT)]) == [
        "connected"
    ]
    for host, port in others:
        assert host_reaches(host, port), f"{host}:{port} is not listening"


def test_deny_env_cannot_reach_package_registries(fleet: Fleet) -> None:
    hosts = registry_hosts()
    assert hosts, "no package registry configured for pip or apt on this machine"
    addresses = sorted({a for h in hosts for a in resolve_on_host(h)})
    targets = [(t, p) for t in [*hosts, *addresses] for p in PORTS]
    print(f"registries from pip/apt configuration: {', '.join(hosts)}")
    _assert_all_fail(fleet, targets, "package registries (by name and address)")


def test_allow_env_reaches_the_registries_the_host_reaches(fleet: Fleet) -> None:
    hosts = registry_hosts()
    addresses = sorted({a for h in hosts for a in resolve_on_host(h)})
    # Containers here have no IPv6: only IPv4 addresses can be compared.
    addresses = [a for a in addresses if ipaddress.ip_address(a).version == 4]
    candidates = [(t, p) for t in [*hosts, *addresses] for p in PORTS]
    reachable = [t for t in candidates if host_reaches(*t)]
    if not reachable:
        pytest.skip("this machine reaches none of its package registries: nothing to compare")
    outcomes = fleet.probe(fleet.service_w, reachable)
    failed = [f"{h}:{p}" for (h, p), o in zip(reachable, outcomes, strict=True) if o != "connected"]
    print(f"egress allow: {len(reachable)} attempts, {len(reachable) - len(failed)} succeeded")
    assert not failed, f"an allow env could not reach {failed}: the deny probes prove nothing"


def test_host_reaches_into_the_deny_env(fleet: Fleet) -> None:
    targets = [(fleet.ip(fleet.probe_a, fleet.deny_a), SERVICE_PORT)]
    targets.append((fleet.ip(fleet.service_b, fleet.deny_b), SERVICE_PORT))
    reached = sum(host_reaches(*t) for t in targets)
    print(f"host into deny envs: {len(targets)} attempts, {reached} succeeded")
    assert reached == len(targets)
