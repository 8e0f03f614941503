"""A Ray cluster of N nodes on this machine: what ``denv cluster up|status|down`` manage.

``up(cluster_dir, nodes=N)`` starts, each as its own session (``setsid``) so that it can be
found and stopped from another process:

- N Ray nodes: a head (``ray start --head --block``) and N-1 ``ray start --address``, each
  with its own temp dir (``/tmp/denv-ray-<hash of cluster_dir>/<name>``: Ray's unix sockets
  need a short path), free ports, one CPU, a small object store, no dashboard, and the
  resources ``denv_node`` and ``denv_node_<name>`` (names ``n0``, ``n1``, ...). Ray's health
  checks run every second and give up after 3 misses, so a dead node is noticed in ~3 s.
  Ray listens on every interface whatever ``--node-ip-address`` says (it turns 127.0.0.1
  into the host's address), so every Ray process runs with token authentication
  (``ray_auth``): a new token per ``up`` in ``<cluster_dir>/ray-token`` (0600), given to the
  nodes, the server and this process (which joins as a driver), refused to whoever lacks it;
- a node agent per node (``ray_cluster.discover``), state under ``<cluster_dir>/nodes/<name>``;
- SeaweedFS (``seaweed``) with its data under ``<cluster_dir>/seaweed``;
- ``denv serve --cluster <head address>`` on 127.0.0.1, state under ``<cluster_dir>/server``.

What it started is written to ``<cluster_dir>/cluster.json`` as it goes, so ``down`` stops
everything even after a failed ``up`` (which calls it itself). ``down`` stops the server, the
Ray nodes (every process of their sessions: SIGTERM, then SIGKILL), SeaweedFS, then removes
the containers, networks and volume mounts each node's agent made (found by the agent's
instance id, in this process) and Ray's temp dirs; ``purge=True`` deletes ``cluster_dir``.

All nodes share this machine's Docker Engine and kernel: what a one-machine cluster does
not show is in docs/cluster.md. The processes' bookkeeping is in ``processes``, the Ray
nodes in ``ray_nodes``, the control plane's process in ``local_server``, ``denv cluster
status`` in ``local_status``; this module is the cluster as a whole (up, down, restart).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from denv.server.auth import private_dir

from . import ray_auth, ray_tls
from .agent import INSTANCE_FILE
from .local_server import agent_config, api_key, caps_config, restart_server, start_server
from .local_status import status
from .processes import (
    STATE_FILE,
    ClusterError,
    read_state,
    session_pids,
    stop_session,
    stop_sessions,
    write_state,
)
from .ray_nodes import (
    head_node,
    join_nodes,
    node_names,
    ray_tmp_dir,
    start_engine,
    start_ray_node,
    wait_gcs,
    wait_ray_nodes,
)

# The cluster's other verbs, where callers have always found them.
__all__ = [
    "CONTROL_HEAD",
    "agent_config",
    "api_key",
    "down",
    "remove_node_objects",
    "restart_head",
    "restart_server",
    "status",
    "up",
]

log = logging.getLogger(__name__)

CONTROL_HEAD = "head"  # an isolated cluster's Ray head: this machine's, running no envs


def up(
    cluster_dir: Path,
    nodes: int = 3,
    *,
    serve: bool = True,
    store: bool = True,
    port: int = 0,
    max_envs: int = 0,
    max_memory_mb: int = 0,
    image_budget_mb: int | None = None,
    isolated: bool = False,
    images: tuple[str, ...] = (),
    merge_pages: bool = False,
) -> dict[str, Any]:
    """Start the local cluster (see the module's doc); its state (``cluster.json``).

    ``isolated``: nodes that share nothing (``isolation``): each in its network namespace
    with its own Docker Engine, into which ``images`` are loaded from this machine's.
    ``merge_pages``: live envs' memory merged by the kernel on every node (``denv serve
    --merge-pages``)."""
    if nodes < 1:
        raise ClusterError(f"--nodes {nodes}: a cluster needs at least 1 node")
    if images and not isolated:
        raise ClusterError("--image is for --isolated nodes (the others use this machine's engine)")
    if isolated:
        from . import isolated_engine, isolation

        why = isolation.available()
        if why:
            raise ClusterError(f"--isolated: {why}")
        isolated_engine.check_images(list(images))
    cluster_dir = cluster_dir.expanduser().resolve()
    private_dir(cluster_dir)
    found = read_state(cluster_dir)
    if found and any(session_pids(int(n["sid"])) for n in found.get("nodes", [])):
        raise ClusterError(
            f"a cluster already runs from {cluster_dir}: denv cluster down --state-dir "
            f"{cluster_dir} first, or pick another --state-dir"
        )
    if found:
        down(cluster_dir)  # what a cluster that died left: containers, mounts, temp dirs
    (cluster_dir / "logs").mkdir(exist_ok=True)
    state: dict[str, Any] = {
        "dir": str(cluster_dir),
        "ray_tmp": ray_tmp_dir(cluster_dir),
        "ray_token": str(ray_auth.create_token_file(cluster_dir / ray_auth.TOKEN_FILE)),
        "nodes": [],
    }
    write_state(cluster_dir, state)
    try:
        names = node_names(nodes)
        started = time.monotonic()
        if isolated:
            _make_isolated(cluster_dir, state, names, list(images))
            log.info("isolated nodes' namespaces and engines in %.1f s", time.monotonic() - started)
        # Ray's TLS files beside the token: ray_auth.process_env turns TLS on for every Ray
        # process with them. The certificate names each address a Ray process listens on.
        ray_tls.create(cluster_dir / ray_tls.TLS_DIR, _ray_addresses(state))
        if isolated:
            state["head"] = CONTROL_HEAD
            start_ray_node(cluster_dir, state, CONTROL_HEAD, head=True)
            wait_gcs(state)
            join_nodes(cluster_dir, state, names, one_by_one=True)  # one more Ray node here
        else:
            state["head"] = names[0]
            start_ray_node(cluster_dir, state, names[0], head=True)
            wait_gcs(state)
            join_nodes(cluster_dir, state, names[1:])
            wait_ray_nodes(state, names)
        log.info("Ray nodes joined %.1f s after the start", time.monotonic() - started)
        from . import ray_cluster

        state["caps"] = {"max_envs": max_envs, "max_memory_mb": max_memory_mb}
        if image_budget_mb is not None:
            state["caps"]["image_budget_mb"] = image_budget_mb
        if merge_pages:
            state["caps"]["merge_pages"] = True
        cfg = caps_config(cluster_dir, state["caps"])
        agents = ray_cluster.discover(cfg)
        if set(agents) != set(names):
            raise ClusterError(
                f"node agents of {', '.join(sorted(set(names) - set(agents)))} did not start: "
                f"their errors are in the Ray logs under {state['ray_tmp']}"
            )
        if isolated:  # not while Ray starts: on 2 cores its nodes then miss their timeouts
            from . import isolated_engine

            log.info("node agents up %.1f s after the start", time.monotonic() - started)
            isolated_engine.load_images(state["isolated"], names, cluster_dir)
            log.info("images in the nodes %.1f s after the start", time.monotonic() - started)
        if store:
            state["store"] = _start_store(cluster_dir, state.get("isolated", {}).get("gateway"))
            write_state(cluster_dir, state)
        if serve:
            state["server"] = start_server(cluster_dir, state, cfg, port)
            write_state(cluster_dir, state)
    except BaseException:
        down(cluster_dir)
        raise
    return state


def _ray_addresses(state: dict[str, Any]) -> list[str]:
    """Where the cluster's Ray processes listen: loopback, or an isolated cluster's gateway
    (its head) and nodes' addresses."""
    iso = state.get("isolated")
    if not iso:  # Ray also dials this machine's own addresses, not only loopback
        return ["127.0.0.1", *_local_addresses()]
    return [iso["gateway"], *(node["ip"] for node in iso["nodes"].values())]


