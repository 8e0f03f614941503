"""What the denv client returns: plain frozen records, written by hand.

They mirror the contract's schemas (openapi/denv.yaml) but are not the generated models:
regenerating the client changes `from_api`, never what users import. Enums are `StrEnum`s,
so `env.status == "healthy"` holds and `str(env.status)` is the wire value.

    env = denv.create_sandbox("denv-echo-env:latest")
    env.status is EnvStatus.HEALTHY          # also == "healthy"
    env.endpoints[0].url                     # where a client connects
    env.labels["team"]                       # a plain dict

The records live in private modules by what they describe (`_types_env`, `_types_version`,
`_types_server`, the enums in `_types_enums`); this module is where they are imported from.
"""

from __future__ import annotations

from ._types_enums import (
    DeletionReason,
    Egress,
    EgressAllowlist,
    EndpointVia,
    EnvErrorCode,
    EnvServiceStatus,
    EnvStatus,
    ErrorCode,
    FileChangeKind,
    HealthStatus,
    LeaseState,
    StartMode,
    WaitFor,
    WarmPoolState,
)
from ._types_env import Endpoint, Env, EnvDeletion, EnvError, EnvService
from ._types_server import Health, HostGuard, Lease, Project, WarmPool
from ._types_version import Collected, FileChange, Fork, Version, VersionDiff, VersionService

__all__ = [
    "Collected",
    "DeletionReason",
    "Egress",
    "EgressAllowlist",
    "Endpoint",
    "EndpointVia",
    "Env",
    "EnvDeletion",
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
    "Lease",
    "LeaseState",
    "Project",
    "StartMode",
    "Version",
    "VersionDiff",
    "VersionService",
    "WaitFor",
    "WarmPool",
    "WarmPoolState",
]
