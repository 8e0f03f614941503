"""Egress allow keeps off the host, link-local and private networks; allowlists hold.

Two servers: one with the defaults, one started with ``--allow-private-egress``. The
"private networks" are network namespaces this test makes (tests/e2e/outside_host.py) at
addresses in 100.64.0.0/10 (shared, CGN), 169.254.128.0/17 (link-local) and 192.168.0.0/16,
each with listeners on TCP 443/80 and UDP 53; the public stand-in is the usual outside host
in 198.18.0.0/15. The host is this machine: a listener on 0.0.0.0 and the env's gateway.
Every probe targets an address on this machine; rules for real outside ranges and the
host's resolvers are checked by reading what is installed (iptables-save), not by probing.
"""

from __future__ import annotations

import http.server
import ipaddress
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from conftest import LocalDenv, docker_engine, start_server
from reliability_helpers import E2E_DIR, STANDIN, api, container_of, delete_all, report, standin
from test_egress_server import network_of, probe

sys.path.insert(0, str(E2E_DIR))
import test_egress as probes
from outside_host import OutsideHost, outside_host

from denv.server.config import HOST_GUARD_CHECK_S
from denv.server.net.egress_rules import FWD_CHAIN, IN_CHAIN, PRIVATE_RANGES
from denv.server.net.firewall import resolvers

pytestmark = pytest.mark.e2e

