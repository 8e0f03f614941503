"""Node agents on a real Ray cluster (issue 18): pinning, the node seam over Ray, node death.

The ``cluster`` fixture (conftest) is ONE 3-node Ray cluster on this machine for the run;
these tests join it as a Ray driver and talk to the node agents through ``RemoteNode``
(``ray_cluster.discover``), booting the stand-in image's containers on the shared Docker
Engine. The last test runs a `denv cluster up` that fails at its end and checks that it
stops what it started (test_cli_cluster.py covers `up`, `status` and `down` on the session's
cluster). Each test prints one line of what it measured.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import socket
import ssl
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import ray
from cluster_helpers import LocalCluster, cluster_leftovers, cluster_sessions, grpc_call_answered
from cluster_nodes import processes_mentioning

from denv.cluster import local, processes, ray_cluster, ray_nodes, ray_tls
from denv.cluster.agent import ACTOR_PREFIX, NAMESPACE
from denv.cluster.remote import RemoteNode
from denv.server import ids
from denv.server.ingress.relay import split_address
from denv.server.node.errors import ImageNotFound
from denv.server.node.seam import BootFailed, BootSpec, NodeLost
from denv.server.records import ServiceSpec, VolumeSlot

pytestmark = pytest.mark.e2e

STANDIN = "denv-http-standin:latest"  # built by `make images`
STANDIN_CMD = [
    "sh",
    "-c",
    "echo seeded > /work/seed.txt; exec python3 -m http.server 8000 --directory /srv/www",
]
CLI = [sys.executable, "-m", "denv", "cluster"]
DEATH_NOTICED_S = 20.0  # Ray's health checks in a local cluster: 3 misses 1 s apart (~3 s)


@pytest.fixture
def nodes(cluster: LocalCluster) -> dict[str, RemoteNode]:
    """The agents of every alive node, this test process joined to the cluster as a driver."""
    ray_cluster.connect(cluster.address, cluster.ray_token)
    members = ray_cluster.Members(local.agent_config(cluster.dir, cluster.max_envs))
    found = members.wait()
    assert sorted(found) == cluster.nodes, (
        f"agents answered for {sorted(found)} only; the others: {members.errors}"
    )
    return found


def standin_spec(node: RemoteNode, command: list[str] = STANDIN_CMD) -> BootSpec:
    digest = node.inspect_image(STANDIN, False).id
    service = ServiceSpec(
        name="agent",
        image=STANDIN,
        image_digest=digest,
        command=command,
        ports=[8000],
        volumes=["/work"],
        health_path="/health",
    )
    slot = VolumeSlot(service="agent", n=0, path="/work", layers=[])
    return BootSpec(
        env_id=ids.new_id("env"),
        services=[service],
        agent="agent",
        egress="deny",
        volumes=[slot],
        timeout_s=60,
    )


def ray_node_ids() -> dict[str, str]:
    """Node name -> Ray node id, of the alive nodes offering denv_node."""
    return {n.name: n.node_id for n in ray_cluster.denv_nodes() if n.alive}


def test_node_names_come_from_resources() -> None:
    assert ray_cluster.node_name({"denv_node": 1, "denv_node_gpu-a": 1}, "ab" * 28) == "gpu-a"
    assert ray_cluster.node_name({"denv_node": 1, "CPU": 4}, "0123456789abcdef") == (
        "ray-0123456789ab"
    )
    assert ray_cluster.check_name("n7") == "n7"
    with pytest.raises(ValueError, match="lowercase letters, digits"):
        ray_cluster.check_name("Bad_Name")
    lost = pickle.loads(pickle.dumps(NodeLost("n1", "ActorDiedError during states")))
    assert (lost.node, lost.reason) == ("n1", "ActorDiedError during states")
    assert str(lost) == "node n1 is lost: ActorDiedError during states"


def test_one_agent_pinned_to_each_node_with_its_own_instance_id(
    cluster: LocalCluster, nodes: dict[str, RemoteNode]
) -> None:
    infos = {name: node.info() for name, node in nodes.items()}
    placed = {name: info["ray_node_id"] for name, info in infos.items()}
    assert placed == ray_node_ids(), "an agent runs on another Ray node than its own"
    instances = {info["instance_id"] for info in infos.values()}
    assert len(instances) == len(nodes), f"instance ids are shared: {infos}"
    assert {n: i["instance_id"] for n, i in infos.items()} == cluster.instance_ids()
    assert len({info["state_dir"] for info in infos.values()}) == len(nodes)
    assert all(i["host_guard"]["ipv4"] == "ok" for i in infos.values()), infos
    # Named, detached, in namespace denv: a new control plane finds the same actors.
    asked = local.agent_config(cluster.dir, cluster.max_envs)
    for name in nodes:
        again = ray.get_actor(ACTOR_PREFIX + name, namespace=NAMESPACE)
        assert RemoteNode(name, again).ping() == infos[name]["instance_id"]
        # An agent keeps the settings it was started with: `denv cluster up` started it
        # with what its server asks, so the server had nothing to warn about.
        hello = ray.get(again.hello.remote())
        assert hello["instance_id"] == infos[name]["instance_id"]
        assert ray_cluster.settings_differ(hello["settings"], asked) == []
    server_log = (cluster.dir / "logs" / "server.log").read_text(errors="replace")
    assert "with other settings" not in server_log
    assert "runs an older denv" not in server_log
    print(f"agents: {placed} instances {sorted(instances)}")


def test_a_remote_node_boots_a_real_env_and_tears_it_down(
    cluster: LocalCluster, nodes: dict[str, RemoteNode]
) -> None:
    node, others = nodes["n1"], [n for name, n in nodes.items() if name != "n1"]
    spec = standin_spec(node)
    started = time.monotonic()
    booted = node.bring_up(spec)
    try:
        node.wait_healthy(spec, booted, 60)
        up_s = time.monotonic() - started
        # The env answers on its node's network (its address, behind the node's relay for
        # the control plane: this machine is the node here, so it reaches it directly).
        env_ip = split_address(booted.agent_ip)[0]
        probe = f"import urllib.request as u; u.urlopen('http://{env_ip}:8000/health', timeout=10)"
        where = cluster.on_node("n1", sys.executable, "-c", probe)
        answered = subprocess.run(where, capture_output=True, text=True, timeout=60)
        assert answered.returncode == 0, answered.stderr
        assert set(node.states(spec.env_id).values()) == {"running"}
        label = f"label=denv.instance={cluster.instance_ids()['n1']}"
        mine = subprocess.run(
            cluster.docker("n1", "ps", "-q", "--no-trunc", "--filter", label),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert booted.containers["agent"] in mine, "the container lacks its node's instance"
        assert spec.env_id in node.info()["env_ids"]
        for other in others:  # each node sees only its own objects
            assert spec.env_id not in other.owned().containers.values()
        layers = node.snapshot(spec.env_id, list(booted.containers.values()), spec.volumes)
        assert len(layers) == 1 and node.has_layer(layers[0][0])
        assert not any(o.has_layer(layers[0][0]) for o in others), "a layer on every node"
    finally:
        node.teardown(spec.env_id, list(booted.containers.values()))
    owned = node.owned()
    assert spec.env_id not in owned.containers.values()
    assert spec.env_id not in owned.networks.values()
    assert spec.env_id not in owned.volume_envs
    node.delete_layers(layers[0])
    print(f"n1: booted {spec.env_id} healthy in {up_s:.2f} s, snapshot {layers[0]}, torn down")


def test_agents_sharing_one_engine_boot_at_once_on_distinct_subnets(
    cluster: LocalCluster, nodes: dict[str, RemoteNode]
) -> None:
    """Every agent carves env subnets from the same pool: boots racing on all nodes at once
    still get a subnet each on their engine (on one shared Docker Engine, Docker refuses an
    overlap and the pool takes the next one; isolated nodes each have an engine of their
    own, where the same subnet may be used again)."""
    jobs = [(name, standin_spec(node)) for name, node in nodes.items() for _ in range(2)]
    started = time.monotonic()
    try:
        with ThreadPoolExecutor(len(jobs)) as pool:
            booted = list(pool.map(lambda job: nodes[job[0]].bring_up(job[1]), jobs))
        boot_s = time.monotonic() - started
        subnets = []
        for (name, _), b in zip(jobs, booted, strict=True):
            fmt = "{{json .IPAM.Config}}"
            out = subprocess.run(
                cluster.docker(name, "network", "inspect", b.network, "--format", fmt),
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            engine = name if cluster.isolated else ""  # the engine the subnet is carved on
            subnets.append((engine, json.loads(out)[0]["Subnet"]))
        assert len(set(subnets)) == len(jobs), f"subnets shared: {subnets}"
        for (name, spec), b in zip(jobs, booted, strict=True):
            nodes[name].wait_healthy(spec, b, 60)
    finally:
        for name, spec in jobs:  # what each boot made, found by its env's labels
            nodes[name].teardown(spec.env_id, [])
    print(f"{len(jobs)} boots on {len(nodes)} agents at once in {boot_s:.1f} s: {subnets}")


def test_after_stop_the_agent_serves_the_next_control_plane(
    nodes: dict[str, RemoteNode],
) -> None:
    """A stopping control plane calls stop(): the detached agent outlives it, and the next
    control plane's boots must not run into Cancelled. Only Node methods may be called."""
    node = nodes["n0"]
    node.stop()
    spec = standin_spec(node)
    try:
        node.wait_healthy(spec, node.bring_up(spec), 60)
        assert set(node.states(spec.env_id).values()) == {"running"}
    finally:
        node.teardown(spec.env_id, [])
    with pytest.raises(AttributeError, match="not a method of the node seam"):
        ray.get(node.handle.call.remote("__init__", "n9", None), timeout=60)
    print(f"n0 after stop(): booted and tore down {spec.env_id}; __init__ refused")


