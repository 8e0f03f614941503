"""``denv serve``: run the local denv server.

    denv serve [--host 127.0.0.1] [--port 7711] [--state-dir DIR] [--api-key-file PATH]
               [--max-envs-per-key 64] [--max-volume-mb 10240]
               [--env-memory MIB] [--env-pids N] [--env-cpus N] [--env-cap-add CAP]
               [--allow-image PATTERN ...] [--pull-credentials]
               [--warm-max-spares 32] [--warm-max-memory MIB]
               [--warm-min-free-memory 1024] [--warm-idle-minutes 10]
               [--subnet-pool 10.213.0.0/16] [--subnet-size 27]
               [--max-creates-per-key 8] [--max-starting-per-key 16] [--max-waits-per-key 64]
               [--max-versions-per-key 10000] [--max-spares-per-key 16]
               [--max-ingress-per-key 256] [--ingress-read-timeout 600]
               [--tls-cert PEM --tls-key PEM] [--insecure]
               [--allow-private-egress]

``--port 0`` picks a free port; the real URL is written to ``<state_dir>/server.json``.
The API key comes from ``--api-key-file``, else ``$DENV_API_KEY``, else ``<state_dir>/api_key``
(made on first start); never from the command line, where ``ps`` shows it to every user.
Beyond loopback the server needs TLS (``--tls-cert/--tls-key``) or ``--insecure``; the
per-key caps (``fairness``) answer 429 with Retry-After (docs/hardening.md).
"""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from denv.local import ENV_API_KEY, read_local_server
from denv.local import state_dir as default_state_dir
from denv.server.api import tls
from denv.server.config import (
    DEFAULT_HOST,
    DEFAULT_LIMITS,
    DEFAULT_MAX_ENVS_PER_KEY,
    DEFAULT_MAX_VOLUME_MB,
    DEFAULT_PORT,
    DEFAULT_SUBNET_POOL,
    DEFAULT_SUBNET_PREFIX,
    DEFAULT_WARM_IDLE_S,
    DEFAULT_WARM_MAX_MEMORY_MB,
    DEFAULT_WARM_MAX_SPARES,
    DEFAULT_WARM_MIN_FREE_MB,
    ServerConfig,
)
from denv.server.lifecycle import fairness
from denv.server.net.subnets import parse_pool
from denv.server.node.cluster import options as clusteropts
from denv.server.node.seam import Node
from denv.server.records import Limits

#: Linux capabilities by Docker's name (without CAP_), for --env-cap-add.
LINUX_CAPABILITIES = frozenset(
    [
        "AUDIT_CONTROL",
        "AUDIT_READ",
        "AUDIT_WRITE",
        "BLOCK_SUSPEND",
        "BPF",
        "CHECKPOINT_RESTORE",
        "CHOWN",
        "DAC_OVERRIDE",
        "DAC_READ_SEARCH",
        "FOWNER",
        "FSETID",
        "IPC_LOCK",
        "IPC_OWNER",
        "KILL",
        "LEASE",
        "LINUX_IMMUTABLE",
        "MAC_ADMIN",
        "MAC_OVERRIDE",
        "MKNOD",
        "NET_ADMIN",
        "NET_BIND_SERVICE",
        "NET_BROADCAST",
        "NET_RAW",
        "PERFMON",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_ADMIN",
        "SYS_BOOT",
        "SYS_CHROOT",
        "SYS_MODULE",
        "SYS_NICE",
        "SYS_PACCT",
        "SYS_PTRACE",
        "SYS_RAWIO",
        "SYS_RESOURCE",
        "SYS_TIME",
        "SYS_TTY_CONFIG",
        "SYSLOG",
        "WAKE_ALARM",
    ]
)

log = logging.getLogger("denv.server")

