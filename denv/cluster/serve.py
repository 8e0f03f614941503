"""``denv serve --cluster``: the control plane of a Ray cluster.

``denv/cli.py`` routes ``denv serve`` here when ``--cluster`` is given: the same server
(``denv.server.serve_cli``), whose envs run on the node agents of the Ray cluster at that address
(``ray_cluster``) behind one ``ClusterNode``, with versions' layers in the object store.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from denv.server import serve_cli
from denv.server.config import ServerConfig
from denv.server.docker.images import DEFAULT_BUDGET_MB
from denv.server.node.cluster.node import ClusterNode
from denv.server.node.cluster.options import ClusterSettings
from denv.server.node.seam import Node

from . import ray_auth
from .agent import AgentConfig

log = logging.getLogger(__name__)

add_arguments = serve_cli.add_arguments


def default_state_root() -> str:
    """Where each node agent keeps its state on its machine, unless --node-state-dir says."""
    return str(Path.home() / ".local" / "state" / "denv" / "nodes")


def agent_config(settings: ClusterSettings, config: ServerConfig) -> AgentConfig:
    """What every node agent gets: the server's limits and egress rules, the node caps."""
    return AgentConfig(
        state_root=settings.node_state_dir or default_state_root(),
        subnet_pool=config.subnet_pool,
        subnet_prefix=config.subnet_prefix,
        allow_private_egress=config.allow_private_egress,
        pull_credentials=config.pull_credentials,
        max_volume_mb=config.max_volume_mb,
        limits=config.limits,
        max_envs=settings.caps.max_envs,
        max_memory_mb=settings.caps.max_memory_mb,
        relay_port=settings.relay_port,
        live_netns=config.live_netns,
        merge_pages=config.merge_pages,
        isolation=config.isolation,
        image_budget_mb=(
            DEFAULT_BUDGET_MB if settings.image_budget_mb is None else settings.image_budget_mb
        ),
    )


def make_node(settings: ClusterSettings, config: ServerConfig) -> Node:
    """The cluster's nodes behind the node seam (connects to Ray; ConnectionError if it
    cannot)."""
    try:
        from . import ray_cluster
    except ImportError as exc:
        raise RuntimeError(f"--cluster needs {exc.name}: pip install 'denv[cluster]'") from exc
    check_ray_auth()
    members = ray_cluster.members_fn(settings.address, agent_config(settings, config))
    return ClusterNode(members, settings.store, settings.caps)


def check_ray_auth() -> None:
    """Refuse a token file others can read; warn when Ray runs without token authentication
    (whoever reaches its ports can then run code on every node agent)."""
    if os.environ.get(ray_auth.MODE_VAR, "").lower() != "token":
        log.warning(
            "Ray runs without token authentication: whoever reaches the cluster's ports can "
            "run code on every node agent, and no node runs an ingress relay (its key comes "
            "from the token), so only envs on this machine are reachable. Set %s=token and "
            "%s=<a 0600 file holding the cluster's token> for every Ray node and denv serve "
            "(docs/cluster.md)",
            ray_auth.MODE_VAR,
            ray_auth.PATH_VAR,
        )
        return
    path = os.environ.get(ray_auth.PATH_VAR)
    if path and not os.environ.get(ray_auth.TOKEN_VAR):
        try:
            ray_auth.check_token_file(Path(path))
        except ray_auth.TokenFileError as exc:
            raise RuntimeError(str(exc)) from exc


def main(args: argparse.Namespace) -> int:
    # The ingress reaches the envs of each node through the node's relay, proving itself
    # with the key both derive from the cluster's Ray token (``relay``).
    return serve_cli.main(args, make_node=make_node, relay_key=ray_auth.relay_key())