def test_errors_cross_the_seam_as_their_own_class(nodes: dict[str, RemoteNode]) -> None:
    node = nodes["n2"]
    with pytest.raises(ImageNotFound) as missing:
        node.inspect_image("denv-no-such-image:never", False)
    assert missing.value.code == "image_not_found"
    assert missing.value.details == {"image": "denv-no-such-image:never"}
    assert type(missing.value) is ImageNotFound  # not Ray's RayTaskError(ImageNotFound)

    spec = standin_spec(node, ["sh", "-c", "exit 3"])  # the agent exits at once
    try:
        with pytest.raises(BootFailed) as failed:  # seen by bring_up or by the health wait
            node.wait_healthy(spec, node.bring_up(spec), 30)
        assert type(failed.value) is BootFailed
        assert failed.value.service == "agent" and failed.value.code, vars(failed.value)
    finally:
        node.teardown(spec.env_id, [])  # what the boot made: found by the env's labels
    assert spec.env_id not in node.owned().containers.values()
    print(f"crossed: ImageNotFound {missing.value.code}, BootFailed {failed.value.code}")


def test_ray_restarts_a_dead_agent_on_its_node_with_the_same_instance(
    nodes: dict[str, RemoteNode],
) -> None:
    node = nodes["n1"]
    before = node.info()
    killed = time.monotonic()
    os.kill(int(before["pid"]), signal.SIGKILL)  # the agent's worker process, not the node
    deadline = killed + 120
    while True:  # calls fail (NodeLost) or wait while Ray restarts the actor
        with contextlib.suppress(NodeLost):
            after = node.info(timeout_s=10)
            if after["pid"] != before["pid"]:
                break
        assert time.monotonic() < deadline, "Ray did not restart the agent"
        time.sleep(0.2)
    back_s = time.monotonic() - killed
    assert after["instance_id"] == before["instance_id"]
    assert after["ray_node_id"] == before["ray_node_id"], "restarted on another node"
    assert after["state_dir"] == before["state_dir"]
    assert node.engine_version()  # the same handle works again
    print(f"agent n1 (pid {before['pid']}) killed: back as pid {after['pid']} in {back_s:.1f} s")


