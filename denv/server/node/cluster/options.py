"""The options of ``denv serve --cluster``: where the Ray cluster is, the object store, caps.

    denv serve --cluster auto --store-endpoint http://127.0.0.1:8333 \\
        --store-bucket denv-layers --store-credentials s3.json --node-max-envs 64

Without ``--cluster`` the server runs envs on this machine's Docker Engine. With it, the
node agents of a Ray cluster run them (``denv.cluster``) and versions' layers are uploaded to
the S3-compatible store. The store's keys come from a file (``{"access_key": ...,
"secret_key": ...}``), never from argv where the process list shows them.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when a cluster is asked for: `denv serve` alone needs neither
    from denv.server.config import ObjectStoreConfig
    from denv.server.node.cluster.placement import NodeCaps

DEFAULT_BUCKET = "denv-layers"


@dataclass(frozen=True)
class ClusterSettings:
    """Where the cluster is and what each of its nodes gets."""

    address: str  # a Ray address, or "auto"
    store: ObjectStoreConfig | None
    caps: NodeCaps
    node_state_dir: str = ""  # each node agent's state dir on its machine ("": its default)
    relay_port: int = 0  # each node's ingress relay port (0: a free one, kept across restarts)
    image_budget_mb: int | None = None  # the images a node brought, kept up to (None: default)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("cluster (see docs/cluster.md)")
    group.add_argument(
        "--cluster",
        default=None,
        metavar="ADDRESS",
        help="run envs on the node agents of a Ray cluster: its address (host:port), or "
        "'auto' for the cluster this machine is part of; needs pip install 'denv[cluster]'",
    )
    group.add_argument(
        "--store-endpoint",
        default=None,
        metavar="URL",
        help="S3-compatible object storage for versions' layers (e.g. SeaweedFS, MinIO, S3); "
        "without it versions live only on the node that made them",
    )
    group.add_argument(
        "--store-bucket", default=DEFAULT_BUCKET, metavar="NAME", help="default %(default)s"
    )
    group.add_argument(
        "--store-credentials",
        type=Path,
        default=None,
        metavar="FILE",
        help='a JSON file {"access_key": ..., "secret_key": ...} for --store-endpoint',
    )
    group.add_argument(
        "--node-max-envs",
        type=int,
        default=0,
        metavar="N",
        help="envs one node runs at once; past it on every node, 429 (default: no cap)",
    )
    group.add_argument(
        "--node-max-memory",
        type=int,
        default=0,
        metavar="MB",
        help="memory one node's envs may use before it takes no more (default: no cap)",
    )
    group.add_argument(
        "--node-live-reserve",
        type=int,
        default=None,
        metavar="N",
        help="with --node-max-envs: a live env (and a zygote) is placed on a node with room "
        "for it and N live children, when one has; else on the node with the most room "
        "(default 8)",
    )
    group.add_argument(
        "--node-image-budget",
        type=int,
        default=None,
        metavar="MB",
        help="disk the images a node brought (from another node or the store) may take "
        "before it removes unused ones, least recently used first (default 20480)",
    )
    group.add_argument(
        "--node-state-dir",
        default="",
        metavar="DIR",
        help="each node agent's state dir (layers, volumes) on its own machine "
        "(default: ~/.local/state/denv/node-NAME)",
    )
    group.add_argument(
        "--node-relay-port",
        type=int,
        default=0,
        metavar="PORT",
        help="the port of each node's ingress relay, on the node's address (default: a free "
        "one, kept across agent restarts); open it to the control plane only",
    )


def settings(args: argparse.Namespace) -> ClusterSettings | None:
    """The cluster settings of ``args``; None without ``--cluster``. ValueError naming the
    option and the fix when they do not fit together."""
    if args.cluster is None:
        for flag, given in (
            ("--store-endpoint", args.store_endpoint),
            ("--store-credentials", args.store_credentials),
            ("--node-max-envs", args.node_max_envs),
            ("--node-max-memory", args.node_max_memory),
            ("--node-live-reserve", args.node_live_reserve is not None),
            ("--node-state-dir", args.node_state_dir),
            ("--node-relay-port", args.node_relay_port),
            ("--node-image-budget", args.node_image_budget is not None),
        ):
            if given:
                raise ValueError(f"{flag} is an option of a cluster: add --cluster ADDRESS")
        return None
    from denv.server.config import ObjectStoreConfig
    from denv.server.node.cluster.placement import DEFAULT_LIVE_RESERVE, NodeCaps

    if args.node_max_envs < 0 or args.node_max_memory < 0:
        raise ValueError("--node-max-envs and --node-max-memory are >= 0 (0: no cap)")
    reserve = DEFAULT_LIVE_RESERVE if args.node_live_reserve is None else args.node_live_reserve
    if reserve < 0:
        raise ValueError("--node-live-reserve is >= 0 (0: place live envs as any env)")
    if args.node_image_budget is not None and args.node_image_budget < 0:
        raise ValueError("--node-image-budget is >= 0 MB (0: keep no unused brought image)")
    if not 0 <= args.node_relay_port < 65536:
        raise ValueError("--node-relay-port is a TCP port (1-65535), or 0 for a free one")
    store = None
    if args.store_endpoint:
        if args.store_credentials is None:
            raise ValueError(
                "--store-endpoint needs --store-credentials FILE "
                '(a JSON file {"access_key": ..., "secret_key": ...})'
            )
        try:
            keys = json.loads(args.store_credentials.read_text())
            access, secret = str(keys["access_key"]), str(keys["secret_key"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(
                f"--store-credentials {args.store_credentials}: cannot read access_key and "
                f'secret_key from it ({exc}); write {{"access_key": ..., "secret_key": ...}}'
            ) from exc
        store = ObjectStoreConfig(
            endpoint=args.store_endpoint,
            bucket=args.store_bucket,
            access_key=access,
            secret_key=secret,
        )
    elif args.store_credentials is not None:
        raise ValueError("--store-credentials without --store-endpoint: add the store's URL")
    return ClusterSettings(
        address=args.cluster,
        store=store,
        caps=NodeCaps(
            max_envs=args.node_max_envs,
            max_memory_mb=args.node_max_memory,
            live_reserve=reserve,
        ),
        node_state_dir=args.node_state_dir,
        relay_port=args.node_relay_port,
        image_budget_mb=args.node_image_budget,
    )
