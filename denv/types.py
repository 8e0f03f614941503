"""What the denv client returns: plain frozen records, written by hand.

They mirror the contract's schemas (openapi/denv.yaml) but are not the generated models:
regenerating the client changes `from_api`, never what users import. Enums are `StrEnum`s,
so `env.status == "healthy"` holds and `str(env.status)` is the wire value.

    env = denv.create_sandbox("denv-echo-env:latest")
    env.status is EnvStatus.HEALTHY          # also == "healthy"
    env.endpoints[0].url                     # where a client connects
    env.labels["team"]                       # a plain dict
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from denv_api_client.types import Unset

if TYPE_CHECKING:
    from denv_api_client import models as api

__all__ = [
    "Egress",
    "EgressAllowlist",
    "Endpoint",
    "EndpointVia",
    "Env",
    "EnvError",
    "EnvErrorCode",
    "EnvService",
    "EnvServiceStatus",
    "EnvStatus",
    "ErrorCode",
    "FileChange",
    "FileChangeKind",
    "Fork",
    "Health",
    "HealthStatus",
    "HostGuard",
    "Project",
    "StartMode",
    "Version",
    "VersionDiff",
    "VersionService",
    "WaitFor",
    "WarmPool",
    "WarmPoolState",
]


class EnvStatus(enum.StrEnum):
    """Where an env is in its life; `failed` and `deleted` are final."""

    CREATING = "creating"
    STARTING = "starting"
    RUNNING = "running"
    HEALTHY = "healthy"
    FAILED = "failed"
    DELETED = "deleted"


class StartMode(enum.StrEnum):
    """How the server started an env: from a booted spare (`warm`) or by booting it (`cold`)."""

    COLD = "cold"
    WARM = "warm"
    LIVE = "live"  # a live fork: a copy of the parent's running server process


class Egress(enum.StrEnum):
    """`deny`: no outward connections (reached through the ingress); `allow`: ports published,
    and outward connections to anything but the server's host, link-local and private networks
    (unless the server's operator allows those)."""

    ALLOW = "allow"
    DENY = "deny"


@dataclasses.dataclass(frozen=True)
class EgressAllowlist:
    """An env that reaches only what ``allow`` lists: ``name-or-cidr[:port]`` entries.

    Names are resolved by the server when the env is created; ``host.docker.internal`` is the
    server's host. Pass it, or the plain dict, as ``egress``::

        denv.create_sandbox("img", egress={"allow": ["host.docker.internal:8100"]})
    """

    allow: tuple[str, ...]


class EndpointVia(enum.StrEnum):
    """How an endpoint is reached: the server's ingress proxy, or a port published on its host."""

    INGRESS = "ingress"
    PUBLISHED = "published"


class EnvErrorCode(enum.StrEnum):
    """Why an env failed."""

    ENGINE_ERROR = "engine_error"
    EXITED = "exited"
    HEALTH_TIMEOUT = "health_timeout"
    LOST = "lost"
    START_FAILED = "start_failed"


class EnvServiceStatus(enum.StrEnum):
    """The state of one service's container."""

    CREATED = "created"
    EXITED = "exited"
    MISSING = "missing"
    PAUSED = "paused"
    RUNNING = "running"


class WarmPoolState(enum.StrEnum):
    """`none` (no spares asked for), `filling`, `ready`, or `stalled` (see `WarmPool.error`)."""

    FILLING = "filling"
    NONE = "none"
    READY = "ready"
    STALLED = "stalled"


class WaitFor(enum.StrEnum):
    """What a create waits for before answering."""

    HEALTHY = "healthy"
    NONE = "none"
    RUNNING = "running"


class HealthStatus(enum.StrEnum):
    OK = "ok"


class ErrorCode(enum.StrEnum):
    """The machine code of an error answer (`DenvError.code`)."""

    CONFLICT = "conflict"
    ENGINE_UNAVAILABLE = "engine_unavailable"
    ENV_NOT_RUNNING = "env_not_running"
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    IMAGE_NOT_FOUND = "image_not_found"
    INTERNAL = "internal"
    INVALID_COMPOSE = "invalid_compose"
    INVALID_REQUEST = "invalid_request"
    LIMIT_EXCEEDED = "limit_exceeded"
    NOT_FOUND = "not_found"
    QUOTA_EXCEEDED = "quota_exceeded"
    RATE_LIMITED = "rate_limited"
    UNAUTHORIZED = "unauthorized"
    VERSION_IN_USE = "version_in_use"


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, _Record):
        return value.to_dict()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _opt(value: Any) -> Any:
    """The generated models' UNSET (an absent optional field) as None."""
    return None if isinstance(value, Unset) else value