# Builds the node of a cluster (``denv.cluster.serve``): its settings, the server's config.
NodeFactory = Callable[[clusteropts.ClusterSettings, ServerConfig], Node]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``denv serve``."""
    parser.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help="address to bind (default %(default)s: this machine only)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help="port to bind; 0 picks a free one (default %(default)s)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="where the database, API key and volumes live "
        "(default $DENV_STATE_DIR or ~/.local/share/denv)",
    )
    parser.add_argument(
        "--api-key-file",
        type=Path,
        default=None,
        help="a file holding the API key to accept (default: $DENV_API_KEY, else the one in "
        "<state-dir>/api_key, made on first start)",
    )
    parser.add_argument(
        "--max-envs-per-key",
        type=int,
        default=DEFAULT_MAX_ENVS_PER_KEY,
        help="live envs allowed per API key (default %(default)s)",
    )
    parser.add_argument(
        "--max-volume-mb",
        type=int,
        default=DEFAULT_MAX_VOLUME_MB,
        metavar="MIB",
        help="what an env may write to each of its volumes (a filesystem of this size: past "
        "it, writes fail with ENOSPC inside the env); 0: no limit (default %(default)s)",
    )
    parser.add_argument(
        "--env-memory",
        type=int,
        default=DEFAULT_LIMITS.memory_mb,
        metavar="MIB",
        help="memory of each container of an env; past it the env fails 'out of memory'; "
        "0: no limit (default %(default)s)",
    )
    parser.add_argument(
        "--env-pids",
        type=int,
        default=DEFAULT_LIMITS.pids,
        metavar="N",
        help="processes and threads of each container of an env; 0: no limit (default %(default)s)",
    )
    parser.add_argument(
        "--env-cpus",
        type=float,
        default=DEFAULT_LIMITS.cpus,
        metavar="N",
        help="CPUs each container of an env may use (a quota); 0: no limit (default %(default)g)",
    )
    parser.add_argument(
        "--allow-private-egress",
        action="store_true",
        help="let egress-allow envs reach this host, link-local (169.254/16, fe80::/10) and "
        "private networks (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7), and let "
        "allowlists name them (host.docker.internal, a private CIDR); refused by default",
    )
    parser.add_argument(
        "--env-cap-add",
        action="append",
        default=[],
        metavar="CAP",
        help="a Linux capability to grant env containers besides DAC_OVERRIDE (every other is "
        "dropped), e.g. SETUID for an entrypoint that switches user; repeatable",
    )
    parser.add_argument(
        "--allow-image",
        action="append",
        default=[],
        metavar="PATTERN",
        help="run only images matching one of these globs (e.g. 'denv-*', "
        "'ghcr.io/acme/**'; * stops at '/'); repeatable; default: every image",
    )
    parser.add_argument(
        "--pull-credentials",
        action="store_true",
        help="let pull: true use this machine's registry credentials (~/.docker/config.json); "
        "by default pulls are anonymous",
    )
    parser.add_argument(
        "--warm-max-spares",
        type=int,
        default=DEFAULT_WARM_MAX_SPARES,
        help="booted spares kept for warm forks, all pools together (default %(default)s)",
    )
    parser.add_argument(
        "--warm-max-memory",
        type=int,
        default=DEFAULT_WARM_MAX_MEMORY_MB,
        metavar="MIB",
        help="memory of all spares together, as measured; 0: no cap but --warm-min-free-memory "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--warm-min-free-memory",
        type=int,
        default=DEFAULT_WARM_MIN_FREE_MB,
        metavar="MIB",
        help="boot no spare that would leave less memory available (default %(default)s)",
    )
    parser.add_argument(
        "--warm-idle-minutes",
        type=float,
        default=DEFAULT_WARM_IDLE_S / 60,
        help="reap a warm pool nobody took a spare from for this long (default %(default)g)",
    )
    parser.add_argument(
        "--subnet-pool",
        default=DEFAULT_SUBNET_POOL,
        help="IPv4 range the env networks' subnets are carved from; pick one no network of "
        "this host uses (default %(default)s)",
    )
    parser.add_argument(
        "--subnet-size",
        type=int,
        default=DEFAULT_SUBNET_PREFIX,
        metavar="PREFIX",
        help="prefix length of each env network's subnet (default /%(default)s: 30 addresses)",
    )
    parser.add_argument(
        "--public-url",
        default="",
        metavar="URL",
        help="the URL clients reach this server at, when it is not the address it listens "
        "on (a proxy, a load balancer, a Kubernetes Service): ingress URLs start with it",
    )
    fairness.add_arguments(parser)
    tls.add_arguments(parser)
    clusteropts.add_arguments(parser)
    parser.add_argument("--log-level", default="INFO", help="default %(default)s")


def _given_key(path: Path | None) -> str:
    """The key of ``--api-key-file``, else of ``$DENV_API_KEY``; "" when neither is set."""
    if path is not None:
        return path.read_text().strip()
    return os.environ.get(ENV_API_KEY, "").strip()


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _setup_logging(state_dir: Path, level: str) -> None:
    handler = logging.handlers.RotatingFileHandler(
        state_dir / "server.log", maxBytes=10 * 1024 * 1024, backupCount=2
    )
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(fmt)
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setFormatter(fmt)
    root = logging.getLogger()
    root.handlers = [handler, stderr]
    root.setLevel(level.upper())


def main(args: argparse.Namespace, make_node: NodeFactory | None = None) -> int:
    """Run the server until interrupted; returns the process exit code.

    ``make_node`` builds the node that runs envs from the cluster settings (``denv serve
    --cluster`` routes through ``denv.cluster.serve``, which passes it); without it, this
    machine's Docker Engine."""
    import uvicorn

    from denv.server.app import create_app
    from denv.server.auth import load_or_create_key_file, private_dir

    try:
        parse_pool(args.subnet_pool, args.subnet_size)
    except ValueError as exc:
        print(f"denv serve: {exc}", file=sys.stderr)
        return 2
    problem = tls.check(args)
    if problem is not None:
        print(f"denv serve: {problem}", file=sys.stderr)
        return 2
    try:
        fair = fairness.config_fields(args)
        cluster = clusteropts.settings(args)
    except ValueError as exc:
        print(f"denv serve: {exc}", file=sys.stderr)
        return 2
    if cluster is not None and make_node is None:
        print(
            "denv serve: --cluster needs the cluster package: run it as `denv serve --cluster "
            "...` (pip install 'denv[cluster]')",
            file=sys.stderr,
        )
        return 2
    if min(args.env_memory, args.env_pids, args.env_cpus) < 0:
        print("denv serve: --env-memory, --env-pids and --env-cpus are >= 0", file=sys.stderr)
        return 2
    if args.public_url and not args.public_url.startswith(("http://", "https://")):
        print(
            f"denv serve: --public-url {args.public_url!r}: give a URL starting with http:// "
            "or https://, e.g. https://denv.example.org",
            file=sys.stderr,
        )
        return 2
    if any(not p.strip() for p in args.allow_image):
        print("denv serve: --allow-image needs a pattern, e.g. 'denv-*'", file=sys.stderr)
        return 2
    extra_caps = [c.upper().removeprefix("CAP_") for c in args.env_cap_add]
    unknown = [c for c in extra_caps if c not in LINUX_CAPABILITIES]
    if unknown:
        print(
            f"denv serve: --env-cap-add {', '.join(unknown)}: not a Linux capability "
            f"(one of {', '.join(sorted(LINUX_CAPABILITIES))})",
            file=sys.stderr,
        )
        return 2
    try:
        given = _given_key(args.api_key_file)
    except OSError as exc:
        print(f"denv serve: cannot read --api-key-file: {exc}", file=sys.stderr)
        return 2
    state_dir: Path = default_state_dir(args.state_dir).resolve()
    private_dir(state_dir)
    _setup_logging(state_dir, args.log_level)
    running = read_local_server(state_dir)
    if running is not None:
        print(
            f"denv serve: a server for {state_dir} already runs at {running.url}", file=sys.stderr
        )
        return 1
    key_path = state_dir / "api_key"
    if given:
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(given + "\n")
        os.chmod(key_path, 0o600)  # an older file may have had another mode
        key = given
    else:
        key, key_path = load_or_create_key_file(state_dir)
    try:
        sock = _bind(args.host, args.port)
    except OSError as exc:
        print(
            f"denv serve: cannot listen on {args.host}:{args.port} ({exc.strerror}): "
            "pick another --port, or 0 for a free one",
            file=sys.stderr,
        )
        return 1
    port = int(sock.getsockname()[1])
    config = ServerConfig(
        state_dir=state_dir,
        api_key=key,
        host=args.host,
        port=port,
        max_envs_per_key=args.max_envs_per_key,
        max_volume_mb=args.max_volume_mb,
        limits=Limits(
            memory_mb=args.env_memory,
            pids=args.env_pids,
            cpus=args.env_cpus,
            capabilities=tuple(dict.fromkeys([*DEFAULT_LIMITS.capabilities, *extra_caps])),
        ),
        allow_images=tuple(args.allow_image),
        pull_credentials=args.pull_credentials,
        warm_max_spares=args.warm_max_spares,
        warm_max_memory_mb=args.warm_max_memory,
        warm_min_free_mb=args.warm_min_free_memory,
        warm_idle_s=args.warm_idle_minutes * 60,
        subnet_pool=args.subnet_pool,
        subnet_prefix=args.subnet_size,
        scheme="https" if args.tls_cert else "http",
        base_url=args.public_url,
        **fair,
        allow_private_egress=args.allow_private_egress,
    )
    try:
        node = make_node(cluster, config) if cluster is not None and make_node else None
        app = create_app(config, node)
    except (OSError, ConnectionError, RuntimeError) as exc:
        print(f"denv serve: {exc}", file=sys.stderr)
        return 1
    print(f"denv serve: listening at {config.public_url()}; API key in {key_path}", flush=True)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=5,
            ssl_certfile=args.tls_cert,
            ssl_keyfile=args.tls_key,
        )
    )
    server.run(sockets=[sock])
    return 0


def run(argv: list[str] | None = None) -> int:
    """``python -m denv.server [serve] ...``."""
    parser = argparse.ArgumentParser(
        prog="denv serve", description="Run the local denv server.", allow_abbrev=False
    )
    add_arguments(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    return main(parser.parse_args(argv))