def test_a_killed_node_leaves_alive_within_seconds_and_its_calls_raise_node_lost(
    cluster: LocalCluster, nodes: dict[str, RemoteNode]
) -> None:
    victim = "n2"
    assert victim != cluster.head
    members = ray_cluster.Members(local.agent_config(cluster.dir, cluster.max_envs))
    assert victim in members.wait()
    instance = nodes[victim].ping()
    killed = time.monotonic()
    cluster.kill_node(victim)
    try:
        while victim in ray_cluster.alive():
            assert time.monotonic() - killed < DEATH_NOTICED_S, "Ray still sees the node alive"
            time.sleep(0.1)
        noticed_s = time.monotonic() - killed
        assert victim not in members()
        status = {n["name"]: n["alive"] for n in local.status(cluster.dir)["nodes"]}
        assert status == {n: n != victim for n in cluster.nodes}, status
        started = time.monotonic()
        with pytest.raises(NodeLost) as lost:
            nodes[victim].states()
        lost_s = time.monotonic() - started
        assert lost.value.node == victim
        # The survivors answer as before.
        assert all(n.ping() for name, n in nodes.items() if name != victim)
    finally:
        cluster.restart_node(victim)
    deadline = time.monotonic() + 120
    while victim not in members():
        assert time.monotonic() < deadline, f"no agent on the restarted {victim}"
        time.sleep(0.5)
    back = members()[victim]
    assert isinstance(back, RemoteNode)
    assert back.ping() == instance, "the restarted node's agent has another instance id"
    print(
        f"{victim} killed: alive() dropped it after {noticed_s:.1f} s, NodeLost in "
        f"{lost_s * 1000:.0f} ms ({lost.value.reason}); back with instance {instance}"
    )


