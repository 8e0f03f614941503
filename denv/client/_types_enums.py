"""The str-enums of ``denv.types``: wire values that compare equal to their strings.

Every enum of the contract in one place (env and service states, start modes, egress,
error codes, file changes), with ``EgressAllowlist``, the one egress setting that is not an
enum value. ``denv.types`` re-exports them; import them from there.
"""

from __future__ import annotations

import dataclasses
import enum


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
    ZYGOTE = "zygote"  # a new env copied from the key's idle booted root of its image
    RESTORED = "restored"  # a fork's child resumed from its parent's sandbox (gVisor)


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
    LIVE_UNSUPPORTED = "live_unsupported"  # created with live=True; its server cannot be copied
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


class DeletionReason(enum.StrEnum):
    """Why an env was deleted (`Env.deletion.reason`)."""

    REQUESTED = "requested"  # a delete (delete_env, `denv rm`, a provider's stop)
    TTL = "ttl"  # its ttl_s passed
    LEASE_EXPIRED = "lease_expired"  # its client stopped renewing: killed, paused, cut off
    LEASE_CLOSED = "lease_closed"  # its client closed (a clean exit)
    SERVER = "server"  # the server removed it (the message says why)


class LeaseState(enum.StrEnum):
    """`open` (renewed in time), `expired` (its envs were deleted), `closed` (by its client)."""

    OPEN = "open"
    EXPIRED = "expired"
    CLOSED = "closed"


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
    DISK_LOW = "disk_low"
    DISK_QUOTA_EXCEEDED = "disk_quota_exceeded"
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


class FileChangeKind(enum.StrEnum):
    """How a file differs between two versions."""

    ADDED = "added"
    MODIFIED = "modified"
    DELETED = "deleted"
