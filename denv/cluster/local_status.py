"""``denv cluster status``: a local cluster's nodes (alive or not, envs, spares), its server
and store, read from ``cluster.json``, the node agents and the server's env list."""

from __future__ import annotations

import contextlib
import json
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from .local_server import api_key
from .processes import read_state, session_pids
from .ray_nodes import head_node, token_file


def status(cluster_dir: Path, timeout_s: float = 10.0) -> dict[str, Any]:
    """The cluster's nodes (alive or not, envs, spares), its server and store."""
    cluster_dir = cluster_dir.expanduser().resolve()
    state = read_state(cluster_dir)
    if state is None:
        return {"dir": str(cluster_dir), "running": False, "nodes": []}
    alive: set[str] = set()
    agents: dict[str, Any] = {}
    head = head_node(state)
    if head is not None and session_pids(int(head["sid"])):
        from . import ray_cluster

        ray_cluster.connect(state["address"], token_file(state))
        alive = ray_cluster.alive()
        for name in alive:
            agent = ray_cluster.find_agent(name)
            if agent is None:
                continue
            with contextlib.suppress(Exception):
                agents[name] = agent.info(timeout_s)
    in_api = _api_env_ids(state)
    nodes = []
    for node in state.get("nodes", []):
        info = agents.get(node["name"], {})
        env_ids = list(info.get("env_ids", []))
        # A spare is an env the API does not list yet (known only when the server answers).
        spares = [e for e in env_ids if e not in in_api] if in_api is not None else None
        nodes.append(
            {
                "name": node["name"],
                "head": node["name"] == state.get("head"),
                "alive": node["name"] in alive,
                "agent": bool(info),
                "envs": len(env_ids) - len(spares) if spares is not None else len(env_ids),
                "spares": len(spares) if spares is not None else len(info.get("warm_env_ids", [])),
                "memory_mb": int(info.get("memory_bytes", 0)) // (1024 * 1024),
                "state_dir": info.get("state_dir", str(cluster_dir / "nodes" / node["name"])),
                "relay": info.get("relay", ""),  # where the ingress reaches its envs
                "ip": node.get("ip", ""),
            }
        )
    server = state.get("server")
    return {
        "dir": str(cluster_dir),
        "running": True,
        "address": state.get("address"),
        "isolated": bool(state.get("isolated")),
        "nodes": nodes,
        "server": {
            "url": server["url"],
            "running": bool(session_pids(int(server["sid"]))),
        }
        if server
        else None,
        "store": {"endpoint": state["store"]["endpoint"]} if state.get("store") else None,
    }


def _api_env_ids(state: dict[str, Any]) -> set[str] | None:
    """Ids of the envs the server lists (those not deleted), None when it does not answer."""
    server = state.get("server")
    key = api_key(Path(state["dir"]))
    if not server or not key:
        return None
    found: set[str] = set()
    cursor = ""
    for _ in range(1000):  # 200 a page
        query = "limit=200" + (f"&cursor={urllib.parse.quote(cursor)}" if cursor else "")
        request = urllib.request.Request(
            f"{server['url']}/v1/envs?{query}", headers={"Authorization": f"Bearer {key}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as resp:
                body = json.loads(resp.read())
        except (OSError, ValueError):
            return None
        found |= {str(item["id"]) for item in body.get("items", [])}
        cursor = body.get("next_cursor") or ""
        if not cursor:
            break
    return found
