"""A local cluster's Ray nodes killed as a machine dies and started again, and the processes
a cluster left: what the cluster tests do to a cluster that ``denv cluster up`` started
(import as ``from cluster_nodes import ...``; a test's subprocess has this folder on its
``PYTHONPATH``). Nothing in ``denv`` kills or restarts a single node."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from denv.cluster import isolation
from denv.cluster.processes import (
    STATE_FILE,
    ClusterError,
    read_state,
    session_pids,
    stop_session,
)
from denv.cluster.ray_nodes import NODE_START_S, join_nodes, start_engine, token_file


def processes_mentioning(text: str) -> list[int]:
    """Processes whose command line holds ``text`` (a cluster's dir or Ray temp dir)."""
    found: list[int] = []
    needle = text.encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if needle in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


def raylet_pid(sid: int) -> int | None:
    """The raylet of the Ray node whose session is ``sid`` (killing it kills the node)."""
    for pid in session_pids(sid):
        with contextlib.suppress(OSError):
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            if argv0.endswith(b"/raylet"):
                return pid
    return None


def kill_node(cluster_dir: Path, name: str) -> None:
    """Kill Ray node ``name`` as a machine dies: its raylet first (SIGKILL), then the rest. In
    an isolated cluster, everything the node runs goes at once, its engine and containers
    too, and its network namespace with them (``isolation.kill_node``)."""
    state = read_state(cluster_dir) or {}
    node = next((n for n in state.get("nodes", []) if n["name"] == name), None)
    if node is None:
        raise ClusterError(f"no node {name!r} in {cluster_dir / STATE_FILE}")
    if state.get("isolated"):
        isolation.kill_node(state["isolated"], name, cluster_dir / "nodes" / name)
    raylet = raylet_pid(int(node["sid"]))
    if raylet is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(raylet, signal.SIGKILL)
    stop_session(int(node["sid"]), grace_s=5.0)


def restart_node(cluster_dir: Path, name: str) -> None:
    """Start Ray node ``name`` again (a new Ray node with the same name and state dir; in an
    isolated cluster its namespace and engine first, on the engine's data root kept). This
    process joins the cluster as a Ray driver."""
    state = read_state(cluster_dir)
    if state is None or "address" not in state:
        raise ClusterError(f"no cluster in {cluster_dir}: run denv cluster up first")
    if state.get("head") == name:
        raise ClusterError("the head node cannot be restarted: run denv cluster down, then up")
    old = next((n for n in state["nodes"] if n["name"] == name), None)
    if old is not None and session_pids(int(old["sid"])):
        raise ClusterError(f"node {name} still runs (session {old['sid']}): kill_node first")
    from denv.cluster import ray_cluster  # imports Ray: only where a node is restarted

    # A node killed a moment ago may still count as alive until Ray's health checks miss it:
    # its successor must not be taken for it (nor its agent's name still be held).
    ray_cluster.connect(state["address"], token_file(state))
    deadline = time.monotonic() + NODE_START_S
    while name in ray_cluster.alive():
        if time.monotonic() > deadline:
            raise ClusterError(f"node {name} still runs: kill it first (kill_node)")
        time.sleep(0.2)
    if state.get("isolated"):
        start_engine(cluster_dir, state, name)
    join_nodes(cluster_dir, state, [name])  # started again if it gives up (a loaded machine)