# A Ray client in a process of its own: joins the cluster at argv[1] with no token (it sends
# none), then with the token in the file argv[2]; prints what each attempt got.
CLIENT = """
import json, sys
from pathlib import Path
import ray
from denv.cluster import ray_auth
found = {}
for attempt in ("no token", "a wrong token"):
    if attempt == "a wrong token":
        ray_auth.use_token(Path(sys.argv[2]))
    try:
        ray.init(address=sys.argv[1], namespace="denv", logging_level="ERROR")
        found[attempt] = "joined: agents " + str(ray.util.list_named_actors(all_namespaces=True))
        ray.shutdown()
    except ConnectionError as exc:
        found[attempt] = str(exc.__cause__)
print(json.dumps(found))
"""


def test_ray_refuses_whoever_lacks_the_cluster_token(
    cluster: LocalCluster, nodes: dict[str, RemoteNode], tmp_path: Path
) -> None:
    """Every Ray process of the cluster runs with token authentication and Ray's TLS: a
    client without the token (or with another) can neither join the cluster nor call a node
    agent's worker, and one without the cluster's certificate cannot even talk to them."""
    assert oct(cluster.ray_token.stat().st_mode & 0o777) == "0o600"
    tls_dir = cluster.ray_token.parent / ray_tls.TLS_DIR
    tls_env = ray_tls.tls_env(tls_dir)
    assert tls_env, f"denv cluster up made no TLS files in {tls_dir}"
    token = cluster.ray_token.read_text().strip()
    pids = [pid for sid in cluster_sessions(cluster.dir) for pid in processes.session_pids(sid)]
    agents = {int(n.info()["pid"]) for n in nodes.values()}
    assert agents <= set(pids), "the agents run outside the nodes' sessions"
    server = cluster_sessions(cluster.dir)[-1]  # denv serve --cluster: a Ray driver
    joined = agents | {server}
    for pid in pids:  # the GCS and raylets of every node, and the processes that join them
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        if argv0.endswith((b"/raylet", b"/gcs_server")):
            joined.add(pid)
    heads = 1 if cluster.isolated else 0  # an isolated cluster's head: a raylet of its own
    want = 2 * len(nodes) + 2 + heads
    assert len(joined) == want, f"not every node's raylet and the GCS: {joined}"
    for pid in sorted(joined):
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        variables = dict(v.split(b"=", 1) for v in environ.split(b"\0") if b"=" in v)
        assert variables.get(b"RAY_AUTH_MODE") == b"token", f"process {pid}: no token mode"
        assert variables.get(b"RAY_AUTH_TOKEN_PATH") == str(cluster.ray_token).encode()
        assert b"RAY_AUTH_TOKEN" not in variables, f"process {pid} has the token in its env"
        for var, value in tls_env.items():
            assert variables.get(var.encode()) == value.encode(), f"process {pid}: {var}"
    for pid in pids:  # no process shows the token itself
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            shown = Path(f"/proc/{pid}/environ").read_bytes()
            shown += Path(f"/proc/{pid}/cmdline").read_bytes()
            assert token.encode() not in shown, f"process {pid} shows the token"
    # The clients hold the cluster's TLS files (so that it is the token they lack).
    (tmp_path / ray_tls.TLS_DIR).symlink_to(tls_dir)
    wrong = tmp_path / "wrong-token"
    wrong.write_text("0" * 64)
    wrong.chmod(0o600)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("RAY_AUTH_") and k not in ("HOME", *ray_tls.TLS_VARS)
    }
    env |= {"RAY_AUTH_MODE": "disabled", "HOME": str(tmp_path), **tls_env}  # no ~/.ray/auth_token
    env |= {"RAY_gcs_server_port_wait_time_s": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    client = subprocess.run(
        [sys.executable, "-c", CLIENT, cluster.address, str(wrong)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert client.returncode == 0, client.stderr
    found = json.loads(client.stdout.strip().splitlines()[-1])
    for attempt, why in found.items():
        assert "Authentication token is missing or incorrect" in why, f"{attempt}: {why}"
    # Straight to the ports, past Ray's client: the GCS, and a node agent's worker.
    actor = next(
        a
        for a in ray._private.state.actors().values()
        if a["Name"] == ACTOR_PREFIX + "n1" and a["State"] == "ALIVE"
    )
    worker = f"{actor['Address']['IPAddress']}:{actor['Address']['Port']}"
    calls = {
        cluster.address: "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo",
        worker: "/ray.rpc.CoreWorkerService/GetCoreWorkerStats",
    }
    mutual = _tls(tls_dir, with_certificate=True)
    for address, method in calls.items():
        assert grpc_call_answered(address, method, token, tls=mutual), f"{method}: not answered"
        assert not grpc_call_answered(address, method, None, tls=mutual), f"{method}: no token"
        assert not grpc_call_answered(address, method, "0" * 64, tls=mutual), f"{method}: wrong"
        # Without the cluster's certificate, or in clear, the token does not help.
        for tls in (_tls(tls_dir, with_certificate=False), None):
            assert _refused(address, method, token, tls), (
                f"{method} answered {'in clear' if tls is None else 'without a certificate'}"
            )
    print(
        f"Ray token auth and TLS: {len(joined)} Ray processes with the token file and the "
        f"TLS files; joining refused {sorted(found)}; {sorted(calls.values())} refused without "
        "the token, without the cluster's certificate and in clear"
    )


def _tls(tls_dir: Path, with_certificate: bool) -> ssl.SSLContext:
    """A gRPC client's TLS: the cluster's CA, and its certificate when ``with_certificate``."""
    context = ssl.create_default_context(cafile=str(tls_dir / ray_tls.CA_CERT))
    context.set_alpn_protocols(["h2"])
    if with_certificate:
        context.load_cert_chain(tls_dir / ray_tls.NODE_CERT, tls_dir / ray_tls.NODE_KEY)
    return context


def _refused(address: str, method: str, token: str, tls: ssl.SSLContext | None) -> bool:
    """Whether the gRPC call got no answer: refused, or the connection closed."""
    try:
        return not grpc_call_answered(address, method, token, tls=tls)
    except (AssertionError, OSError):  # ssl.SSLError is an OSError
        return True


def test_a_failed_up_stops_what_it_started(tmp_path: Path) -> None:
    cluster_dir = tmp_path / "c3"
    where = ["--state-dir", str(cluster_dir)]
    with socket.socket() as taken:  # denv serve cannot listen there: up fails at its end
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        up = subprocess.run(
            [*CLI, "up", "--nodes", "1", "--no-store", "--port", str(port), *where],
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert up.returncode == 1, up.stderr
    assert "denv serve --cluster exited" in up.stderr, up.stderr
    instances = [(cluster_dir / "nodes" / "n0" / "instance").read_text().strip()]
    assert not processes.read_state(cluster_dir), "cluster.json kept after the failed up"
    ray_tmp = ray_nodes.ray_tmp_dir(cluster_dir.resolve())
    left = cluster_leftovers(cluster_dir, instances, [])
    left += [f"process {p}" for p in processes_mentioning(ray_tmp)]
    left += [f"process {p}" for p in processes_mentioning(str(cluster_dir))]
    left += [ray_tmp] if Path(ray_tmp).exists() else []
    assert not left, f"a failed up left: {left}"
    print(f"failed up (port {port} taken): {up.stderr.strip().splitlines()[-1][:160]}")