def _local_addresses() -> list[str]:
    """This machine's IPv4 addresses (``ip -4 -o addr``), loopback's aside."""
    try:
        out = subprocess.run(
            ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=False
        ).stdout
    except OSError:
        return []
    found = [line.split()[3].split("/")[0] for line in out.splitlines() if len(line.split()) > 3]
    return [a for a in found if not a.startswith("127.")]


def _make_isolated(
    cluster_dir: Path, state: dict[str, Any], names: list[str], images: list[str]
) -> None:
    """The host bridge and each node's namespace and engine (recorded before they are
    made: ``down`` finds them)."""
    from . import isolation

    iso = isolation.plan(cluster_dir, names, images)
    state["isolated"] = iso
    write_state(cluster_dir, state)
    isolation.make_host_side(iso)
    for name in names:
        start_engine(cluster_dir, state, name)


def _start_store(cluster_dir: Path, host: str | None = None) -> dict[str, Any]:
    from . import seaweed

    data_dir = cluster_dir / "seaweed"
    cfg = seaweed.start(data_dir, host=host or "127.0.0.1")
    creds = cluster_dir / "store-credentials.json"
    fd = os.open(creds, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"access_key": cfg.access_key, "secret_key": cfg.secret_key}, out)
    return {
        "data_dir": str(data_dir),
        "endpoint": cfg.endpoint,
        "bucket": cfg.bucket,
        "credentials": str(creds),
    }


