"""The Ray nodes of a local cluster: started, joined, waited for.

Each node is a ``ray start --block`` of its own session (``processes``) with its own short temp
dir, a small object store and the resources that name it (``denv_node_<name>``), so that one
machine can stand in for N: the node agents find their node by those resources
(``ray_cluster``), and the cluster tests kill and restart a node (tests/cluster/cluster_nodes.py,
with ``join_nodes`` and ``start_engine``) to see the control plane lose and regain it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from . import ray_auth
from .processes import (
    ClusterError,
    free_port,
    session_pids,
    spawn,
    tail,
    write_state,
)

log = logging.getLogger(__name__)

OBJECT_STORE_BYTES = 200 * 1024 * 1024  # Ray's object store per node (layers copied between
# agents pass through it; Ray spills to disk past it)
JOIN_ATTEMPTS = 3  # a Ray node that gave up at start is started again, this many times in all
NODE_START_S = 90.0  # a Ray node joins (2 cores shared by every node: slow at times)
# Ray's GCS: a node is dead after 3 missed health checks 1 s apart (default 5 x 3 s).
HEALTH_ENV = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}
ISOLATED_HEALTH_ENV = {"RAY_health_check_timeout_ms": "3000"}
# With usage stats disabled, a Ray head's dashboard process (started in minimal mode whatever
# --include-dashboard says) still sends a "disabled" report to usage-stats.ray.io, and, with
# no ~/ray_bootstrap_config.yaml, asks 169.254.169.254 (Azure's and AWS's metadata address)
# and metadata.google.internal which cloud it runs in: 2 connections and 4-6 DNS queries out
# of the machine at every head start. ``quiet_head_env`` sends the report to a closed port on
# loopback instead, and gives the head's processes a HOME of their own holding a bootstrap
# config that names no cloud.
USAGE_REPORT_URL = "http://127.0.0.1:0/"  # port 0: nothing can listen there
BOOTSTRAP_CONFIG = (
    "# Written by denv so that Ray does not ask cloud metadata servers where it runs.\n"
    "provider:\n  type: local\n"
)


def node_names(count: int) -> list[str]:
    return [f"n{i}" for i in range(count)]


def ray_command() -> list[str]:
    """``ray`` of this Python environment."""
    return [sys.executable, "-m", "ray.scripts.scripts"]


def ray_tmp_dir(cluster_dir: Path) -> str:
    """The Ray nodes' temp dirs' parent: short (Ray's unix sockets need a short path) and
    the same for the same cluster dir."""
    return f"/tmp/denv-ray-{hashlib.sha256(str(cluster_dir).encode()).hexdigest()[:10]}"


def quiet_head_env(ray_tmp: str | Path) -> dict[str, str]:
    """A Ray head's environment that reports nothing off the machine and looks for no cloud:
    the usage report's URL (``USAGE_REPORT_URL``, unless this process has one); ``HOME``, a
    dir under the cluster's Ray temp dir ``ray_tmp`` (removed by ``down``) holding
    ``ray_bootstrap_config.yaml``; and ``DOCKER_CONFIG``, so that a node agent on the head
    still reads the Docker credentials of the real home."""
    home = Path(ray_tmp) / "home"
    home.mkdir(parents=True, exist_ok=True)
    (home / "ray_bootstrap_config.yaml").write_text(BOOTSTRAP_CONFIG)
    docker_config = os.environ.get("DOCKER_CONFIG") or str(Path.home() / ".docker")
    report_url = os.environ.get("RAY_USAGE_STATS_REPORT_URL", USAGE_REPORT_URL)
    return {
        "RAY_USAGE_STATS_REPORT_URL": report_url,
        "HOME": str(home),
        "DOCKER_CONFIG": docker_config,
    }


def agent_ports() -> list[str]:
    """Ports for a node's agents, chosen here: left to the agents (0), the raylet waits for
    the port files they write and aborts after 15 s, which a loaded machine exceeds (the
    dashboard agent's imports alone took 37 s here)."""
    ports: list[int] = []
    while len(ports) < 4:  # free_port() may give the same port twice in a row
        port = free_port()
        if port not in ports:
            ports.append(port)
    return [
        f"--dashboard-agent-listen-port={ports[0]}",
        f"--dashboard-agent-grpc-port={ports[1]}",
        f"--metrics-export-port={ports[2]}",
        f"--runtime-env-agent-port={ports[3]}",
    ]


def start_ray_node(
    cluster_dir: Path, state: dict[str, Any], name: str, *, head: bool = False, port: int = 0
) -> dict[str, Any]:
    """Start Ray node ``name`` (the head when ``head``, its GCS on ``port`` or a free one)
    and record it in ``state``.

    In an isolated cluster (``state["isolated"]``, see ``isolation``) the head is this
    machine's own Ray node (``CONTROL_HEAD``: no ``denv_node``, no CPUs) on the host bridge's
    gateway address, and each node runs in its namespace and cgroup on its own address, with
    ``DOCKER_HOST`` naming its own engine."""
    iso = state.get("isolated")
    temp_dir = Path(state["ray_tmp"]) / name
    temp_dir.mkdir(parents=True, exist_ok=True)
    control = bool(iso) and head
    resources = json.dumps({} if control else {"denv_node": 1, f"denv_node_{name}": 1})
    cmd = [
        *ray_command(),
        "start",
        "--block",
        "--disable-usage-stats",
        f"--num-cpus={0 if control else 1}",
        f"--object-store-memory={OBJECT_STORE_BYTES}",
        f"--temp-dir={temp_dir}",
        f"--resources={resources}",
        "--min-worker-port=0",
        "--max-worker-port=0",
        *agent_ports(),
    ]
    prefix: list[str] = []
    env = {**HEALTH_ENV, **ray_auth.process_env(token_file(state))}
    if control:
        # Its GCS checks the nodes' health. A dead isolated node's address is gone, so a
        # check times out rather than being refused: 3 s, not Ray's 10 s, per check.
        env.update(ISOLATED_HEALTH_ENV)
    if iso and not head:
        from . import isolation

        node_iso = iso["nodes"][name]
        ip = node_iso["ip"]
        prefix = isolation.node_prefix(node_iso)
        env["DOCKER_HOST"] = isolation.docker_host(node_iso)
    else:
        ip = iso["gateway"] if iso else "127.0.0.1"
    if head:
        env.update(quiet_head_env(state["ray_tmp"]))
        port = port or free_port()
        state["address"] = f"{ip}:{port}"
        cmd += [
            "--head",
            f"--port={port}",
            f"--node-ip-address={ip}",
            "--include-dashboard=false",
            f"--dashboard-port={free_port()}",
        ]
    else:
        cmd += [f"--address={state['address']}", f"--node-ip-address={ip}"]
    log_path = cluster_dir / "logs" / f"ray-{name}.log"
    pid = spawn([*prefix, *cmd], log_path, env)
    node = {"name": name, "sid": pid, "temp_dir": str(temp_dir), "log": str(log_path), "ip": ip}
    if control:
        state["ray_head"] = node
    else:
        state["nodes"] = [n for n in state.get("nodes", []) if n["name"] != name] + [node]
    write_state(cluster_dir, state)
    return node


def join_nodes(
    cluster_dir: Path,
    state: dict[str, Any],
    names: list[str],
    attempts: int = JOIN_ATTEMPTS,
    one_by_one: bool = False,
) -> None:
    """Start the Ray nodes ``names`` side by side (``one_by_one``: each once the one before
    has joined) and wait until Ray sees them all. A node whose ``ray start`` gave up is
    started again (up to ``attempts`` times): Ray waits only 30 s for a new raylet to
    register, which a loaded 2-core machine exceeds at times, the more so the more nodes
    start at once."""
    if one_by_one:
        for name in names:
            join_nodes(cluster_dir, state, [name], attempts)
        return
    for name in names:
        start_ray_node(cluster_dir, state, name)
    for attempt in range(1, attempts + 1):
        try:
            wait_ray_nodes(state, names)
            return
        except ClusterError:
            exited = [
                n["name"]
                for n in state["nodes"]
                if n["name"] in names and not session_pids(int(n["sid"]))
            ]
            if not exited or attempt == attempts:
                raise
            log.warning("Ray nodes %s exited at start: starting them again", ", ".join(exited))
            for name in exited:
                start_ray_node(cluster_dir, state, name)


def token_file(state: dict[str, Any]) -> Path:
    """The cluster's Ray token file (``ray_auth``), which every node and driver joins with."""
    return Path(state.get("ray_token") or Path(state["dir"]) / ray_auth.TOKEN_FILE)


def wait_gcs(state: dict[str, Any], timeout_s: float = NODE_START_S) -> None:
    """Until the head's GCS port answers; ClusterError with its log when the head exits."""
    head = head_node(state)
    assert head is not None, "wait_gcs before the head was started"
    host, port = state["address"].rsplit(":", 1)
    deadline = time.monotonic() + timeout_s
    while True:
        if not session_pids(int(head["sid"])):
            raise ClusterError(f"the Ray head exited: {tail(Path(head['log']))}")
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), 1):
            return
        if time.monotonic() > deadline:
            raise ClusterError(
                f"the Ray head did not listen on {state['address']} within {timeout_s:.0f} s: "
                f"{tail(Path(head['log']))}"
            )
        time.sleep(0.3)


