"""Nodes that share nothing, on one machine (issue 27, item 1): ``denv cluster up --isolated``.

A 2-node isolated cluster of this module's own, started and stopped with the CLI as a user
does: each node in its own network namespace with its own address and Docker Engine, its
Ray node and agent inside it, the control plane (``denv serve``, the Ray head) in this
machine's namespace. It shows that:

- an env placed on each node runs in that node's engine, not in this machine's;
- the control plane steps it with a real OpenEnv client over its ingress, through the
  node's relay, while the env's own address cannot be reached from here (it can from inside
  its node's namespace: the address is real);
- killing a node takes its engine and containers with it (nothing of it is left on this
  machine) and ``denv cluster status`` reports it dead, while the other node's env still
  answers;
- ``denv cluster down --purge`` leaves nothing: namespaces, veths, the bridge, its iptables
  rule, cgroups, engines, mounts, processes.

No Ray driver runs in this process (its status comes from ``denv cluster status --json``),
so it never mixes with the session's ``cluster`` fixture.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cluster_helpers import cluster_leftovers, cluster_sessions

from denv.cluster import isolation, processes, ray_nodes

pytestmark = pytest.mark.e2e

ECHO_IMAGE = "denv-echo-env:latest"  # built by `make images`
CLI = [sys.executable, "-m", "denv", "cluster"]
NODES = ["n0", "n1"]
DEATH_NOTICED_S = 60.0  # Ray's health checks: ~3 s; status on a loaded machine: more


@pytest.fixture(scope="module")
def iso_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``denv cluster up --isolated --nodes 2 --image <echo>``; ``down --purge`` at the end
    (also when ``up`` failed half-way), which must leave nothing of it on this machine."""
    why = isolation.available()
    if why:
        pytest.fail(f"isolated nodes cannot run here: {why}")
    cluster_dir = tmp_path_factory.mktemp("isolated")
    where = ["--state-dir", str(cluster_dir)]
    up = subprocess.run(
        [*CLI, "up", "--isolated", "--nodes", "2", "--image", ECHO_IMAGE, "--no-store", *where],
        capture_output=True,
        text=True,
        timeout=900,
    )
    state = processes.read_state(cluster_dir) or {}
    iso = state.get("isolated")
    sessions = cluster_sessions(cluster_dir)
    instances: list[str] = []
    try:
        assert up.returncode == 0, f"denv cluster up --isolated failed:\n{up.stderr[-4000:]}"
        assert iso, "up wrote no isolated topology"
        exports = dict(
            line.removeprefix("export ").split("=", 1)
            for line in up.stdout.splitlines()
            if line.startswith("export ")
        )
        nodes_dir = cluster_dir / "nodes"
        instances = [(nodes_dir / n / "instance").read_text().strip() for n in NODES]
        yield {
            "dir": cluster_dir,
            "state": state,
            "iso": iso,
            "url": state["server"]["url"],
            "api_key": exports["DENV_API_KEY"],
        }
    finally:
        down = subprocess.run(
            [*CLI, "down", "--purge", *where], capture_output=True, text=True, timeout=300
        )
        assert down.returncode == 0, f"denv cluster down failed:\n{down.stderr}"
        left = cluster_leftovers(cluster_dir, instances, sessions)
        left += isolation.leftovers(iso) if iso else []
        left += [f"cluster dir {cluster_dir}"] if cluster_dir.exists() else []
        assert not left, f"denv cluster down left: {left}"


def _engine(iso: dict[str, Any], node: str, *args: str) -> str:
    host = isolation.docker_host(iso["nodes"][node])
    return subprocess.run(
        ["docker", "-H", host, *args], capture_output=True, text=True, check=True, timeout=60
    ).stdout


def _container(env: dict[str, Any]) -> str:
    return f"denv-{env['id'].lower()}-agent"


