"""Server configuration and the limits of the contract, in one place."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from denv.server.records import Limits

MIB = 1024 * 1024

DEFAULT_SUBNET_POOL = "10.213.0.0/16"  # env networks' subnets are carved from here
DEFAULT_SUBNET_PREFIX = 27

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7711
DEFAULT_MAX_ENVS_PER_KEY = 64
DEFAULT_MAX_VOLUME_MB = 10240  # what a volume may have changed when it is snapshotted; 0: none

# Disk (lifecycle/disk.py, lifecycle/collect.py); each is a `denv serve` flag, 0: none.
DEFAULT_MAX_DISK_PER_KEY_MB = 50 * 1024  # a key's version layers and env volumes together
DEFAULT_MIN_FREE_DISK_MB = 2048  # creates that add disk stop while less than this is free
DEFAULT_VERSION_GRACE_S = 600.0  # a sandbox's or fork's version outlives its last use so long
DEFAULT_GC_INTERVAL_S = 60.0  # how often the server collects expired versions on its own

MAX_COUNT = 32  # envs per fork / create-from-version request
MAX_BODY_BYTES = 1024 * 1024
# Every JSON body of the API is checked against these before it is parsed (json_limits):
# the contract's largest body nests 3 deep and holds a few hundred values.
MAX_JSON_DEPTH = 32
MAX_JSON_VALUES = 10000  # arrays, objects, keys and scalars together
MAX_JSON_STRING_CHARS = 262144  # a compose file, the contract's longest string
MAX_JSON_NUMBER_CHARS = 64
LAYER_DEPTH_LIMIT = 8  # past this many layers a volume's stack is merged into one
HEALTH_POLL_S = 0.02  # how often the agent's health path is polled while starting
EXIT_CHECK_EVERY = 10  # check that the container still runs every N health polls
LOG_TAIL_LINES = 50  # log lines kept in a failed env's error
REAPER_INTERVAL_S = 5.0
# Leases (lifecycle/leases.py): a client's envs are deleted once it stops renewing.
DEFAULT_LEASE_TIMEOUT_S = 15.0  # `denv serve --lease-timeout`; clients renew every third
MIN_LEASE_TIMEOUT_S = 5.0  # the contract's LeaseCreate.timeout_s bounds
MAX_LEASE_TIMEOUT_S = 600.0
LEASE_CHECK_S = 1.0  # how often ended leases are looked for (one indexed query)
LEASE_DELETE_WORKERS = 8  # envs of ended leases deleted at once
# An ended lease is kept this long, so a client back from a long pause is told it expired
# (409) rather than that it never existed (404): the longest ttl_s.
LEASE_KEEP_S = 7 * 24 * 3600.0
HOST_GUARD_CHECK_S = 5.0  # a firewall reload removes the guard: put it back this soon
IDEMPOTENCY_TTL_S = 24 * 3600
DOCKER_TIMEOUT_S = 120
START_WORKERS = 64  # threads that start envs (fork(n) starts its children in parallel)

# Fairness per API key (fairness.py); each is a `denv serve` flag, 0: no cap.
DEFAULT_MAX_STARTING_PER_KEY = 16  # envs being created or started at once
DEFAULT_MAX_CREATES_PER_KEY = 8  # create, fork, snapshot and deploy requests in flight
DEFAULT_MAX_WAITS_PER_KEY = 64  # open waits: a provider waits for each child of a fork(32)
# Open waits of all keys together: each holds one of the API's 256 worker threads while it
# waits (app.py's executor), so waits never take more than half of them.
DEFAULT_MAX_WAITS = 128
DEFAULT_MAX_VERSIONS_PER_KEY = 10000  # versions not deleted
DEFAULT_MAX_SPARES_PER_KEY = 16  # warm spares the key's envs asked for, all pools together
DEFAULT_MAX_INGRESS_PER_KEY = 256  # open ingress connections (HTTP requests, WebSockets)
DEFAULT_INGRESS_READ_TIMEOUT_S = 600.0  # the longest an env may go silent mid-response
# A WebSocket through ingress with no message either way and no ping from its client for
# this long is closed (ingress/websocket.py). OpenEnv's clients ping every 20 s (websockets'
# default too), so a live session is never idle; one whose client does not ping still gets
# 10 minutes between two messages.
DEFAULT_WS_IDLE_TIMEOUT_S = 600.0
# Open leases (lifecycle/leases.py): one per client (a Denv, or a DenvProvider and its forks).
# Far above --max-envs-per-key, so that a client per env fits; it bounds a client that opens
# leases in a loop (a row and a renewal every few seconds each).
DEFAULT_MAX_LEASES_PER_KEY = 1024

# Warm pools (booted spares for forks); the DEFAULT_* ones are `denv serve` flags.
DEFAULT_WARM_MAX_SPARES = 32  # spares of all pools together, booting ones included
DEFAULT_WARM_MAX_MEMORY_MB = 0  # memory of all spares together; 0: no cap of its own
DEFAULT_WARM_MIN_FREE_MB = 1024  # never boot a spare that would leave less memory available
DEFAULT_WARM_IDLE_S = 600.0  # a pool nobody took a spare from for this long is reaped
WARM_BOOT_WORKERS = 8  # spares booting at once
WARM_BOOT_TIMEOUT_S = 120.0
WARM_MAX_FAILURES = 3  # boots that fail in a row before a pool's refill backs off
WARM_RETRY_BASE_S = 15.0  # the first back-off; it doubles with each further failure
WARM_RETRY_MAX_S = 600.0  # the longest back-off: a pool is never given up for good
WARM_MEMORY_GUESS = 256 * 1024 * 1024  # per spare, until one of the pool's is measured
WARM_REFILL_DELAY_S = 1.0  # after spares are taken, before their replacements boot
WARM_CPU_SHARES = 128  # a spare's CPU weight until it is taken (Docker's default is 1024)
CPU_SHARES = 1024
DEFAULT_LIMITS = Limits()  # per container of an env: 2 GiB, 1024 pids, 2 CPUs


@dataclass(frozen=True)
class ServerConfig:
    """What one ``denv serve`` process needs to know."""

    state_dir: Path
    api_key: str = field(repr=False)  # never in a log line or a traceback's repr
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    max_envs_per_key: int = DEFAULT_MAX_ENVS_PER_KEY
    base_url: str = ""  # the URL clients use; ingress URLs start with it
    warm_max_spares: int = DEFAULT_WARM_MAX_SPARES
    warm_max_memory_mb: int = DEFAULT_WARM_MAX_MEMORY_MB
    warm_min_free_mb: int = DEFAULT_WARM_MIN_FREE_MB
    warm_idle_s: float = DEFAULT_WARM_IDLE_S
    # one idle live root per (key, configuration) that creates clone (lifecycle/live/zygotes.py);
    # within the warm limits above
    zygotes: bool = True
    # each live child in a network namespace of its own (docker/live/netns.py), in place of
    # per-port rules in its container's (`denv serve --live-netns on|off`, $DENV_LIVE_NETNS)
    live_netns: bool = True
    # live roots mark their memory for the kernel's same-page merging (KSM) before they
    # fork, so that children's copies of unchanged pages are merged back (docker/ksm.py;
    # `denv serve --merge-pages`): denser, at ksmd's CPU and a side channel between envs
    merge_pages: bool = False
    # what separates envs from the host and each other: "runc" (namespaces and cgroups on the
    # host's kernel, Docker's default) or "gvisor" (a sandbox with its own kernel per env,
    # denv.server.gvisor; no live forks); `denv serve --isolation`
    isolation: str = "runc"
    subnet_pool: str = DEFAULT_SUBNET_POOL  # env networks' subnets come from here
    subnet_prefix: int = DEFAULT_SUBNET_PREFIX
    # egress allow envs may reach the host, link-local and private networks, and allowlists
    # may name them (`denv serve --allow-private-egress`); refused by default
    allow_private_egress: bool = False
    max_volume_mb: int = DEFAULT_MAX_VOLUME_MB
    max_disk_per_key_mb: int = DEFAULT_MAX_DISK_PER_KEY_MB
    min_free_disk_mb: int = DEFAULT_MIN_FREE_DISK_MB
    version_grace_s: float = DEFAULT_VERSION_GRACE_S
    gc_interval_s: float = DEFAULT_GC_INTERVAL_S  # 0: only on demand (POST /v1/gc)
    limits: Limits = DEFAULT_LIMITS  # every container of every env (spares too)
    allow_images: tuple[str, ...] = ()  # --allow-image patterns (image_allowlist.py); (): all
    pull_credentials: bool = False  # pull with the operator's registry credentials
    max_starting_per_key: int = DEFAULT_MAX_STARTING_PER_KEY
    max_creates_per_key: int = DEFAULT_MAX_CREATES_PER_KEY
    max_waits_per_key: int = DEFAULT_MAX_WAITS_PER_KEY
    max_waits: int = DEFAULT_MAX_WAITS  # all keys together
    max_versions_per_key: int = DEFAULT_MAX_VERSIONS_PER_KEY
    max_spares_per_key: int = DEFAULT_MAX_SPARES_PER_KEY
    max_ingress_per_key: int = DEFAULT_MAX_INGRESS_PER_KEY
    ingress_read_timeout_s: float = DEFAULT_INGRESS_READ_TIMEOUT_S  # 0: none
    ws_idle_timeout_s: float = DEFAULT_WS_IDLE_TIMEOUT_S  # 0: none
    max_leases_per_key: int = DEFAULT_MAX_LEASES_PER_KEY
    lease_timeout_s: float = DEFAULT_LEASE_TIMEOUT_S  # a lease opened without its own
    scheme: str = "http"  # "https" when `denv serve` has --tls-cert

    @property
    def db_path(self) -> Path:
        return self.state_dir / "denv.db"

    @property
    def layers_dir(self) -> Path:
        return self.state_dir / "layers"

    @property
    def envs_dir(self) -> Path:
        return self.state_dir / "envs"

    def public_url(self) -> str:
        if self.base_url:
            return self.base_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"{self.scheme}://{host}:{self.port}"


class ObjectStoreConfig(BaseModel):
    """Where layers are stored: an S3 endpoint, a bucket and the credentials for it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    endpoint: str  # e.g. "http://127.0.0.1:8333"
    bucket: str
    access_key: str
    secret_key: str = Field(repr=False)  # never in a log line or a repr
    region: str = "us-east-1"
