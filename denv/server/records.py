"""Typed records of the server: what a version and an env are made of, from route to node.

Every record is plain data (frozen pydantic models, or dataclasses of them), so it can be
stored as JSON and sent to a node in another process unchanged. The SQLite store keeps the
nested parts as JSON columns and converts at its edge (``model_dump`` / ``model_validate``).

``EnvStatus`` is the contract's env status; its groups are named sets::

    rec.status in EXISTING  # anything but deleted: it counts against the key's quota
    rec.status in FINAL     # failed or deleted: nothing moves it on but a delete
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict


class EnvStatus(StrEnum):
    """An env's status, exactly the contract's values."""

    CREATING = "creating"
    STARTING = "starting"
    RUNNING = "running"
    HEALTHY = "healthy"
    FAILED = "failed"
    DELETED = "deleted"


ALL = frozenset(EnvStatus)
EXISTING = ALL - {EnvStatus.DELETED}  # has (or is making) resources; counts against the quota
FINAL = frozenset({EnvStatus.FAILED, EnvStatus.DELETED})  # only a delete moves it on
ACTIVE = EXISTING - FINAL  # creating .. healthy: may still fail
BOOTING = frozenset({EnvStatus.CREATING, EnvStatus.STARTING})
UP = frozenset({EnvStatus.STARTING, EnvStatus.RUNNING, EnvStatus.HEALTHY})  # containers run
READY = frozenset({EnvStatus.RUNNING, EnvStatus.HEALTHY})  # the agent serves


class Record(BaseModel):
    """A frozen record with no unknown fields: what crosses the node seam and the store."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class ServiceLimits(Record):
    """A compose service's own limits, within the server's (None: the server's)."""

    memory_mb: int | None = None
    pids: int | None = None
    cpus: float | None = None


class ServiceSpec(Record):
    """One service of a version, as it is booted (the contract's VersionService + checks)."""

    name: str
    image: str
    image_digest: str
    command: list[str] | None = None
    env: dict[str, str] = {}
    ports: list[int] = []
    volumes: list[str] = []  # mount paths
    depends_on: list[str] = []
    health_path: str | None = None  # the agent's HTTP health path
    healthcheck: list[str] | None = None  # a dependency's exec test
    wait_healthy: list[str] = []  # dependencies whose healthcheck must pass first
    limits: ServiceLimits | None = None  # compose's mem_limit, pids_limit, cpus


class Volume(Record):
    """A version's volume: its service, its path and its layers (newest first)."""

    service: str
    path: str
    layers: list[str] = []


class VolumeSlot(Record):
    """A volume in place: its index ``n`` among its service's volumes names its dirs."""

    service: str
    n: int
    path: str
    layers: list[str] = []


def volume_slots(volumes: list[Volume]) -> list[VolumeSlot]:
    """Each volume with its index among its service's volumes (its ``<n>`` on disk)."""
    seen: dict[str, int] = {}
    out = []
    for vol in volumes:
        n = seen.get(vol.service, 0)
        seen[vol.service] = n + 1
        out.append(VolumeSlot(service=vol.service, n=n, path=vol.path, layers=vol.layers))
    return out


class Endpoint(Record):
    """A published port of the agent; an ingress one is rendered with its token, derived
    from the server's secret (``denv.server.tokens``), so no token is stored."""

    service: str
    port: int
    url: str
    via: Literal["published", "ingress"]
    token: str | None = None  # only in records of older servers (or a caller's own token)


class LiveProc(Record):
    """A live env's server process (``live: true``): what a live fork copies.

    ``group`` is the env whose container it runs in: the env created with ``live: true``;
    its live descendants run in the same container. ``pid`` and ``start`` (its start time
    in /proc) name the process on the node; ``depth`` is 0 for the group's env, n for a
    child n forks down.
    """

    group: str
    container: str
    pid: int
    start: int
    port: int
    depth: int = 0
    slot: str = ""  # its dir under the group's live dir ("" for the group's env)
    # its address in a network namespace of its own (``--live-netns on``); "" when it
    # serves in its container's (ingress then reaches it at the container's address)
    addr: str = ""


class Runtime(Record):
    """What an env has on its node: network, containers (service -> id), endpoints."""

    network: str | None = None
    containers: dict[str, str] = {}
    endpoints: list[Endpoint] = []
    agent_ip: str | None = None
    live: LiveProc | None = None  # a live env's server process
    live_unsupported: str | None = None  # ``live: auto`` and refused: why
    node: str | None = None  # the node it runs on ("local": this machine's engine)