@pytest.fixture(scope="module")
def envs(iso_cluster: dict[str, Any]) -> Iterator[dict[str, dict[str, Any]]]:
    """An echo env (egress deny) on each node: node name -> env."""
    made: list[dict[str, Any]] = []
    with httpx.Client(
        base_url=iso_cluster["url"],
        headers={"Authorization": f"Bearer {iso_cluster['api_key']}"},
        timeout=300,
        trust_env=False,
    ) as c:
        try:
            on: dict[str, dict[str, Any]] = {}
            for _ in range(4):  # placement spreads fresh envs over the nodes
                res = c.post("/v1/sandboxes", json={"image": ECHO_IMAGE})
                assert res.status_code == 201, res.text
                made.append(res.json())
                on.setdefault(made[-1]["node"], made[-1])
                if set(on) == set(NODES):
                    break
            assert set(on) == set(NODES), [e["node"] for e in made]
            assert all(e["status"] == "healthy" for e in on.values()), on
            yield on
        finally:
            for e in made:
                c.delete(f"/v1/envs/{e['id']}")


def test_each_env_runs_in_its_own_nodes_engine(
    iso_cluster: dict[str, Any], envs: dict[str, dict[str, Any]]
) -> None:
    iso = iso_cluster["iso"]
    host_containers = subprocess.run(
        ["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True, check=True
    ).stdout.split()
    for node, env in envs.items():
        other = next(n for n in NODES if n != node)
        assert _container(env) in _engine(iso, node, "ps", "--format", "{{.Names}}").split()
        assert _container(env) not in _engine(iso, other, "ps", "-a", "--format", "{{.Names}}")
        assert _container(env) not in host_containers, "an isolated node's env in the host engine"
    # Each engine is a dockerd of its own (its own data root), in its node's namespace.
    for n in NODES:
        node = iso["nodes"][n]
        root = _engine(iso, n, "info", "--format", "{{.DockerRootDir}}").strip()
        assert root == str(Path(node["root"]) / "data"), root
        pid = int((Path(node["run"]) / "dockerd.pid").read_text())
        assert (
            os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/run/netns/{node['netns']}").st_ino
        )
        assert os.stat(f"/proc/{pid}/ns/net").st_ino != os.stat("/proc/self/ns/net").st_ino


def _env_address(iso: dict[str, Any], node: str, env: dict[str, Any]) -> tuple[str, int]:
    """The env's address on its node's bridge and its server's port."""
    info = json.loads(_engine(iso, node, "inspect", _container(env)))[0]
    ip = next(iter(info["NetworkSettings"]["Networks"].values()))["IPAddress"]
    port = int(next(iter(info["Config"]["ExposedPorts"])).split("/")[0])
    return ip, port


def _connect_from(netns: str, ip: str, port: int) -> int:
    """Exit status of a TCP connect to ``ip:port`` made inside ``netns`` (0: connected)."""
    code = f"import socket; socket.create_connection(({ip!r}, {port}), 5).close()"
    done = subprocess.run(
        ["ip", "netns", "exec", netns, sys.executable, "-c", code],
        capture_output=True,
        timeout=60,
    )
    return done.returncode


@pytest.fixture
def probe(iso_cluster: dict[str, Any]) -> Iterator[str]:
    """A network namespace standing for another machine on the nodes' network: a veth on
    the cluster's bridge, a free address of its subnet; removed afterwards (its veth too)."""
    iso = iso_cluster["iso"]
    name, veth = f"denv-{iso['tag']}-probe", f"dnp{iso['tag']}"
    subnet = ipaddress.ip_network(iso["subnet"])
    address = f"{list(subnet.hosts())[-1]}/{subnet.prefixlen}"
    steps = [
        ["ip", "netns", "add", name],
        ["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name],
        ["ip", "link", "set", veth, "master", iso["bridge"], "up"],
        ["ip", "netns", "exec", name, "ip", "addr", "add", address, "dev", "eth0"],
        ["ip", "netns", "exec", name, "ip", "link", "set", "eth0", "up"],
    ]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        subprocess.run(["ip", "link", "del", veth], capture_output=True)


def test_the_control_plane_steps_each_env_through_its_nodes_relay_only(
    iso_cluster: dict[str, Any], envs: dict[str, dict[str, Any]], probe: str
) -> None:
    from openenv.core.generic_client import GenericEnvClient

    iso = iso_cluster["iso"]
    for node, env in envs.items():
        url = env["endpoints"][0]["url"]
        assert url.startswith(iso_cluster["url"] + "/ingress/"), url
        with GenericEnvClient(base_url=url).sync() as client:
            client.reset(episode_id=f"on-{node}")
            result = client.step({"message": f"to {node}"})
            assert result.observation["echoed_message"] == f"to {node}"
        ip, port = _env_address(iso, node, env)
        node_ns = iso["nodes"][node]["netns"]
        # This machine has no route into the node: whatever answers at that address here
        # (the address space is each engine's own; this machine's envs may reuse it) is
        # not reached over the cluster's bridge.
        route = subprocess.run(
            ["ip", "-o", "route", "get", ip], capture_output=True, text=True, check=True
        ).stdout
        assert f"dev {iso['bridge']}" not in route, route
        # A machine on the nodes' network that routes through the node cannot reach the env
        # (deny envs sit on internal networks: the node forwards nothing to them) ...
        via = ["ip", "route", "replace", f"{ip}/32", "via", iso["nodes"][node]["ip"]]
        subprocess.run(["ip", "netns", "exec", probe, *via], check=True, capture_output=True)
        assert _connect_from(probe, ip, port) != 0, f"reached {node}'s env {ip} via the node"
        # ... while inside its node it answers: the address is real.
        assert _connect_from(node_ns, ip, port) == 0, f"{node}'s env {ip}:{port} is not there"
    print(
        f"\n  stepped envs on {', '.join(envs)} through their relays; their addresses unreachable"
    )


def test_an_image_on_one_node_only_starts_on_another(
    iso_cluster: dict[str, Any], envs: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    """An image only n0's engine holds (not this machine's, not n1's) starts an env on n1:
    n1 copies it from n0, node to node, and records it as brought (what it may collect)."""
    iso, ref = iso_cluster["iso"], f"denv-test-image-{os.urandom(4).hex()}:1"
    (tmp_path / "Dockerfile").write_text(f"FROM {ECHO_IMAGE}\nLABEL denv.test.image={ref}\n")
    made: list[str] = []
    engines = [["docker", "-H", isolation.docker_host(iso["nodes"][n])] for n in NODES]
    try:
        # Built in n0's engine (on the echo image up loaded there): no other engine has it.
        built = subprocess.run(
            [*engines[0], "build", "-q", "-t", ref, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert built.returncode == 0, built.stderr
        here = subprocess.run(["docker", "image", "inspect", ref], capture_output=True, timeout=60)
        assert here.returncode != 0, "the image is on this machine's engine too"
        image_id = _engine(iso, "n0", "image", "inspect", "--format", "{{.Id}}", ref).strip()
        with httpx.Client(
            base_url=iso_cluster["url"],
            headers={"Authorization": f"Bearer {iso_cluster['api_key']}"},
            timeout=300,
            trust_env=False,
        ) as c:
            for _ in range(3):  # placement spreads: within 2 creates one lands on n1
                res = c.post("/v1/sandboxes", json={"image": ref})
                assert res.status_code == 201, res.text
                made.append(res.json()["id"])
                if res.json()["node"] == "n1":
                    break
            env = res.json()
            assert env["node"] == "n1" and env["status"] == "healthy", env
            images = _engine(iso, "n1", "images", "-q", "--no-trunc").split()
            assert image_id in images, "n1 runs the env without the image?"
            brought = json.loads((iso_cluster["dir"] / "nodes" / "n1" / "images.json").read_text())
            assert image_id in brought
    finally:
        with httpx.Client(
            base_url=iso_cluster["url"],
            headers={"Authorization": f"Bearer {iso_cluster['api_key']}"},
            timeout=300,
            trust_env=False,
        ) as c:
            for env_id in made:
                c.delete(f"/v1/envs/{env_id}")
        for prefix in engines:
            subprocess.run([*prefix, "rmi", "-f", ref], capture_output=True, timeout=60)
    print(f"\n  {ref}: only on n0, copied to n1 for an env there")


def _status(cluster_dir: Path) -> dict[str, Any]:
    out = subprocess.run(
        [*CLI, "status", "--json", "--state-dir", str(cluster_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    try:
        found: dict[str, Any] = json.loads(out[out.index("{") :])
    except ValueError as exc:
        raise AssertionError(f"denv cluster status --json printed no JSON: {out!r}") from exc
    return found


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_killing_a_node_takes_its_engine_and_containers_with_it(
    iso_cluster: dict[str, Any], envs: dict[str, dict[str, Any]]
) -> None:
    iso, cluster_dir = iso_cluster["iso"], iso_cluster["dir"]
    victim, survivor = "n1", "n0"
    node = iso["nodes"][victim]
    assert {n["name"]: n["alive"] for n in _status(cluster_dir)["nodes"]} == {
        "n0": True,
        "n1": True,
    }
    killed = time.monotonic()
    ray_nodes.kill_node(cluster_dir, victim)
    # Nothing of the node runs or stays mounted on this machine.
    assert not list((isolation.FREEZER).glob(f"{node['cgroup']}/**/cgroup.procs"))
    assert not Path(f"/run/netns/{node['netns']}").exists()
    assert not Path(f"/sys/class/net/{node['veth']}").exists()
    engine = subprocess.run(
        ["docker", "-H", isolation.docker_host(node), "version"], capture_output=True, timeout=30
    )
    assert engine.returncode != 0, "the dead node's engine still answers"
    dirs = (str(Path(node["root"]).resolve()), node["run"])  # data root; socket, exec root
    with open("/proc/self/mountinfo") as info:
        mounts = [ln.split()[4] for ln in info if ln.split()[4].startswith(dirs)]
    assert not mounts, mounts
    host_containers = subprocess.run(
        ["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert _container(envs[victim]) not in host_containers
    left = [pid for d in dirs for pid in processes.processes_mentioning(d) if _running(pid)]
    assert not left, f"processes of the dead node still run: {left}"
    # The cluster reports it dead; the other node's env still answers through its relay.
    while True:
        alive = {n["name"]: n["alive"] for n in _status(cluster_dir)["nodes"]}
        if alive == {"n0": True, "n1": False}:
            break
        assert time.monotonic() - killed < DEATH_NOTICED_S, alive
        time.sleep(1)
    url = envs[survivor]["endpoints"][0]["url"]
    assert httpx.get(f"{url}/health", trust_env=False, timeout=30).json() == {"status": "healthy"}
    print(f"\n  {victim} killed: engine, containers, namespace gone; dead in status")


def test_an_image_missing_here_is_refused_before_anything_starts(tmp_path: Path) -> None:
    cluster_dir = tmp_path / "refused"
    missing = "denv-no-such-image:never"
    up = subprocess.run(
        [*CLI, "up", "--isolated", "--image", missing, "--state-dir", str(cluster_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert up.returncode == 1, up.stderr
    assert missing in up.stderr and "docker images" in up.stderr, up.stderr
    assert not cluster_dir.exists(), "up made the cluster's directory before refusing"


def test_a_failed_isolated_up_removes_what_it_made(tmp_path: Path) -> None:
    """``up --isolated`` failing at its end (denv serve cannot listen) has made the bridge, a
    namespace, an engine and Ray nodes by then: all of it is gone when it returns."""
    cluster_dir = (tmp_path / "failed").resolve()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        where = ["--state-dir", str(cluster_dir)]
        up = subprocess.run(
            [*CLI, "up", "--isolated", "--nodes", "1", "--no-store", "--port", str(port), *where],
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert up.returncode == 1, up.stderr
    assert "denv serve --cluster exited" in up.stderr, up.stderr
    assert not processes.read_state(cluster_dir), "cluster.json kept after the failed up"
    # What it made is named after the cluster's dir: the same plan finds it, if left.
    left = isolation.leftovers(isolation.plan(cluster_dir, ["n0"], []))
    left += [
        f"process {p}" for p in processes.processes_mentioning(str(cluster_dir)) if _running(p)
    ]
    ray_tmp = ray_nodes.ray_tmp_dir(cluster_dir)
    left += [f"process {p}" for p in processes.processes_mentioning(ray_tmp) if _running(p)]
    with open("/proc/self/mountinfo") as info:
        left += [ln.split()[4] for ln in info if ln.split()[4].startswith(str(cluster_dir))]
    assert not left, f"a failed isolated up left: {left}"
