"""The records of an env: ``Env``, its ``EnvService``s and ``Endpoint``s, its ``EnvError``.

What ``create_sandbox``, ``get_env`` and ``list_envs`` return, converted from the generated
models field for field. ``denv.types`` re-exports them; import them from there.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from typing import TYPE_CHECKING

from ._types_enums import (
    DeletionReason,
    Egress,
    EgressAllowlist,
    EndpointVia,
    EnvErrorCode,
    EnvServiceStatus,
    EnvStatus,
    StartMode,
)
from ._types_record import Record, opt, plain_dict

if TYPE_CHECKING:
    from denv_api_client import models as api


@dataclasses.dataclass(frozen=True)
class Endpoint(Record):
    """Where a client reaches one published port of a service."""

    service: str
    port: int
    url: str
    via: EndpointVia

    @classmethod
    def from_api(cls, m: api.Endpoint) -> Endpoint:
        return cls(service=m.service, port=m.port, url=m.url, via=EndpointVia(m.via.value))


@dataclasses.dataclass(frozen=True)
class EnvService(Record):
    """One service (container) of an env, with the image digest it runs."""

    name: str
    image: str
    image_digest: str
    status: EnvServiceStatus
    start: StartMode | None = None

    @classmethod
    def from_api(cls, m: api.EnvService) -> EnvService:
        start = opt(m.start)
        return cls(
            name=m.name,
            image=m.image,
            image_digest=m.image_digest,
            status=EnvServiceStatus(m.status.value),
            start=None if start is None else StartMode(start.value),
        )


@dataclasses.dataclass(frozen=True)
class EnvDeletion(Record):
    """Why and when an env was deleted: `reason` (e.g. `lease_expired`) and `message`."""

    reason: DeletionReason
    message: str
    at: datetime.datetime

    @classmethod
    def from_api(cls, m: api.EnvDeletion) -> EnvDeletion:
        return cls(reason=DeletionReason(m.reason.value), message=m.message, at=m.at)


@dataclasses.dataclass(frozen=True)
class EnvError(Record):
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
            service=opt(m.service),
        )


@dataclasses.dataclass(frozen=True)
class Env(Record):
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
    #: The lease that holds it (its client's); None: detached, kept until ttl_s or a delete.
    lease_id: str | None = None
    deletion: EnvDeletion | None = None  # why and when it was deleted
    live: bool = False  # created with live=True (or a live child): fork(kind="live") works
    #: The node it runs on: "local" on one machine, a node's name on a cluster; None before
    #: it is placed (and from older servers).
    node: str | None = None
    #: Why the env cannot be forked live, when it was created with `live="auto"` and its
    #: server cannot be copied (e.g. `uvicorn --reload`); its forks are volume forks.
    live_unsupported: str | None = None
    #: Why a child of a live fork (kind "auto") is a volume child on another node of a
    #: cluster: its parent's node had no room for it. None on every other env.
    spill: str | None = None

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
            labels=plain_dict(m.labels),
            services=[EnvService.from_api(s) for s in m.services],
            endpoints=[Endpoint.from_api(e) for e in m.endpoints],
            start=StartMode(m.start.value),
            created_at=m.created_at,
            expires_at=m.expires_at,
            error=None if m.error is None else EnvError.from_api(m.error),
            lease_id=m.lease_id if isinstance(m.lease_id, str) else None,
            deletion=None if not m.deletion else EnvDeletion.from_api(m.deletion),
            live=m.live is True,
            node=m.node if isinstance(m.node, str) else None,
            live_unsupported=m.live_unsupported if isinstance(m.live_unsupported, str) else None,
            spill=m.spill if isinstance(m.spill, str) else None,
        )