def restart_head(cluster_dir: Path) -> None:
    """The Ray head dies as its machine does (SIGKILL) and comes back on the same address.

    Ray keeps no cluster state across a head's death unless its GCS stores it in Redis (not
    done here): the new head is a new Ray cluster, and Ray ends every process of the old one
    within a minute of losing the head. So this ends them at once: the nodes' Ray processes
    (their agents and relays) and ``denv serve --cluster``. It then starts the head on its
    address, the nodes again (each keeps its state dir; an isolated node its engine), their
    agents, and the control plane on the same URL and database. The envs' containers run
    on in their engines throughout, and the control plane takes them back as after its own
    restart."""
    cluster_dir = cluster_dir.expanduser().resolve()
    state = read_state(cluster_dir)
    head = head_node(state) if state else None
    if state is None or head is None or "address" not in state:
        raise ClusterError(f"no cluster in {cluster_dir}: run denv cluster up first")
    _leave_cluster(state["address"])
    stop_sessions([int(head["sid"])], grace_s=0.0)  # SIGTERM then SIGKILL: a dead machine
    ended = [int(n["sid"]) for n in state.get("nodes", []) if n["name"] != head["name"]]
    if state.get("server"):
        ended.append(int(state["server"]["sid"]))
    stop_sessions(ended, grace_s=0.0)
    port = int(state["address"].rsplit(":", 1)[1])
    start_ray_node(cluster_dir, state, head["name"], head=True, port=port)
    wait_gcs(state)
    names = [n["name"] for n in state.get("nodes", []) if n["name"] != head["name"]]
    join_nodes(cluster_dir, state, names, one_by_one=bool(state.get("isolated")))
    from . import ray_cluster

    cfg = caps_config(cluster_dir, state.get("caps", {}))
    agents = ray_cluster.discover(cfg)
    expected = {n["name"] for n in state.get("nodes", [])}
    if set(agents) != expected:
        raise ClusterError(
            f"node agents of {', '.join(sorted(expected - set(agents)))} did not start "
            f"after the head's restart: see the Ray logs under {state['ray_tmp']}"
        )
    ray_cluster.disconnect()
    if state.get("server"):
        port = int(state["server"]["url"].rsplit(":", 1)[1])
        state["server"] = start_server(cluster_dir, state, cfg, port)
        write_state(cluster_dir, state)


def down(cluster_dir: Path, purge: bool = False) -> list[str]:
    """Stop everything ``up`` started from ``cluster_dir`` and remove what the nodes made;
    what it did, one line each. Idempotent."""
    cluster_dir = cluster_dir.expanduser().resolve()
    state = read_state(cluster_dir) or {}
    done: list[str] = []
    _leave_cluster(state.get("address"))
    server = state.get("server")
    if server and session_pids(int(server["sid"])):
        stop_session(int(server["sid"]), grace_s=30.0)  # SIGTERM: it stops its boots first
        done.append(f"stopped denv serve (pid {server['sid']})")
    iso = state.get("isolated")
    if iso:  # every node's processes, engine and containers at once, as machines die
        from . import isolation

        done += isolation.remove(iso, cluster_dir / "nodes")
    running = [n for n in state.get("nodes", []) if session_pids(int(n["sid"]))]
    head = state.get("ray_head")
    if head and session_pids(int(head["sid"])):
        running.append(head)
    stop_sessions([int(n["sid"]) for n in running])
    done += [f"stopped Ray node {n['name']} (session {n['sid']})" for n in running]
    if state.get("store"):
        from . import seaweed

        seaweed.stop(Path(state["store"]["data_dir"]), purge=purge)
        done.append("stopped SeaweedFS")
    if not iso:  # an isolated node's engine took its objects with it
        done += remove_node_objects(cluster_dir / "nodes")
    shutil.rmtree(state.get("ray_tmp") or ray_tmp_dir(cluster_dir), ignore_errors=True)
    (cluster_dir / ray_auth.TOKEN_FILE).unlink(missing_ok=True)  # the next up makes a new one
    if purge:
        shutil.rmtree(cluster_dir, ignore_errors=True)
        done.append(f"removed {cluster_dir}")
    else:
        (cluster_dir / STATE_FILE).unlink(missing_ok=True)
    return done


def _leave_cluster(address: str | None) -> None:
    """Leave the cluster at ``address`` when this process is one of its drivers: Ray's core
    ends a process whose cluster went away (it waits for the GCS, then exits)."""
    ray = sys.modules.get("ray")
    if ray is None or not address or not ray.is_initialized():
        return
    with contextlib.suppress(Exception):
        gcs = str(ray.get_runtime_context().gcs_address)
        if gcs.rsplit(":", 1)[-1] != address.rsplit(":", 1)[-1]:
            return  # another cluster's driver (ports differ)
    from . import ray_cluster

    ray_cluster.disconnect()


def remove_node_objects(state_root: Path) -> list[str]:
    """Remove every container, network and volume mount of each node agent under
    ``state_root`` (its instance id labels them), as the agent itself would."""
    from denv.server.docker.engine import Engine
    from denv.server.docker.node import DockerNode
    from denv.server.net.firewall import Firewall, resolvers
    from denv.server.volumes.overlay import Volumes

    done: list[str] = []
    if not state_root.is_dir():
        return done
    for node_dir in sorted(state_root.iterdir()):
        instance = node_dir / INSTANCE_FILE
        if not instance.exists():
            continue
        engine = Engine(instance.read_text().strip(), firewall=Firewall(resolvers()))
        node = DockerNode(engine, Volumes(node_dir))
        owned = node.owned()
        node.remove_owned(owned)
        node.drop_partial_layers()
        if owned.containers or owned.networks or owned.volume_envs:
            done.append(
                f"node {node_dir.name}: removed {len(owned.containers)} containers, "
                f"{len(owned.networks)} networks, the volumes of {len(owned.volume_envs)} envs"
            )
    return done