class EnvSpec(Record):
    """What an env was asked for beyond its version: agent env overrides, timeouts, warm."""

    env: dict[str, str] = {}
    wait_timeout_s: float = 120.0
    warm: int = 0
    live: bool = False  # run under the live-fork launcher (``live: true`` or ``auto``)
    live_auto: bool = False  # ``live: auto``: a server that cannot be copied keeps serving
    # A child of a live fork started as a volume fork on another node: why (its parent's
    # node had no room for it); None for every other env.
    spill: str | None = None
    # A checkpoint of its parent's sandbox on its node (``CheckpointCalls``): a fork's child
    # resumes from it instead of booting (its start then says ``restored``); "" for the rest.
    restore: str = ""


class Limits(Record):
    """What one container of an env may use; 0 means no limit (Docker's own default).

    Set at container create (Docker's ``mem_limit``, ``pids_limit``, ``nano_cpus``) in the
    one boot path, so a warm spare gets the same limits as a cold start.
    """

    memory_mb: int = 2048  # past it the kernel's OOM killer ends a process of the container
    pids: int = 1024  # processes and threads together: a fork bomb stops here
    cpus: float = 2.0  # a CFS quota: no env takes every core of a shared host
    # Every other capability is dropped (engine.CAP_DROP); `denv serve --env-cap-add` grants
    # more to images that need them (an entrypoint that switches user needs SETUID/SETGID).
    capabilities: tuple[str, ...] = ("DAC_OVERRIDE",)

    def of(self, service: ServiceLimits | None) -> Limits:
        """These limits with a service's own in place of the server's."""
        if service is None:
            return self
        mine = {k: v for k, v in service.model_dump().items() if v is not None}
        return self.model_copy(update=mine)


class EnvDeletion(Record):
    """Why and when an env was deleted (the contract's EnvDeletion)."""

    reason: Literal["requested", "ttl", "lease_expired", "lease_closed", "server"]
    message: str
    at: str  # ISO 8601, UTC


class EnvError(Record):
    """Why an env failed (the contract's EnvError)."""

    code: str
    message: str
    service: str | None = None
    log_tail: list[str] = []


# What made a version: POST /v1/sandboxes, a fork, POST .../snapshot, a deploy. Older
# databases' versions with a parent env read as snapshots (kept: a fork's could not be told).
VersionOrigin = Literal["sandbox", "fork", "snapshot", "deploy"]
IMPLICIT_ORIGINS = frozenset({"sandbox", "fork"})


@dataclass
class VersionRecord:
    id: str
    owner: str
    project: str | None
    parent_env_id: str | None
    agent_service: str
    services: list[ServiceSpec]  # in start order: dependencies first
    volumes: list[Volume]
    warm_fork: bool
    labels: dict[str, str]
    created_at: str
    deleted: bool = False
    parent_version_id: str | None = None  # the version its parent env ran (a snapshot's)
    tools: list[str] | None = None  # the MCP tools it declares (x-denv.tools); snapshots keep them
    origin: VersionOrigin = "snapshot"  # what made it; sandbox and fork versions expire
    size_bytes: int = 0  # disk its layers add to its parent version's (all its layers: a root's)

    @property
    def implicit(self) -> bool:
        """Made by a sandbox or a fork, not asked for: collected once nothing needs it."""
        return self.origin in IMPLICIT_ORIGINS

    def service(self, name: str) -> ServiceSpec:
        return next(s for s in self.services if s.name == name)


@dataclass
class EnvRecord:
    id: str
    owner: str
    version_id: str
    parent_id: str | None
    project: str | None
    agent_service: str
    egress: str
    labels: dict[str, str]
    status: EnvStatus
    start: str
    created_at: str
    expires_at: str
    error: EnvError | None = None
    spec: EnvSpec = field(default_factory=EnvSpec)
    runtime: Runtime = field(default_factory=Runtime)
    lease_id: str | None = None  # the lease that holds it (None: detached)
    deletion: EnvDeletion | None = None  # why it was deleted, once it is


LeaseState = Literal["open", "expired", "closed"]


@dataclass
class LeaseRecord:
    """A client's lease: the envs created with its id are deleted when it ends (``leases``).

    Times are seconds since the epoch: a lease outlives a server restart, so its clock is
    the wall clock, not the server process's."""

    id: str
    owner: str
    timeout_s: float
    expires_at: float
    created_at: float
    state: LeaseState = "open"
    ended_at: float | None = None
