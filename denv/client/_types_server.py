"""The records about the server rather than one env: ``Health`` with its ``HostGuard``,
``Project``, ``WarmPool``, ``Lease``.

Converted from the generated models field for field. ``denv.types`` re-exports them;
import them from there.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import TYPE_CHECKING

from ._types_enums import HealthStatus, LeaseState, WarmPoolState
from ._types_record import Record, opt

if TYPE_CHECKING:
    from denv_api_client import models as api


@dataclasses.dataclass(frozen=True)
class HostGuard(Record):
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
class Health(Record):
    """The server's status, its version, whether its container engine answers, and its
    host guard (None from a server that does not report it)."""

    status: HealthStatus
    version: str
    engine: str
    host_guard: HostGuard | None = None

    @classmethod
    def from_api(cls, m: api.Health) -> Health:
        guard = opt(m.host_guard)
        return cls(
            status=HealthStatus(m.status.value),
            version=m.version,
            engine=m.engine,
            host_guard=HostGuard.from_api(guard) if guard is not None else None,
        )


@dataclasses.dataclass(frozen=True)
class Project(Record):
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
class WarmPool(Record):
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
            error=opt(m.error),
        )


@dataclasses.dataclass(frozen=True)
class Lease(Record):
    """A client's lease on the envs it creates (`Denv.lease`): while it is renewed they run;
    once it expires or is closed, the server deletes them."""

    id: str
    state: LeaseState
    timeout_s: float
    expires_at: datetime.datetime
    created_at: datetime.datetime
    ended_at: datetime.datetime | None
    envs: int  # envs it holds that are not deleted

    @classmethod
    def from_api(cls, m: api.Lease) -> Lease:
        return cls(
            id=m.id,
            state=LeaseState(m.state.value),
            timeout_s=m.timeout_s,
            expires_at=m.expires_at,
            created_at=m.created_at,
            ended_at=m.ended_at,
            envs=m.envs,
        )
