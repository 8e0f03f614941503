"""What every new env's record is made of, whatever makes it (a boot, a spare, a live copy,
a zygote's copy, a spilled child): the request's options (``EnvOptions``) and the one
builder of its record (``new_record``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from denv.server.db import iso, now
from denv.server.lifecycle.requests import EnvsCreate
from denv.server.records import EnvRecord, EnvSpec, EnvStatus, VersionRecord


@dataclass(frozen=True)
class EnvOptions:
    """The options of recorded envs, beside what admission resolved (``Admitted``): their labels,
    lease, lifetime and boot limit; whether they may take spares; why they spilled."""

    labels: dict[str, str]
    ttl_s: int
    wait_timeout_s: float
    lease_id: str | None = None
    use_spares: bool = True
    spill: str | None = None
    restore: str = ""  # a checkpoint of the fork's parent the envs resume from (EnvSpec)

    @classmethod
    def of(cls, opts: EnvsCreate, spill: str | None = None, restore: str = "") -> EnvOptions:
        """A create's or fork's request options (``EnvsCreate``)."""
        return cls(
            dict(opts.labels),
            opts.ttl_s,
            opts.wait_timeout_s,
            opts.lease_id,
            not restore,  # a spare booted already: it cannot resume a checkpoint
            spill,
            restore,
        )


def new_record(
    owner: str,
    version: VersionRecord,
    egress: str,
    options: EnvOptions,
    parent_id: str | None,
    spec: EnvSpec,
    **made: Any,
) -> EnvRecord:
    """The record of a new env of ``version``, whatever made it (a boot, a spare, a live
    copy): the one place its identity, labels, lease and lifetime are set. ``made``: what
    its maker knows already (id, status, start, runtime, error); by default a cold start
    still to be made."""
    created = now()
    fields: dict[str, Any] = {"id": "", "status": EnvStatus.CREATING, "start": "cold", **made}
    return EnvRecord(
        owner=owner,
        version_id=version.id,
        parent_id=parent_id,
        project=version.project,
        agent_service=version.agent_service,
        egress=egress,
        labels=dict(options.labels),
        lease_id=options.lease_id,
        created_at=iso(created),
        expires_at=iso(created + timedelta(seconds=options.ttl_s)),
        spec=spec,
        **fields,
    )