def _dict(model: Any) -> dict[str, str]:
    """A generated free-form object (labels, env vars) as a plain dict."""
    return dict(model.additional_properties) if model is not None else {}


class _Record:
    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-ready values, field for field (enums as strings, times in ISO)."""
        assert dataclasses.is_dataclass(self)
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


@dataclasses.dataclass(frozen=True)
class Endpoint(_Record):
    """Where a client reaches one published port of a service."""

    service: str
    port: int
    url: str
    via: EndpointVia

    @classmethod
    def from_api(cls, m: api.Endpoint) -> Endpoint:
        return cls(service=m.service, port=m.port, url=m.url, via=EndpointVia(m.via.value))


@dataclasses.dataclass(frozen=True)
class EnvService(_Record):
    """One service (container) of an env, with the image digest it runs."""

    name: str
    image: str
    image_digest: str
    status: EnvServiceStatus
    start: StartMode | None = None

    @classmethod
    def from_api(cls, m: api.EnvService) -> EnvService:
        start = _opt(m.start)
        return cls(
            name=m.name,
            image=m.image,
            image_digest=m.image_digest,
            status=EnvServiceStatus(m.status.value),
            start=None if start is None else StartMode(start.value),
        )


@dataclasses.dataclass(frozen=True)
class EnvError(_Record):
    """Why an env failed, with the failing service's last log lines."""

    code: EnvErrorCode
    message: str
    log_tail: list[str]
    service: str | None = None

    @classmethod
    def from_api(cls, m: api.EnvError) -> EnvError:
        return cls(
            code=EnvErrorCode(m.code.value),
            message=m.message,
            log_tail=list(m.log_tail),
            service=_opt(m.service),
        )


@dataclasses.dataclass(frozen=True)
class Env(_Record):
    """A running (or failed, or deleted) instance of a version."""

    id: str
    status: EnvStatus
    version_id: str
    parent_id: str | None
    project: str | None
    agent_service: str
    egress: Egress | EgressAllowlist
    labels: dict[str, str]
    services: list[EnvService]
    endpoints: list[Endpoint]
    start: StartMode
    created_at: datetime.datetime
    expires_at: datetime.datetime
    error: EnvError | None
    live: bool = False  # created with live=True (or a live child): fork(kind="live") works
    #: The node it runs on: "local" on one machine, a node's name on a cluster; None before
    #: it is placed (and from older servers).
    node: str | None = None

    @classmethod
    def from_api(cls, m: api.Env) -> Env:
        return cls(
            id=m.id,
            status=EnvStatus(m.status.value),
            version_id=m.version_id,
            parent_id=m.parent_id,
            project=m.project,
            agent_service=m.agent_service,
            egress=(
                Egress(m.egress.value)
                if isinstance(m.egress, enum.Enum)
                else EgressAllowlist(allow=tuple(m.egress.allow))
            ),
            labels=_dict(m.labels),
            services=[EnvService.from_api(s) for s in m.services],
            endpoints=[Endpoint.from_api(e) for e in m.endpoints],
            start=StartMode(m.start.value),
            created_at=m.created_at,
            expires_at=m.expires_at,
            error=None if m.error is None else EnvError.from_api(m.error),
            live=m.live is True,
            node=m.node if isinstance(m.node, str) else None,
        )


@dataclasses.dataclass(frozen=True)
class VersionService(_Record):
    """One service of a version, pinned by image digest."""

    name: str
    image: str
    image_digest: str
    command: list[str] | None
    env: dict[str, str]
    ports: list[int]
    volumes: list[str]
    depends_on: list[str]
    health_path: str | None

    @classmethod
    def from_api(cls, m: api.VersionService) -> VersionService:
        return cls(
            name=m.name,
            image=m.image,
            image_digest=m.image_digest,
            command=None if m.command is None else list(m.command),
            env=_dict(m.env),
            ports=list(m.ports),
            volumes=list(m.volumes),
            depends_on=list(m.depends_on),
            health_path=m.health_path,
        )