PRIVATE_AT = {"cgn": "100.64.0.0/10", "link-local": "169.254.128.0/17", "lan": "192.168.0.0/16"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    with start_server(tmp_path_factory.mktemp("denv-egress-private")) as srv:
        yield srv


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    state = tmp_path_factory.mktemp("denv-egress-open")
    with start_server(state, "--allow-private-egress") as srv:
        yield srv


@pytest.fixture(scope="module")
def client() -> Any:
    return docker_engine(STANDIN)


@pytest.fixture(scope="module")
def privates() -> Iterator[dict[str, OutsideHost]]:
    with (
        outside_host(PRIVATE_AT["cgn"]) as cgn,
        outside_host(PRIVATE_AT["link-local"]) as link_local,
        outside_host(PRIVATE_AT["lan"]) as lan,
    ):
        yield {"cgn": cgn, "link-local": link_local, "lan": lan}


@pytest.fixture(scope="module")
def public() -> Iterator[OutsideHost]:
    with outside_host() as host:
        yield host


@pytest.fixture
def host_listener() -> Iterator[probes.Listener]:
    listener = probes.Listener()
    try:
        yield listener
    finally:
        listener.close()


def targets_of(host: OutsideHost) -> list[probes.Target]:
    return [*host.tcp_targets(), host.udp_target()]


def connected(outcomes: list[str], targets: list[probes.Target]) -> list[str]:
    return [probes.describe(t) for t, o in zip(targets, outcomes, strict=True) if o == "connected"]


def saved(tool: str, table: str | None = None) -> list[str]:
    only = ["-t", table] if table else []
    out = subprocess.run([f"{tool}-save", *only], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_the_installed_rules_refuse_every_private_range_in_both_families(
    server: LocalDenv, request: pytest.FixtureRequest
) -> None:
    checked = 0
    for tool in ("iptables", "ip6tables"):
        host = saved(tool, "filter")  # what reaches the host: INPUT, REJECT (an answer at once)
        routed = saved(tool, "mangle")  # what is routed: mangle FORWARD (Docker never moves it)
        for prefix in ("dva", "dvl"):
            assert f"-A INPUT -i {prefix}+ -j {IN_CHAIN}" in host, (tool, prefix)
            assert f"-A FORWARD -i {prefix}+ -j {FWD_CHAIN}" in routed, (tool, prefix)
            checked += 2
        for net in PRIVATE_RANGES[tool]:
            rule = [ln for ln in routed if ln.startswith(f"-A {FWD_CHAIN} -d {net} -i dva+")]
            assert rule and rule[0].endswith("-j DROP"), (tool, net)
            checked += 1
        # The host refuses both kinds of bridge; the routed path refuses allowlist bridges.
        for lines, chain, prefix, target in (
            (host, IN_CHAIN, "dva", "REJECT"),
            (host, IN_CHAIN, "dvl", "REJECT"),
            (routed, FWD_CHAIN, "dvl", "DROP"),
        ):
            want = f"-A {chain} -i {prefix}+ -m comment"
            assert any(ln.startswith(want) and f"-j {target}" in ln for ln in lines), (tool, want)
            checked += 1
        lines = routed
        # DNS to the host's resolvers stays open (checked by reading: they are off-machine).
        for address in resolvers():
            if (ipaddress.ip_address(address).version == 6) != (tool == "ip6tables"):
                continue
            for proto in ("udp", "tcp"):
                bits = 32 if tool == "iptables" else 128
                want = f"-A {FWD_CHAIN} -d {address}/{bits} -i dva+ -p {proto}"
                assert any(ln.startswith(want) and "--dport 53" in ln for ln in lines), want
                checked += 1
    report(request, f"egress rules: {checked} installed rules read (iptables and ip6tables)")


def test_an_allow_env_reaches_the_internet_but_not_the_host_or_private_networks(
    client: Any,
    server: LocalDenv,
    privates: dict[str, OutsideHost],
    public: OutsideHost,
    host_listener: probes.Listener,
    request: pytest.FixtureRequest,
) -> None:
    with api(server) as c:
        env = standin(c, egress="allow")
        try:
            gateway, _ = network_of(client, env)
            private_targets = [t for host in privates.values() for t in targets_of(host)]
            host_targets: list[probes.Target] = [
                (address, host_listener.port)
                for address in sorted({gateway, *probes.host_addresses()})
            ]
            targets = private_targets + host_targets
            outcomes = probe(client, env, targets + targets_of(public))
            leaked = connected(outcomes[: len(targets)], targets)
            public_ok = connected(outcomes[len(targets) :], targets_of(public))
            seen = {name: list(h.seen) for name, h in privates.items()}
            v6 = _ipv6_link_local_probe(client, env)
        finally:
            delete_all(c)
    report(
        request,
        f"egress allow: {len(targets)} attempts at the host and private/link-local hosts, "
        f"{len(leaked)} connected; IPv6 to the host's link-local: {v6}; "
        f"{len(public_ok)}/3 to the public stand-in connected",
    )
    assert not leaked, f"an allow env reached {leaked}"
    assert not any(seen.values()), seen
    assert not host_listener.accepted, host_listener.accepted
    assert v6 != "connected", "an allow env reached the host over IPv6 link-local"
    assert len(public_ok) == 3, outcomes  # positive control: the probes notice a connection


def _ipv6_link_local_probe(client: Any, env: dict[str, Any]) -> str:
    """From the env, TCP to the host's link-local IPv6 address on the env's bridge
    (``fe80::…%eth0``), where a listener of this test on ``[::]`` waits."""
    net = client.networks.get(f"denv-{env['id'].lower()}")
    bridge = net.attrs["Options"]["com.docker.network.bridge.name"]
    out = subprocess.run(
        ["ip", "-j", "-6", "addr", "show", "dev", bridge], capture_output=True, text=True
    ).stdout
    addrs = [a["local"] for link in json.loads(out or "[]") for a in link.get("addr_info", [])]
    if not addrs:
        return "no IPv6 address on the bridge"
    listener = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    try:
        listener.bind(("::", 0))
        listener.listen(8)
        script = (
            "import socket,sys\n"
            "s=socket.socket(socket.AF_INET6)\ns.settimeout(3)\n"
            "try:\n"
            " s.connect((sys.argv[1],int(sys.argv[2]),0,socket.if_nametoindex('eth0')))\n"
            " print('connected')\n"
            "except Exception as e: print(type(e).__name__)\n"
        )
        ct = client.containers.get(container_of(env))
        port = listener.getsockname()[1]
        result = ct.exec_run(["python3", "-c", script, addrs[0], str(port)])
        disabled = ct.exec_run(["cat", "/proc/sys/net/ipv6/conf/all/disable_ipv6"]).output
        # Docker (20.10 here) disables IPv6 in containers of IPv4-only networks, so the probe
        # cannot connect even where the rules would let it: say so in the count line.
        note = " (IPv6 disabled in the container)" if disabled.strip() == b"1" else ""
        return str(result.output.decode().strip()) + note
    finally:
        listener.close()


def test_allow_private_egress_lets_allow_envs_reach_private_networks(
    client: Any,
    open_server: LocalDenv,
    privates: dict[str, OutsideHost],
    host_listener: probes.Listener,
    request: pytest.FixtureRequest,
) -> None:
    with api(open_server) as c:
        env = standin(c, egress="allow")
        try:
            gateway, _ = network_of(client, env)
            targets: list[probes.Target] = [
                *(t for host in privates.values() for t in host.tcp_targets()),
                (gateway, host_listener.port),
            ]
            outcomes = probe(client, env, targets)
            v6 = _ipv6_link_local_probe(client, env)
        finally:
            delete_all(c)
    ok = connected(outcomes, targets)
    report(
        request,
        f"egress allow, --allow-private-egress: {len(ok)}/{len(targets)} connected; "
        f"IPv6 to the host's link-local: {v6}",
    )
    assert len(ok) == len(targets), outcomes


def test_an_allowlist_env_reaches_only_its_allowlist(
    client: Any,
    open_server: LocalDenv,
    privates: dict[str, OutsideHost],
    public: OutsideHost,
    host_listener: probes.Listener,
    request: pytest.FixtureRequest,
) -> None:
    cgn, lan = privates["cgn"], privates["lan"]
    allow = [f"{cgn.address}:443", f"host.docker.internal:{host_listener.port}"]
    with api(open_server) as c:
        env = standin(c, egress={"allow": allow})
        try:
            assert env["egress"] == {"allow": allow}
            assert [e["via"] for e in env["endpoints"]] == ["ingress"]
            gateway, _ = network_of(client, env)
            allowed: list[probes.Target] = [
                (cgn.address, 443),
                ("host.docker.internal", host_listener.port),
            ]
            refused: list[probes.Target] = [
                (cgn.address, 80),
                cgn.udp_target(),
                *targets_of(lan),
                *targets_of(privates["link-local"]),
                *targets_of(public),
                (gateway, 8000 if host_listener.port != 8000 else 8001),
            ]
            outcomes = probe(client, env, allowed + refused)
            fork = c.post(f"/v1/envs/{env['id']}/fork", json={"count": 1})
            assert fork.status_code == 201, fork.text
            child = fork.json()["envs"][0]
            assert child["egress"] == {"allow": allow}
            child_outcomes = probe(client, child, allowed + refused[:2])
        finally:
            delete_all(c)
    got = connected(outcomes[: len(allowed)], allowed)
    leaked = connected(outcomes[len(allowed) :], refused)
    child_got = connected(child_outcomes[: len(allowed)], allowed)
    child_leaked = connected(child_outcomes[len(allowed) :], refused[:2])
    report(
        request,
        f"egress allowlist: {len(got)}/{len(allowed)} allowed connected, {len(leaked)}/"
        f"{len(refused)} others connected; its fork: {len(child_got)}/{len(allowed)} and "
        f"{len(child_leaked)}/2",
    )
    assert len(got) == len(allowed), outcomes
    assert not leaked, f"an allowlist env reached {leaked}"
    assert len(child_got) == len(allowed) and not child_leaked, child_outcomes
    assert host_listener.accepted  # the host.docker.internal entry reached the listener


BAD_ENTRIES = {
    "[]": ([], "is empty"),
    "port": (["192.0.2.10:99999"], "from 1 to 65535"),
    "ipv6": (["[fd00::1]:80"], "IPv4 only"),
    "garbage": (["not a name!"], "name-or-cidr[:port]"),
    "private": (["10.1.2.3:80"], "--allow-private-egress"),
    "link-local": (["169.254.169.254"], "--allow-private-egress"),
    "host": (["host.docker.internal:8100"], "--allow-private-egress"),
    "loopback name": (["localhost:80"], "--allow-private-egress"),
    "everything": (["0.0.0.0/0"], "--allow-private-egress"),
}


def test_bad_allowlists_are_422_naming_the_fix(
    server: LocalDenv, public: OutsideHost, request: pytest.FixtureRequest
) -> None:
    with api(server) as c:
        for name, (entries, fix) in BAD_ENTRIES.items():
            res = c.post("/v1/sandboxes", json={"image": STANDIN, "egress": {"allow": entries}})
            assert res.status_code == 422, (name, res.text)
            body = res.json()
            assert body["code"] == "invalid_request", (name, body)
            assert fix in body["message"], (name, body["message"])
            assert str(body["details"]["path"]).startswith("egress"), (name, body)
        assert c.get("/v1/envs").json()["items"] == []  # nothing was made
        # A public address (the stand-in) is fine on a default server, and works.
        env = standin(c, egress={"allow": [f"{public.address}:80"]})
        client = docker_engine(STANDIN)
        outcomes = probe(client, env, [(public.address, 80), (public.address, 443)])
        delete_all(c)
    report(request, f"egress allowlist: {len(BAD_ENTRIES)} bad allowlists refused with 422")
    assert outcomes[0] == "connected" and outcomes[1] != "connected", outcomes


# Runs inside the env, as an agent would: one chat completion through the capture proxy at
# argv[1], its API key (argv[2]) the rollout's session id. Prints the status and the reply.
AGENT_CALL = r"""
import json, sys, urllib.request
body = {"model": "trainer-model", "messages": [{"role": "user", "content": "say hi"}]}
req = urllib.request.Request(
    sys.argv[1] + "/v1/chat/completions",
    data=json.dumps(body).encode(),
    headers={"Content-Type": "application/json", "Authorization": "Bearer " + sys.argv[2]},
)
try:
    with urllib.request.urlopen(req, timeout=20) as res:
        print(json.dumps({"status": res.status, "body": json.loads(res.read())}))
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__ + ": " + str(exc)}))
"""

PROMPT_IDS = [101, 7592, 2003]
SAMPLED = [(7632, -0.25), (999, -0.5)]  # (token id, logprob)


class _Model(http.server.BaseHTTPRequestHandler):
    """The trainer's model on this machine's loopback: a vLLM-shaped chat completion with the
    prompt's and the sample's token ids and logprobs (what the capture proxy records)."""

    def do_GET(self) -> None:
        self._send({"object": "list", "data": [{"id": "trainer-model", "object": "model"}]})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(
            {
                "id": "chatcmpl-denv",
                "object": "chat.completion",
                "created": 0,
                "model": "trainer-model",
                "prompt_token_ids": PROMPT_IDS,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "hi"},
                        "finish_reason": "stop",
                        "token_ids": [t for t, _ in SAMPLED],
                        "logprobs": {
                            "content": [
                                {"token": f"token_id:{t}", "logprob": lp, "top_logprobs": []}
                                for t, lp in SAMPLED
                            ]
                        },
                    }
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
            }
        )

    def _send(self, doc: dict[str, Any]) -> None:
        data = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def trainer_model() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Model)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_an_agent_in_an_allowlist_env_calls_the_trainers_model_through_the_capture_proxy(
    client: Any,
    open_server: LocalDenv,
    public: OutsideHost,
    host_listener: probes.Listener,
    trainer_model: str,
    request: pytest.FixtureRequest,
) -> None:
    """OpenEnv's token/logprob capture proxy (``CaptureServer`` of the installed ``openenv``)
    runs here, where the trainer runs, in front of the trainer's model. An env allowed only
    ``host.docker.internal:<proxy port>`` makes a model call through it, the trainer reads the
    call's token ids and logprobs from the proxy, and every other destination stays refused."""
    from openenv.core.harness.capture import CaptureServer

    with socket.socket() as s:
        s.bind(("", 0))
        port = int(s.getsockname()[1])
    capture = CaptureServer(llm_url=trainer_model, model="trainer-model", port=port)
    capture.start(timeout_s=30)
    try:
        session = capture.registry.create()  # the trainer mints the rollout's key
        with api(open_server) as c:
            env = standin(c, egress={"allow": [f"host.docker.internal:{port}"]})
            try:
                ct = client.containers.get(container_of(env))
                proxy = f"http://host.docker.internal:{port}"
                call = ct.exec_run(["python3", "-c", AGENT_CALL, proxy, session.session_id])
                got = json.loads(call.output)
                stranger = ct.exec_run(["python3", "-c", AGENT_CALL, proxy, "not-a-session"])
                refused_key = json.loads(stranger.output)
                refused: list[probes.Target] = [
                    ("host.docker.internal", host_listener.port),
                    (urlsplit(trainer_model).hostname or "", urlsplit(trainer_model).port or 0),
                    *targets_of(public),
                ]
                outcomes = probe(client, env, refused)
            finally:
                delete_all(c)
        turns = session.graph.nodes()
    finally:
        capture.stop()
    leaked = connected(outcomes, refused)
    report(
        request,
        f"capture proxy through the allowlist: the agent's call {got.get('status')}, "
        f"{len(turns)} turn captured ({len(turns[0].prompt_ids) if turns else 0} prompt ids, "
        f"{len(turns[0].sampled_ids) if turns else 0} sampled ids with logprobs); "
        f"{len(leaked)}/{len(refused)} other destinations connected",
    )
    assert got.get("status") == 200, got
    assert got["body"]["choices"][0]["message"]["content"] == "hi", got
    assert "error" in refused_key, refused_key  # the proxy takes only registered sessions
    assert len(turns) == 1, turns
    assert turns[0].prompt_ids == PROMPT_IDS
    assert turns[0].sampled_ids == [t for t, _ in SAMPLED]
    assert turns[0].sampled_logprobs == [lp for _, lp in SAMPLED]
    assert not leaked, leaked


