"""The options of ``denv serve`` and the ``ServerConfig`` they make (``config_from_args``).

Everything about the command line that can be checked before the server touches its state
dir: each bad option, or combination, is a ``UsageError`` carrying the message that names
it and the fix; ``serve_cli.main`` prints it and exits 2, and does the rest (the state dir, the
API key file, the socket). Kept apart from ``serve_cli`` so the checks can be called, and tested,
without running a server.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from denv.local import ENV_API_KEY
from denv.local import state_dir as default_state_dir
from denv.server.api import tls
from denv.server.config import (
    DEFAULT_HOST,
    DEFAULT_LEASE_TIMEOUT_S,
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
    MAX_LEASE_TIMEOUT_S,
    MIN_LEASE_TIMEOUT_S,
    ServerConfig,
)
from denv.server.lifecycle import disk, fairness
from denv.server.net.subnets import parse_pool
from denv.server.node.cluster import options as clusteropts
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


class UsageError(ValueError):
    """Options of ``denv serve`` that cannot run a server; ``message`` names the option and
    the fix. ``serve_cli.main`` prints it after ``denv serve: `` and exits 2 (argparse's code for a
    usage error)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


ENV_LIVE_NETNS = "DENV_LIVE_NETNS"  # the default of --live-netns (on, off)
ENV_ISOLATION = "DENV_ISOLATION"  # the default of --isolation
ISOLATIONS = ("runc", "gvisor")


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
        "--zygotes",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep one idle, booted live root per API key and image configuration, and "
        "answer live creates with a copy of it (reaped like a warm pool, within the warm "
        "limits; default on)",
    )
    parser.add_argument(
        "--live-netns",
        choices=("on", "off"),
        default=os.environ.get(ENV_LIVE_NETNS, "on"),
        help="run each live child in a network namespace of its own, behind a bridge in its "
        "container (its own address; siblings, parent and other envs cannot reach its "
        "ports); off: children share their container's, kept off each other's ports by "
        f"per-port rules (default ${ENV_LIVE_NETNS}, else on)",
    )
    parser.add_argument(
        "--isolation",
        choices=ISOLATIONS,
        default=os.environ.get(ENV_ISOLATION, "runc"),
        help="what each env runs in: runc, namespaces and cgroups on this machine's kernel "
        "(Docker's default); gvisor, a gVisor sandbox with a kernel of its own (apt-get install "
        "runsc, then denv gvisor install; slower to start, no live forks: docs/isolation.md) "
        f"(default ${ENV_ISOLATION}, else runc)",
    )
    parser.add_argument(
        "--merge-pages",
        action="store_true",
        help="have live envs' memory merged by the kernel where it holds the same bytes "
        "(KSM; turned on at start if off): a live child keeps ~2 MB to itself in place of "
        "~16 MB, at ksmd's CPU; envs on this machine can then time each other's pages, so "
        "only where they trust each other (docs/live-forks.md)",
    )
    parser.add_argument(
        "--lease-timeout",
        type=float,
        default=DEFAULT_LEASE_TIMEOUT_S,
        metavar="SECONDS",
        help="delete a client's envs once its lease goes this long without a renewal (the "
        "client died, was paused or lost the network), unless it asked for another "
        f"timeout ({MIN_LEASE_TIMEOUT_S:g}-{MAX_LEASE_TIMEOUT_S:g}; default %(default)g)",
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
    disk.add_arguments(parser)
    fairness.add_arguments(parser)
    tls.add_arguments(parser)
    clusteropts.add_arguments(parser)
    parser.add_argument("--log-level", default="INFO", help="default %(default)s")


def _given_key(path: Path | None) -> str:
    """The key of ``--api-key-file``, else of ``$DENV_API_KEY``; "" when neither is set."""
    if path is not None:
        return path.read_text().strip()
    return os.environ.get(ENV_API_KEY, "").strip()


def config_from_args(args: argparse.Namespace, *, cluster_package: bool = False) -> ServerConfig:
    """The server's config from parsed ``denv serve`` options; ``UsageError`` for the first
    option that does not fit, checked in a fixed order.

    ``cluster_package``: whether the caller can run ``--cluster`` (``denv.cluster.serve``).
    ``api_key`` is the given one (``--api-key-file``, else ``$DENV_API_KEY``), "" when there
    is none, and ``port`` is ``--port`` as given: ``serve_cli.main`` fills both in once the state
    dir's key file is read and the socket bound.

        config_from_args(parser.parse_args(["--env-memory", "-1"]))
        # UsageError: --env-memory, --env-pids and --env-cpus are >= 0
    """
    try:
        parse_pool(args.subnet_pool, args.subnet_size)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    problem = tls.check(args)
    if problem is not None:
        raise UsageError(problem)
    try:
        fair = fairness.config_fields(args)
        budget = disk.config_fields(args)
        cluster = clusteropts.settings(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if cluster is not None and not cluster_package:
        raise UsageError(
            "--cluster needs the cluster package: run it as `denv serve --cluster "
            "...` (pip install 'denv[cluster]')"
        )
    if args.live_netns not in ("on", "off"):
        raise UsageError(f"--live-netns (or ${ENV_LIVE_NETNS}) {args.live_netns!r}: give on or off")
    if args.isolation not in ISOLATIONS:
        raise UsageError(
            f"--isolation (or ${ENV_ISOLATION}) {args.isolation!r}: give runc or gvisor"
        )
    if args.isolation == "gvisor" and args.merge_pages:
        raise UsageError("--merge-pages merges live envs' memory, and --isolation gvisor runs none")
    if min(args.env_memory, args.env_pids, args.env_cpus) < 0:
        raise UsageError("--env-memory, --env-pids and --env-cpus are >= 0")
    if args.public_url and not args.public_url.startswith(("http://", "https://")):
        raise UsageError(
            f"--public-url {args.public_url!r}: give a URL starting with http:// "
            "or https://, e.g. https://denv.example.org"
        )
    if not MIN_LEASE_TIMEOUT_S <= args.lease_timeout <= MAX_LEASE_TIMEOUT_S:
        raise UsageError(
            f"--lease-timeout {args.lease_timeout:g}: give seconds from "
            f"{MIN_LEASE_TIMEOUT_S:g} to {MAX_LEASE_TIMEOUT_S:g}"
        )
    if any(not p.strip() for p in args.allow_image):
        raise UsageError("--allow-image needs a pattern, e.g. 'denv-*'")
    extra_caps = [c.upper().removeprefix("CAP_") for c in args.env_cap_add]
    unknown = [c for c in extra_caps if c not in LINUX_CAPABILITIES]
    if unknown:
        raise UsageError(
            f"--env-cap-add {', '.join(unknown)}: not a Linux capability "
            f"(one of {', '.join(sorted(LINUX_CAPABILITIES))})"
        )
    try:
        given = _given_key(args.api_key_file)
    except OSError as exc:
        # Not the path: a key given where its file belongs would be echoed.
        raise UsageError(
            f"cannot read the file given to --api-key-file ({exc.strerror}): give the path "
            "of a file holding the key (mode 0600), or set $DENV_API_KEY"
        ) from None
    return ServerConfig(
        state_dir=default_state_dir(args.state_dir).resolve(),
        api_key=given,
        host=args.host,
        port=args.port,
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
        zygotes=args.zygotes,
        live_netns=args.live_netns == "on",
        merge_pages=args.merge_pages,
        isolation=args.isolation,
        lease_timeout_s=args.lease_timeout,
        subnet_pool=args.subnet_pool,
        subnet_prefix=args.subnet_size,
        scheme="https" if args.tls_cert else "http",
        base_url=args.public_url,
        **fair,
        **budget,
        allow_private_egress=args.allow_private_egress,
    )
