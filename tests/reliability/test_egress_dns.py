"""DNS out of a deny env is closed: a lookup of an outside name reaches no resolver.

Docker's embedded DNS (127.0.0.11 in every container on a user network) answers the env's
own service names and forwards every other name to the upstream resolvers. On Docker 20.10
(what runs here) it does so for internal networks too, and when the host's resolver is a
loopback one (e.g. dnsmasq or unbound on 127.0.0.1) dockerd itself sends the query
from the host's network namespace: a channel out of an env that can open no connection.

The test builds that setting without touching the machine's daemon or its resolv.conf:

- a resolver of its own: a tiny UDP DNS server (``DnsRecorder``) on a random loopback address
  (in 127.64.0.0/10, port 53) that records every query and answers NXDOMAIN. Loopback, not a
  network namespace: dockerd sends queries for a loopback upstream from its own namespace,
  the host's here. (A non-loopback upstream is asked from the container's namespace, which on
  an internal network has no route: measured by hand, 0 queries reached one; see
  docs/hardening.md.)
- a private dockerd (``private_engine``: tests/conftest.py, tests/private_dockerd.py) whose
  ``/etc/resolv.conf``, in a mount namespace of its own, names only that address: the
  recorder is its upstream;
- a denv server on that dockerd (``DOCKER_HOST``), the stand-in image loaded into it.

Then: a deny env, an allowlist env, and each service of a compose project in a deny env
look up ``exfil-<random>.example``; the recorder sees none of those names, while the
project's services find each other by name and the env its own hostname. Controls: an
allow env's lookup does reach the recorder (it is this dockerd's upstream), and a container
made by hand on an internal network of the same dockerd, without denv's resolver setting,
is reported: on Docker 20.10 its lookup reaches the recorder (the hole denv closes).

Cost: the session's private dockerd (about 1 s, and 12 s to copy the stand-in image into
it; test_engine_faults.py uses the same one), one server, four envs booted at once.
Lookups that fail wait out the resolver's timeout, set short (``RES_OPTIONS``).
"""

from __future__ import annotations

import ipaddress
import json
import secrets
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import docker
import httpx
import pytest
from conftest import LocalDenv, start_server
from private_dockerd import DnsRecorder, PrivateDockerd
from reliability_helpers import (
    STANDIN,
    api,
    container_of,
    existing_envs,
    ok,
    report,
    standin,
)

from denv.server.net.policy import (
    ALLOWLIST_BRIDGE_PREFIX,
    BRIDGE_NAME_OPTION,
    DENY_BRIDGE_PREFIX,
    DENY_DNS,
)

pytestmark = pytest.mark.e2e

# A failing lookup waits for the resolver's timeout: 1 s, once, instead of glibc's 5 s twice.
LOOKUP_ENV = {"RES_OPTIONS": "timeout:1 attempts:1"}

# Runs in a container: looks up each name of argv[1] at once (one thread each), prints
# {name: IPv4 address or "error: ..."}.
LOOKUP = r"""
import json, socket, sys, threading
found = {}
def look(name):
    try:
        found[name] = socket.getaddrinfo(name, None, socket.AF_INET)[0][4][0]
    except OSError as exc:
        found[name] = "error: " + str(exc)
threads = [threading.Thread(target=look, args=(n,)) for n in json.loads(sys.argv[1])]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(found))
"""

COMPOSE = f"""
services:
  agent:
    image: {STANDIN}
    ports: ["8000"]
  db:
    image: {STANDIN}
    command: ["python3", "-c", "import time; time.sleep(3600)"]
x-denv:
  agent: {{service: agent}}
"""


@pytest.fixture(scope="module")
def recorder(private_engine: PrivateDockerd) -> DnsRecorder:
    assert private_engine.recorder is not None
    return private_engine.recorder


@pytest.fixture(scope="module")
def engine(private_engine: PrivateDockerd) -> Iterator[Any]:
    client = docker.DockerClient(base_url=private_engine.host)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="module")
def server(private_engine: PrivateDockerd) -> Iterator[LocalDenv]:
    # The server and the clean-up after it (docker rm of leftovers) talk to the private daemon.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DOCKER_HOST", private_engine.host)
        with start_server(private_engine.state_dir / "dns") as srv:
            yield srv


def lookup(engine: Any, container: str, names: list[str]) -> dict[str, str]:
    """Look ``names`` up in ``container`` as its programs do (getaddrinfo)."""
    ct = engine.containers.get(container)
    result = ct.exec_run(["python3", "-c", LOOKUP, json.dumps(names)], environment=LOOKUP_ENV)
    assert result.exit_code == 0, result.output.decode(errors="replace")
    found: dict[str, str] = json.loads(result.output)
    return found


def lookup_bare(engine: Any, name: str) -> None:
    """Look ``name`` up in a container made by hand on an internal network of this dockerd,
    without denv's resolver setting: what Docker itself does."""
    internal = engine.networks.create(f"denv-dns-test-{secrets.token_hex(3)}", internal=True)
    try:
        engine.containers.run(
            STANDIN,
            ["python3", "-c", LOOKUP, json.dumps([name])],
            network=internal.name,
            environment=LOOKUP_ENV,
            remove=True,
        )
    finally:
        internal.remove()


def bridge_of(engine: Any, network: str) -> str:
    options = engine.networks.get(network).attrs.get("Options") or {}
    return str(options.get(BRIDGE_NAME_OPTION, ""))