def wait_ray_nodes(
    state: dict[str, Any], names: list[str], timeout_s: float = NODE_START_S
) -> None:
    """Until Ray sees every node of ``names`` alive (this process joins the cluster with the
    cluster's token). ClusterError at once, with the head's log, when the head has exited,
    and at ``timeout_s`` when its GCS port does not answer: ``ray.init`` on a cluster whose
    head is gone retries for minutes, so it is called only while the port answers."""
    from . import ray_cluster

    address, token = state["address"], token_file(state)
    deadline = time.monotonic() + timeout_s
    while True:
        head = head_node(state)
        if head is not None and not session_pids(int(head["sid"])):
            raise ClusterError(
                f"waiting for Ray nodes {', '.join(names)}: the Ray head {head['name']} "
                f"exited: {tail(Path(head['log']))}"
            )
        for node in state.get("nodes", []):
            if node["name"] in names and not session_pids(int(node["sid"])):
                raise ClusterError(f"Ray node {node['name']} exited: {tail(Path(node['log']))}")
        missing, why = set(names), _gcs_silent(address)
        if not why:  # joining a GCS that does not answer would retry for minutes
            try:
                ray_cluster.connect(address, token)
                missing = set(names) - ray_cluster.alive()
            except ConnectionError as exc:
                why = str(exc)
        if not missing:
            return
        if time.monotonic() > deadline:
            raise ClusterError(
                f"Ray nodes {', '.join(sorted(missing))} did not join {address} within "
                f"{timeout_s:.0f} s {why}: see the logs under <cluster dir>/logs"
            )
        time.sleep(0.5)


def head_node(state: dict[str, Any]) -> dict[str, Any] | None:
    """The Ray head's record: a node's, or this machine's own (an isolated cluster's)."""
    if state.get("ray_head"):
        return dict(state["ray_head"])
    return next((n for n in state.get("nodes", []) if n["name"] == state.get("head")), None)


def _gcs_silent(address: str) -> str:
    """Why the GCS at ``address`` cannot be joined now, or "" when its port answers."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), 2):
            return ""
    except OSError as exc:
        return f"(the Ray head's GCS at {address} does not answer: {exc.strerror or exc})"


def start_engine(cluster_dir: Path, state: dict[str, Any], name: str) -> None:
    """An isolated node's network namespace and Docker Engine (``isolation``,
    ``isolated_engine``), recorded."""
    from . import isolated_engine, isolation

    iso = state["isolated"]
    isolation.make_netns(iso, name)
    log_path = cluster_dir / "logs" / f"dockerd-{name}.log"
    iso["nodes"][name]["engine_log"] = str(log_path)
    write_state(cluster_dir, state)  # the cgroup and namespace are found by name
    iso["nodes"][name]["engine_sid"] = isolated_engine.start_engine(iso["nodes"][name], log_path)
    write_state(cluster_dir, state)