@dataclasses.dataclass(frozen=True)
class Version(_Record):
    """An immutable snapshot: images pinned by digest plus one layer per volume."""

    id: str
    project: str | None
    parent_env_id: str | None
    parent_version_id: str | None  # the version its parent env ran; None for a root
    agent_service: str
    services: list[VersionService]
    layer_depth: int
    warm_fork: bool
    labels: dict[str, str]
    created_at: datetime.datetime
    #: The MCP tools it declares (the compose file's x-denv.tools); None when none were.
    tools: list[str] | None = None
    #: Where its /work layers are kept: "node" (only where they were made), "uploading",
    #: "durable" (in object storage: it forks on any node) or "lost"; None from older servers.
    storage: str | None = None

    @classmethod
    def from_api(cls, m: api.Version) -> Version:
        return cls(
            id=m.id,
            project=m.project,
            parent_env_id=m.parent_env_id,
            parent_version_id=m.parent_version_id,
            agent_service=m.agent_service,
            services=[VersionService.from_api(s) for s in m.services],
            layer_depth=m.layer_depth,
            warm_fork=m.warm_fork,
            labels=_dict(m.labels),
            created_at=m.created_at,
            tools=list(m.tools) if isinstance(m.tools, list) else None,
            storage=m.storage.value if isinstance(m.storage, enum.Enum) else None,
        )


class FileChangeKind(enum.StrEnum):
    """How a file differs between two versions."""

    ADDED = "added"
    MODIFIED = "modified"
    DELETED = "deleted"


@dataclasses.dataclass(frozen=True)
class FileChange(_Record):
    """One file that differs: its path in the container, how, its size in bytes (in the
    newer version; in the base when deleted) and the service whose volume holds it."""

    path: str
    change: FileChangeKind
    size: int
    service: str

    @classmethod
    def from_api(cls, m: api.FileChange) -> FileChange:
        return cls(
            path=m.path, change=FileChangeKind(m.change.value), size=m.size, service=m.service
        )


@dataclasses.dataclass(frozen=True)
class VersionDiff(_Record):
    """What changed in the volumes from `base_version_id` to `version_id` (`Denv.diff`).

    `truncated`: more files differ than `changes` holds (at most 10000).
    """

    base_version_id: str
    version_id: str
    changes: list[FileChange]
    truncated: bool

    @classmethod
    def from_api(cls, m: api.VersionDiff) -> VersionDiff:
        return cls(
            base_version_id=m.base_version_id,
            version_id=m.version_id,
            changes=[FileChange.from_api(c) for c in m.changes],
            truncated=m.truncated,
        )


@dataclasses.dataclass(frozen=True)
class Fork(_Record):
    """One snapshot of an env (`version`) and the children started from it (`envs`)."""

    version: Version
    envs: list[Env]

    @classmethod
    def from_api(cls, m: api.Fork) -> Fork:
        return cls(version=Version.from_api(m.version), envs=[Env.from_api(e) for e in m.envs])


@dataclasses.dataclass(frozen=True)
class HostGuard(_Record):
    """The firewall rule keeping egress-deny envs off the server's host, per IP family.

    ``ipv4``/``ipv6``: ``ok``, ``restored`` (was missing, put back) or ``missing`` (see
    ``reason``); ``restores``: how often it was put back since the server started.
    """

    ipv4: str
    ipv6: str
    restores: int
    last_restored_at: datetime.datetime | None
    reason: str | None

    @classmethod
    def from_api(cls, m: api.HostGuard) -> HostGuard:
        return cls(
            ipv4=m.ipv4.value,
            ipv6=m.ipv6.value,
            restores=m.restores,
            last_restored_at=m.last_restored_at,
            reason=m.reason,
        )


@dataclasses.dataclass(frozen=True)
class Health(_Record):
    """The server's status, its version, whether its container engine answers, and its
    host guard (None from a server that does not report it)."""

    status: HealthStatus
    version: str
    engine: str
    host_guard: HostGuard | None = None

    @classmethod
    def from_api(cls, m: api.Health) -> Health:
        guard = _opt(m.host_guard)
        return cls(
            status=HealthStatus(m.status.value),
            version=m.version,
            engine=m.engine,
            host_guard=HostGuard.from_api(guard) if guard is not None else None,
        )


@dataclasses.dataclass(frozen=True)
class Project(_Record):
    """A named line of versions deployed from compose files."""

    name: str
    latest_version_id: str
    version_count: int
    created_at: datetime.datetime

    @classmethod
    def from_api(cls, m: api.Project) -> Project:
        return cls(
            name=m.name,
            latest_version_id=m.latest_version_id,
            version_count=m.version_count,
            created_at=m.created_at,
        )


@dataclasses.dataclass(frozen=True)
class WarmPool(_Record):
    """The booted spares an env asked for: `ready` of `target`, `booting`, and `state`."""

    env_id: str
    state: WarmPoolState
    target: int
    ready: int
    booting: int
    failures: int
    error: str | None = None

    @classmethod
    def from_api(cls, m: api.WarmPool) -> WarmPool:
        return cls(
            env_id=m.env_id,
            state=WarmPoolState(m.state.value),
            target=m.target,
            ready=m.ready,
            booting=m.booting,
            failures=m.failures,
            error=_opt(m.error),
        )