def _env_rules(tool: str, bridge: str) -> list[str]:
    return [ln for ln in saved(tool) if f'"denv-egress env {bridge}"' in ln]


def _bridge_of(client: Any, env: dict[str, Any]) -> str:
    net = client.networks.get(f"denv-{env['id'].lower()}")
    return str(net.attrs["Options"]["com.docker.network.bridge.name"])


def _reload_firewall() -> None:
    """What a firewall reload does to denv's egress rules: the jumps and chains are gone."""
    for tool in ("iptables", "ip6tables"):
        for table, chain in (("filter", IN_CHAIN), ("mangle", FWD_CHAIN)):
            where = [tool, "-w", "5", "-t", table]
            for line in saved(tool, table):
                if line.startswith("-A ") and line.endswith("-j " + chain):
                    subprocess.run([*where, "-D", *line[3:].split()], check=False)
            subprocess.run([*where, "-F", chain], check=False)
            subprocess.run([*where, "-X", chain], check=False)


def test_allowlist_rules_outlive_a_server_restart_and_a_firewall_reload(
    client: Any,
    tmp_path_factory: pytest.TempPathFactory,
    privates: dict[str, OutsideHost],
    request: pytest.FixtureRequest,
) -> None:
    cgn = privates["cgn"]
    allowed: list[probes.Target] = [(cgn.address, 443)]
    refused: list[probes.Target] = [(cgn.address, 80), *privates["lan"].tcp_targets()]
    state = tmp_path_factory.mktemp("denv-egress-restart")
    with start_server(state, "--allow-private-egress", cleanup=False) as first, api(first) as c:
        env = standin(c, egress={"allow": [f"{cgn.address}:443"]})
    bridge = _bridge_of(client, env)
    before = _env_rules("iptables", bridge)
    with start_server(state, "--allow-private-egress") as second:
        try:
            _reload_firewall()
            assert not _env_rules("iptables", bridge)
            deadline = time.monotonic() + 3 * HOST_GUARD_CHECK_S
            while sorted(_env_rules("iptables", bridge)) != sorted(before):
                assert time.monotonic() < deadline, (before, _env_rules("iptables", bridge))
                time.sleep(0.2)
            restored_after = 3 * HOST_GUARD_CHECK_S - (deadline - time.monotonic())
            outcomes = probe(client, env, allowed + refused)
        finally:
            with api(second) as c:
                delete_all(c)
    got = connected(outcomes[: len(allowed)], allowed)
    leaked = connected(outcomes[len(allowed) :], refused)
    report(
        request,
        f"egress allowlist across a restart and a reload: {len(before)} env rules back in "
        f"{restored_after:.1f} s; {len(got)}/{len(allowed)} allowed and {len(leaked)}/"
        f"{len(refused)} others connected",
    )
    assert len(got) == len(allowed) and not leaked, outcomes
    assert not _env_rules("iptables", bridge)  # deleting the env removed them