def exfil_name(kind: str) -> str:
    return f"exfil-{kind}-{secrets.token_hex(4)}.example"


def make_envs(c: httpx.Client) -> dict[str, dict[str, Any]]:
    def project() -> dict[str, Any]:
        version = ok(c.post("/v1/projects/dns-pair/deploy", json={"compose": COMPOSE}))
        made = ok(c.post(f"/v1/versions/{version['id']}/envs", json={"count": 1}))
        env: dict[str, Any] = made["envs"][0]
        return env

    makers: dict[str, Callable[[], dict[str, Any]]] = {
        "deny": lambda: standin(c),
        "allowlist": lambda: standin(c, egress={"allow": ["198.18.0.1"]}),
        "allow": lambda: standin(c, egress="allow"),
        "project": project,
    }
    with ThreadPoolExecutor(len(makers)) as pool:
        futures = {kind: pool.submit(make) for kind, make in makers.items()}
        made = {kind: f.result() for kind, f in futures.items()}
    for kind, env in made.items():
        assert env["status"] == "healthy", (kind, env)
    return made


@pytest.fixture(scope="module")
def envs(server: LocalDenv) -> Iterator[dict[str, dict[str, Any]]]:
    with api(server) as c:
        try:
            made = make_envs(c)
            yield made
        finally:
            with ThreadPoolExecutor(4) as pool:  # one at a time took seconds
                for env in existing_envs(c):
                    pool.submit(c.delete, f"/v1/envs/{env['id']}")
            assert not existing_envs(c)


def test_deny_and_allowlist_envs_resolve_no_outside_name(
    engine: Any,
    envs: dict[str, dict[str, Any]],
    recorder: DnsRecorder,
    request: pytest.FixtureRequest,
) -> None:
    kinds = ("deny", "allowlist", "allow")
    names = {kind: exfil_name(kind) for kind in (*kinds, "bare")}
    own = {
        k: engine.containers.get(container_of(envs[k])).attrs["Config"]["Hostname"] for k in kinds
    }
    with ThreadPoolExecutor(len(kinds) + 1) as pool:
        bare = pool.submit(lookup_bare, engine, names["bare"])
        futures = {
            k: pool.submit(lookup, engine, container_of(envs[k]), [names[k], own[k], "198.18.0.1"])
            for k in kinds
        }
        found = {k: f.result() for k, f in futures.items()}
        bare.result()
    # Read: every container's resolver is what its network's egress says.
    resolvers = {
        ct.name: (
            ct.attrs["HostConfig"]["Dns"],
            [bridge_of(engine, n) for n in ct.attrs["NetworkSettings"]["Networks"]],
        )
        for ct in engine.containers.list(all=True)
    }
    saw = {k: recorder.saw(names[k]) for k in names}
    report(
        request,
        f"egress DNS: the private dockerd's upstream is a recorder at {recorder.address}; "
        f"queries for the outside name it saw from: a deny env {len(saw['deny'])}, an "
        f"allowlist env {len(saw['allowlist'])}, an allow env {len(saw['allow'])} (control), "
        f"a container made by hand on an internal network without denv's resolver "
        f"{len(saw['bare'])} (Docker's own forwarding); {len(resolvers)} containers, "
        f"deny and allowlist ones with resolver {DENY_DNS}",
    )
    assert saw["allow"], f"the allow env's lookup did not reach the recorder: {found['allow']}"
    assert not saw["deny"] and not saw["allowlist"], saw
    for k in kinds:
        assert found[k][own[k]] != "" and not found[k][own[k]].startswith("error"), (k, found[k])
        assert found[k]["198.18.0.1"] == "198.18.0.1", (k, found[k])
    for k in ("deny", "allowlist"):
        assert found[k][names[k]].startswith("error"), (k, found[k])
    for name, (dns, bridges) in resolvers.items():
        cut_off = any(b.startswith((DENY_BRIDGE_PREFIX, ALLOWLIST_BRIDGE_PREFIX)) for b in bridges)
        assert (dns or []) == (DENY_DNS if cut_off else []), (name, dns, bridges)


def test_compose_services_of_a_deny_env_find_each_other_and_nothing_outside(
    engine: Any,
    envs: dict[str, dict[str, Any]],
    recorder: DnsRecorder,
    request: pytest.FixtureRequest,
) -> None:
    env = envs["project"]
    assert env["egress"] == "deny", env
    names = {service: exfil_name(service) for service in ("agent", "db")}
    other = {"agent": "db", "db": "agent"}
    with ThreadPoolExecutor(len(names)) as pool:
        futures = {
            s: pool.submit(lookup, engine, container_of(env, s), [other[s], names[s]])
            for s in names
        }
        found = {s: f.result() for s, f in futures.items()}
    net = engine.networks.get(f"denv-{env['id'].lower()}")
    subnet = ipaddress.IPv4Network(net.attrs["IPAM"]["Config"][0]["Subnet"])
    leaked = [q for s in names for q in recorder.saw(names[s])]
    report(
        request,
        f"egress DNS: a compose project in a deny env: agent -> db {found['agent']['db']}, "
        f"db -> agent {found['db']['agent']} (in {subnet}); outside names resolved "
        f"{sum(not found[s][names[s]].startswith('error') for s in names)}/2, queries the "
        f"upstream saw {len(leaked)}",
    )
    assert not leaked, leaked
    for s in names:
        assert ipaddress.IPv4Address(found[s][other[s]]) in subnet, found
        assert found[s][names[s]].startswith("error"), found
