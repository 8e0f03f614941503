"""``denv cluster up|status|down``: a Ray cluster of N nodes on this machine (``local``).

denv cluster up --nodes 3        # Ray nodes, node agents, SeaweedFS, denv serve --cluster
denv cluster up --isolated --image denv-echo-env:latest   # nodes that share nothing
eval "$(denv cluster up --nodes 3)"   # ... and export DENV_SERVER / DENV_API_KEY
denv cluster status [--json]     # nodes (alive, envs, spares), server, store
denv cluster down [--purge]      # stop all of it, remove the nodes' containers and mounts
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
from pathlib import Path


def default_cluster_dir() -> Path:
    return Path.home() / ".local" / "state" / "denv" / "cluster"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, help_text in (
        ("up", "start a Ray cluster of N nodes on this machine, SeaweedFS and denv serve"),
        ("status", "the cluster's nodes (alive, envs, spares), server and store"),
        ("down", "stop everything `up` started; remove the nodes' containers and mounts"),
    ):
        action = sub.add_parser(name, help=help_text, description=help_text)
        action.add_argument(
            "--state-dir",
            type=Path,
            default=None,
            help="the cluster's directory: node state, logs, server, store "
            "(default: ~/.local/state/denv/cluster)",
        )
        if name == "up":
            action.add_argument(
                "--nodes", type=int, default=3, help="Ray nodes to start (default 3)"
            )
            action.add_argument(
                "--port", type=int, default=0, help="denv serve's port (default: a free one)"
            )
            action.add_argument(
                "--node-max-envs", type=int, default=0, help="envs per node (default: no cap)"
            )
            action.add_argument(
                "--node-max-memory",
                type=int,
                default=0,
                metavar="MB",
                help="memory per node's envs (default: no cap)",
            )
            action.add_argument(
                "--node-image-budget",
                type=int,
                default=None,
                metavar="MB",
                help="disk the images a node brought (from another node or the store) may "
                "take before it removes unused ones, least recently used first "
                "(default 20480)",
            )
            action.add_argument(
                "--no-store", action="store_true", help="no SeaweedFS: versions stay on nodes"
            )
            action.add_argument(
                "--no-serve", action="store_true", help="start Ray and the agents only"
            )
            action.add_argument(
                "--isolated",
                action="store_true",
                help="nodes that share nothing: each in its own network namespace, with "
                "its own address and Docker Engine (root; docs/cluster.md)",
            )
            action.add_argument(
                "--merge-pages",
                action="store_true",
                help="live envs' memory merged by the kernel on every node, as denv serve "
                "--merge-pages (denser; costs ksmd's CPU and opens a side channel between "
                "envs: docs/hardening.md)",
            )
            action.add_argument(
                "--image",
                action="append",
                default=[],
                metavar="IMAGE",
                help="with --isolated: an image to copy from this machine's Docker Engine "
                "into every node's (repeatable)",
            )
        if name == "status":
            action.add_argument("--json", action="store_true", help="print JSON")
        if name == "down":
            action.add_argument(
                "--purge",
                action="store_true",
                help="delete the cluster's directory too (node layers, the server's database)",
            )
    ca = sub.add_parser(
        "tls-ca",
        help="make a CA for Ray's TLS on machines `up` does not start (Kubernetes: a Secret)",
        description="Make a CA (ca.crt, ca.key) for Ray's TLS in DIR (0700, the key 0600). "
        "Give it to every Ray machine or pod; each makes its own certificate with tls-cert "
        "(docs/kubernetes.md).",
    )
    ca.add_argument("--out", type=Path, required=True, metavar="DIR", help="where to write")
    cert = sub.add_parser(
        "tls-cert",
        help="make this Ray node's TLS certificate, signed by a CA of tls-ca",
        description="Make node.crt and node.key, signed by the CA in --ca, naming this "
        "node's addresses and names, in DIR beside a copy of ca.crt; then run Ray with "
        "RAY_USE_TLS=1 and RAY_TLS_SERVER_CERT, RAY_TLS_SERVER_KEY, RAY_TLS_CA_CERT naming them.",
    )
    cert.add_argument("--ca", type=Path, required=True, metavar="DIR", help="the CA's dir")
    cert.add_argument("--out", type=Path, required=True, metavar="DIR", help="where to write")
    cert.add_argument(
        "--address",
        action="append",
        default=[],
        metavar="IP",
        help="an address Ray dials this node at (repeatable; loopback is always named)",
    )
    cert.add_argument(
        "--dns",
        action="append",
        default=[],
        metavar="NAME",
        help="a DNS name Ray dials this node by, e.g. a Service's (repeatable)",
    )


def main(args: argparse.Namespace) -> int:
    if args.action in ("tls-ca", "tls-cert"):
        return _tls(args)
    try:
        from . import local
        from .processes import ClusterError
    except ImportError as exc:
        print(f"denv cluster: needs {exc.name}: pip install 'denv[cluster]'", file=sys.stderr)
        return 1
    cluster_dir = (args.state_dir or default_cluster_dir()).expanduser().resolve()
    try:
        if args.action == "up":
            return _up(cluster_dir, args)
        if args.action == "status":
            return _status(cluster_dir, args.json)
        for line in local.down(cluster_dir, purge=args.purge):
            print(f"denv cluster down: {line}", file=sys.stderr)
        print(f"denv cluster down: nothing of {cluster_dir} runs any more", file=sys.stderr)
        return 0
    except ClusterError as exc:
        print(f"denv cluster {args.action}: {exc}", file=sys.stderr)
        return 1


def _tls(args: argparse.Namespace) -> int:
    try:
        from . import ray_tls
    except ImportError as exc:
        print(f"denv cluster: needs {exc.name}: pip install 'denv[cluster]'", file=sys.stderr)
        return 1
    try:
        if args.action == "tls-ca":
            where = ray_tls.create_ca(args.out)
            print(f"denv cluster tls-ca: a CA in {where}: keep ca.key secret", file=sys.stderr)
        else:
            where = ray_tls.issue(args.ca, args.out, args.address, args.dns)
            print(f"denv cluster tls-cert: node.crt and node.key in {where}", file=sys.stderr)
    except (ray_tls.TLSError, OSError) as exc:
        print(f"denv cluster {args.action}: {exc}", file=sys.stderr)
        return 1
    return 0


def _up(cluster_dir: Path, args: argparse.Namespace) -> int:
    from . import local as lc

    print(f"denv cluster up: starting {args.nodes} nodes in {cluster_dir}", file=sys.stderr)
    # Stopped half-way (Ctrl-C, SIGTERM), up() stops what it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    state = lc.up(
        cluster_dir,
        args.nodes,
        serve=not args.no_serve,
        store=not args.no_store,
        port=args.port,
        max_envs=args.node_max_envs,
        max_memory_mb=args.node_max_memory,
        image_budget_mb=args.node_image_budget,
        isolated=args.isolated,
        images=tuple(args.image),
        merge_pages=args.merge_pages,
    )
    names = ", ".join(n["name"] for n in state["nodes"])
    print(f"denv cluster up: Ray at {state['address']}, nodes {names}", file=sys.stderr)
    if state.get("isolated"):
        iso = state["isolated"]
        where = ", ".join(f"{n} {v['ip']}" for n, v in iso["nodes"].items())
        print(
            f"denv cluster up: isolated nodes on bridge {iso['bridge']} ({iso['subnet']}): {where}",
            file=sys.stderr,
        )
    if state.get("store"):
        print(f"denv cluster up: SeaweedFS S3 at {state['store']['endpoint']}", file=sys.stderr)
    if state.get("server"):
        print(f"export DENV_SERVER={shlex.quote(state['server']['url'])}")
        print(f"export DENV_API_KEY={shlex.quote(lc.api_key(cluster_dir))}")
    print(
        f"denv cluster up: stop it with: denv cluster down --state-dir {cluster_dir}",
        file=sys.stderr,
    )
    return 0


def _status(cluster_dir: Path, as_json: bool) -> int:
    from .local_status import status

    found = status(cluster_dir)
    if as_json:
        print(json.dumps(found, indent=2))
        return 0
    if not found["running"]:
        print(f"no local cluster runs from {cluster_dir} (denv cluster up starts one)")
        return 0
    print(f"cluster {cluster_dir}  Ray {found['address']}")
    server, store = found.get("server"), found.get("store")
    if server:
        print(f"server  {server['url']}  {'running' if server['running'] else 'stopped'}")
    if store:
        print(f"store   {store['endpoint']}")
    if found.get("isolated"):
        print("nodes   isolated: each in its own network namespace with its own Docker Engine")
    print(f"{'NODE':<8}{'STATE':<8}{'ENVS':>6}{'SPARES':>8}{'MEMORY':>10}  RELAY")
    for node in found["nodes"]:
        state = "alive" if node["alive"] else "dead"
        name = node["name"] + (" *" if node["head"] else "")
        memory = f"{node['memory_mb']} MiB"
        relay = node.get("relay") or "-"
        print(f"{name:<8}{state:<8}{node['envs']:>6}{node['spares']:>8}{memory:>10}  {relay}")
    return 0
