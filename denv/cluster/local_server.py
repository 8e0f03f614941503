"""A local cluster's control plane: the ``denv serve --cluster`` process that ``local.up``
starts, its arguments, its wait for ``/v1/health``, its restart and its API key.

The server asks its node agents for the settings they were started with (``agent_config``),
since an agent keeps those; ``local`` starts both from the same caps in ``cluster.json``.
"""

from __future__ import annotations

import contextlib
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from denv.server.auth import load_or_create_key_file, private_dir
from denv.server.docker.images import DEFAULT_BUDGET_MB

from . import ray_auth
from .agent import AgentConfig
from .processes import (
    ClusterError,
    free_port,
    read_state,
    session_pids,
    spawn,
    stop_session,
    tail,
    write_state,
)
from .ray_nodes import token_file

SERVER_START_S = 120.0


def agent_config(
    cluster_dir: Path,
    max_envs: int = 0,
    max_memory_mb: int = 0,
    image_budget_mb: int | None = None,
    merge_pages: bool = False,
) -> AgentConfig:
    """What the agents of a local cluster get: what its ``denv serve`` asks of them too
    (``serve_argv``), since an agent keeps the settings it was started with."""
    return AgentConfig(
        state_root=str(cluster_dir / "nodes"),
        max_envs=max_envs,
        max_memory_mb=max_memory_mb,
        image_budget_mb=DEFAULT_BUDGET_MB if image_budget_mb is None else image_budget_mb,
        merge_pages=merge_pages,
    )


def caps_config(cluster_dir: Path, caps: dict[str, Any]) -> AgentConfig:
    """``agent_config`` from the caps ``up`` recorded in ``cluster.json``."""
    return agent_config(
        cluster_dir,
        caps.get("max_envs", 0),
        caps.get("max_memory_mb", 0),
        caps.get("image_budget_mb"),
        bool(caps.get("merge_pages", False)),
    )


def start_server(
    cluster_dir: Path, state: dict[str, Any], cfg: AgentConfig, port: int
) -> dict[str, Any]:
    """Start ``denv serve --cluster`` (recorded in ``state`` as soon as it runs) and wait
    until it answers; its record."""
    server_dir = cluster_dir / "server"
    private_dir(server_dir)
    key, key_path = load_or_create_key_file(server_dir)
    port = port or free_port()
    cmd = [sys.executable, "-m", "denv", *serve_argv(state, cfg, server_dir, key_path, port)]
    log_path = cluster_dir / "logs" / "server.log"
    env = {"RAY_ADDRESS": state["address"], **ray_auth.process_env(token_file(state))}
    pid = spawn(cmd, log_path, env)
    url = f"http://127.0.0.1:{port}"
    server = {"sid": pid, "url": url, "state_dir": str(server_dir), "log": str(log_path)}
    state["server"] = server
    write_state(cluster_dir, state)
    _wait_server(url, key, pid, log_path)
    return server


def serve_argv(
    state: dict[str, Any], cfg: AgentConfig, server_dir: Path, key_path: Path, port: int
) -> list[str]:
    """``denv serve``'s arguments for the cluster: it asks its agents for ``cfg``, the
    settings they were started with (an agent keeps those)."""
    argv = [
        "serve",
        f"--cluster={state['address']}",
        f"--state-dir={server_dir}",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--api-key-file={key_path}",
        f"--node-state-dir={cfg.state_root}",
        f"--node-max-envs={cfg.max_envs}",
        f"--node-max-memory={cfg.max_memory_mb}",
        f"--node-image-budget={cfg.image_budget_mb}",
    ]
    if cfg.merge_pages:
        argv.append("--merge-pages")
    if "store" in state:
        argv += [
            f"--store-endpoint={state['store']['endpoint']}",
            f"--store-bucket={state['store']['bucket']}",
            f"--store-credentials={state['store']['credentials']}",
        ]
    return argv


def restart_server(cluster_dir: Path) -> dict[str, Any]:
    """Stop ``denv serve --cluster`` (SIGTERM: as an operator would) and start it again with
    the same port, state and caps; returns once it answers ``/v1/health``."""
    cluster_dir = cluster_dir.expanduser().resolve()
    state = read_state(cluster_dir)
    if state is None or not state.get("server"):
        raise ClusterError(f"no denv serve was started from {cluster_dir}")
    stop_session(int(state["server"]["sid"]), grace_s=30.0)
    caps = state.get("caps", {})
    cfg = caps_config(cluster_dir, caps)
    port = int(state["server"]["url"].rsplit(":", 1)[1])
    server = start_server(cluster_dir, state, cfg, port)
    state["server"] = server
    write_state(cluster_dir, state)
    return server


def _wait_server(url: str, key: str, pid: int, log_path: Path) -> None:
    deadline = time.monotonic() + SERVER_START_S
    request = urllib.request.Request(f"{url}/v1/health", headers={"Authorization": f"Bearer {key}"})
    while time.monotonic() < deadline:
        if not session_pids(pid):
            raise ClusterError(f"denv serve --cluster exited: {tail(log_path)}")
        with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=2) as resp:
            if resp.status == 200:
                return
        time.sleep(0.3)
    raise ClusterError(f"denv serve --cluster did not answer within {SERVER_START_S:.0f} s")


def api_key(cluster_dir: Path) -> str:
    """The API key of the cluster's ``denv serve``, "" before it first started."""
    path = cluster_dir / "server" / "api_key"
    return path.read_text().strip() if path.exists() else ""