FAILING_IP6TABLES = """#!/bin/sh
echo "ip6tables: simulated failure (this test's stand-in for a broken ip6tables)" >&2
exit 4
"""


def test_without_ipv6_rules_only_deny_envs_start_and_health_says_why(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    """A server whose ip6tables fails (a stand-in first in its PATH; the real tables are not
    touched) reports IPv6 missing and refuses allow and allowlist envs with 503."""
    bin_dir = tmp_path_factory.mktemp("fake-ip6tables")
    for name in ("ip6tables", "ip6tables-restore"):
        (bin_dir / name).write_text(FAILING_IP6TABLES)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    with start_server(tmp_path_factory.mktemp("denv-egress-no-v6")) as srv:
        monkeypatch.undo()
        with api(srv) as c:
            guard = c.get("/v1/health").json()["host_guard"]
            refused = {}
            for egress in ("allow", {"allow": ["198.18.0.1:80"]}):
                res = c.post("/v1/sandboxes", json={"image": STANDIN, "egress": egress})
                refused[json.dumps(egress)] = res
            deny = standin(c)
            delete_all(c)
    report(
        request,
        f"egress without ip6tables: health ipv6 {guard['ipv6']}; "
        f"{sum(r.status_code == 503 for r in refused.values())}/2 non-deny creates refused "
        f"with 503; a deny env {deny['status']}",
    )
    assert (guard["ipv4"], guard["ipv6"]) == ("ok", "missing"), guard
    assert "simulated failure" in guard["reason"], guard
    for egress, res in refused.items():
        assert res.status_code == 503, (egress, res.text)
        body = res.json()
        assert body["code"] == "engine_unavailable"
        assert "ipv6" in body["message"] and "egress 'deny'" in body["message"], body
    assert deny["status"] == "healthy"
