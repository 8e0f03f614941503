"""Request bodies of the contract as pydantic models (strict, no unknown fields).

They mirror ``openapi/denv.yaml``: a body the contract rejects is rejected here with 422.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints

ServiceName = Annotated[str, StringConstraints(pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$")]
ProjectName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]
Path = Annotated[str, StringConstraints(pattern=r"^/[^\x00]{0,254}$")]
Labels = Annotated[
    dict[
        Annotated[str, StringConstraints(min_length=1, max_length=63)],
        Annotated[str, StringConstraints(max_length=255)],
    ],
    Field(max_length=32),
]
EnvVars = Annotated[
    dict[
        Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")],
        Annotated[str, StringConstraints(max_length=32768)],
    ],
    Field(max_length=256),
]
LeaseId = Annotated[str, StringConstraints(pattern=r"^lse_[0-9A-HJKMNP-TV-Z]{26}$")]
EgressMode = Literal["deny", "allow"]
WaitFor = Literal["none", "running", "healthy"]


def _integral(value: object) -> object:
    """JSON Schema counts 3.0 as an integer; pydantic's strict mode does not."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Int = Annotated[int, BeforeValidator(_integral)]
Ttl = Annotated[Int, Field(ge=1, le=604800)]
WaitTimeout = Annotated[float, Field(gt=0, le=600)]
Warm = Annotated[Int, Field(ge=0, le=32)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class EgressAllowlist(_Body):
    """``{"allow": ["name-or-cidr[:port]", ...]}``; entries are checked by ``egress.allowlist``."""

    allow: Annotated[list[Annotated[str, StringConstraints(max_length=300)]], Field(max_length=64)]


Egress = EgressMode | EgressAllowlist


# How a create's agent starts: under the live-fork launcher (True), not (False), or "auto":
# under it, kept as it is when its server cannot be copied (it then serves as without live).
LiveStart = bool | Literal["auto"]


class SandboxCreate(_Body):
    image: Annotated[str, StringConstraints(min_length=1, max_length=512)]
    command: (
        Annotated[list[Annotated[str, StringConstraints(max_length=32768)]], Field(max_length=256)]
        | None
    ) = None
    env: EnvVars = Field(default_factory=dict)
    ports: Annotated[
        list[Annotated[Int, Field(ge=1, le=65535)]], Field(min_length=1, max_length=16)
    ] = Field(default_factory=lambda: [8000])
    egress: Egress = "deny"
    volumes: Annotated[list[Path], Field(max_length=8)] = Field(default_factory=list)
    labels: Labels = Field(default_factory=dict)
    ttl_s: Ttl = 3600
    lease_id: LeaseId | None = None  # the lease that holds the env; None: detached
    wait: WaitFor = "healthy"
    wait_timeout_s: WaitTimeout = 120.0
    health_path: Path = "/health"
    pull: bool = False
    warm: Warm = 0
    warm_fork: bool = False
    count: Annotated[Int, Field(ge=1)] | None = None  # set: the answer is an EnvBatch
    live: LiveStart = False


class EnvsCreate(_Body):
    count: Annotated[Int, Field(ge=1)] = 1  # above MAX_COUNT: 422 limit_exceeded
    egress: Egress | None = None
    env: EnvVars = Field(default_factory=dict)
    labels: Labels = Field(default_factory=dict)
    ttl_s: Ttl = 3600
    lease_id: LeaseId | None = None
    wait: WaitFor = "healthy"
    wait_timeout_s: WaitTimeout = 120.0
    warm: Warm = 0
    kind: Literal["volume", "live", "auto"] = "volume"  # fork only
    reseed: bool = True  # a live fork only: fresh entropy for each child's global generators
    live: LiveStart = False  # create from a version only


class LeaseCreate(_Body):
    # Absent: the server's --lease-timeout (`given_timeout_s`); null is not a number.
    timeout_s: Annotated[float, Field(ge=5, le=600)] = 15.0

    def given_timeout_s(self) -> float | None:
        return self.timeout_s if "timeout_s" in self.model_fields_set else None


class SnapshotRequest(_Body):
    labels: Labels = Field(default_factory=dict)


class WaitRequest(_Body):
    until: Literal["running", "healthy", "deleted"] = "healthy"
    timeout_s: WaitTimeout = 60.0


class DeployRequest(_Body):
    compose: Annotated[str, StringConstraints(min_length=1, max_length=262144)]
    labels: Labels = Field(default_factory=dict)
