"""``denv serve``: run the local denv server.

    denv serve [--host 127.0.0.1] [--port 7711] [--state-dir DIR] [--api-key-file PATH]
               [--max-envs-per-key 64] [--max-volume-mb 10240]
               [--max-disk-per-key 50G] [--min-free-disk 2G]
               [--version-grace 600] [--gc-interval 60]
               [--env-memory MIB] [--env-pids N] [--env-cpus N] [--env-cap-add CAP]
               [--allow-image PATTERN ...] [--pull-credentials]
               [--warm-max-spares 32] [--warm-max-memory MIB]
               [--warm-min-free-memory 1024] [--warm-idle-minutes 10] [--no-zygotes]
               [--subnet-pool 10.213.0.0/16] [--subnet-size 27]
               [--max-creates-per-key 8] [--max-starting-per-key 16] [--max-waits-per-key 64]
               [--max-versions-per-key 10000] [--max-spares-per-key 16]
               [--max-ingress-per-key 256] [--ingress-read-timeout 600]
               [--ws-idle-timeout 600] [--max-waits 128] [--max-leases-per-key 1024]
               [--tls-cert PEM --tls-key PEM] [--insecure]
               [--allow-private-egress] [--merge-pages]

``--port 0`` picks a free port; the real URL is written to ``<state_dir>/server.json``.
The API key comes from ``--api-key-file``, else ``$DENV_API_KEY``, else ``<state_dir>/api_key``
(made on first start); never from the command line, where ``ps`` shows it to every user.
Beyond loopback the server needs TLS (``--tls-cert/--tls-key``) or ``--insecure``; the
per-key caps (``fairness``) answer 429 with Retry-After (docs/hardening.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import logging.handlers
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from denv.cli_parser import CommandParser
from denv.local import read_local_server
from denv.redaction import RedactSecrets
from denv.server.config import ServerConfig
from denv.server.node.cluster import options as clusteropts
from denv.server.node.seam import Node
from denv.server.serve_options import add_arguments, config_from_args

# add_arguments is part of this module's surface: denv.cluster.serve builds its parser with it.
__all__ = ["NodeFactory", "add_arguments", "main", "run", "setup_logging"]

log = logging.getLogger("denv.server")

# Builds the node of a cluster (``denv.cluster.serve``): its settings, the server's config.
NodeFactory = Callable[[clusteropts.ClusterSettings, ServerConfig], Node]


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says
    # TCP, and without it a kept-alive connection's response (headers, then body: two
    # writes) waited ~40 ms for the client's delayed ACK on every request after the first.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def setup_logging(state_dir: Path, level: str) -> None:
    """server.log (rotated) and stderr. Every record, from any logger, passes
    ``RedactSecrets`` on its way to either: ingress tokens become a prefix of their digest,
    keys and credential headers ``***`` (uvicorn's lines, error paths, tracebacks, DEBUG
    handshakes)."""
    handler = logging.handlers.RotatingFileHandler(
        state_dir / "server.log", maxBytes=10 * 1024 * 1024, backupCount=2
    )
    stderr = logging.StreamHandler(sys.stderr)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    redact = RedactSecrets()
    for h in (handler, stderr):
        h.setFormatter(fmt)
        h.addFilter(redact)
    root = logging.getLogger()
    root.handlers = [handler, stderr]
    root.setLevel(level.upper())


def main(
    args: argparse.Namespace,
    make_node: NodeFactory | None = None,
    relay_key: bytes | None = None,
) -> int:
    """Run the server until interrupted; returns the process exit code.

    ``make_node`` builds the node that runs envs from the cluster settings (``denv serve
    --cluster`` routes through ``denv.cluster.serve``, which passes it and the key that
    proves the ingress to the nodes' relays); without it, this machine's Docker Engine."""
    import uvicorn

    from denv.server.app import create_app
    from denv.server.auth import load_or_create_key_file, private_dir
    from denv.server.ingress.pings import PingAwareProtocol

    try:
        config = config_from_args(args, cluster_package=make_node is not None)
        # Checked by config_from_args; asked again for the node factory (a ValueError only
        # if the --store-credentials file changed in between).
        cluster = clusteropts.settings(args)
    except ValueError as exc:  # a UsageError is one
        print(f"denv serve: {exc}", file=sys.stderr)
        return 2
    state_dir: Path = config.state_dir
    private_dir(state_dir)
    setup_logging(state_dir, args.log_level)
    running = read_local_server(state_dir)
    if running is not None:
        print(
            f"denv serve: a server for {state_dir} already runs at {running.url}", file=sys.stderr
        )
        return 1
    key_path = state_dir / "api_key"
    given = config.api_key
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
    config = dataclasses.replace(config, api_key=key, port=port)
    try:
        node = make_node(cluster, config) if cluster is not None and make_node else None
        app = create_app(config, node, relay_key if node is not None else None)
    except (OSError, ConnectionError, RuntimeError) as exc:
        print(f"denv serve: {exc}", file=sys.stderr)
        return 1
    print(f"denv serve: listening at {config.public_url()}; API key in {key_path}", flush=True)
    server = _draining_server(
        uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="on",
            # asyncio's loop and h11, whatever else the venv has (uvloop and httptools come
            # with uvicorn[standard], which OpenEnv envs depend on): the server runs the same
            # everywhere, as it is tested
            loop="asyncio",
            http="h11",
            ws=PingAwareProtocol,  # a client's pings keep its WebSocket through ingress open
            timeout_graceful_shutdown=5,
            ssl_certfile=args.tls_cert,
            ssl_keyfile=args.tls_key,
        ),
        app.state.service.leases.drain,
    )
    server.run(sockets=[sock])
    return 0


def _draining_server(config: Any, on_stop: Callable[[], None]) -> Any:
    """uvicorn's server, telling the app at the first stop signal (``on_stop``): from then
    on it refuses new connections while the requests in flight finish (up to 5 s), so no
    client can renew its lease, and no lease may expire for that (``Leases.drain``)."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            on_stop()
            super().handle_exit(sig, frame)

    return Server(config)


def run(argv: list[str] | None = None) -> int:
    """``python -m denv.server [serve] ...``."""
    parser = CommandParser(
        prog="denv serve", description="Run the local denv server.", allow_abbrev=False
    )
    add_arguments(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    return main(parser.parse_args(argv))
