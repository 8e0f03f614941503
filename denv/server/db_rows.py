"""Rows of the ``versions`` and ``envs`` tables to records (``records``) and back.

The JSON columns hold a record's nested parts (services, volumes, labels, spec, runtime,
error, deletion); they are converted here and nowhere else, apart from ``db``'s queries, so reading
a query never means reading a conversion. ``env_row`` follows the ``envs`` table's column
order; ``version_row`` follows the column list of ``Store.insert_version``.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from denv.server.records import (
    EnvDeletion,
    EnvError,
    EnvRecord,
    EnvSpec,
    EnvStatus,
    Runtime,
    ServiceSpec,
    VersionRecord,
    Volume,
)


def version_row(v: VersionRecord) -> tuple[Any, ...]:
    """The values of ``insert_version``'s columns (id ... created_at, parent_version_id,
    tools, origin, size_bytes; ``deleted`` is written as 0 by the statement)."""
    return (
        v.id,
        v.owner,
        v.project,
        v.parent_env_id,
        v.agent_service,
        json.dumps([x.model_dump() for x in v.services]),
        json.dumps([x.model_dump() for x in v.volumes]),
        int(v.warm_fork),
        json.dumps(v.labels),
        v.created_at,
        v.parent_version_id,
        None if v.tools is None else json.dumps(v.tools),
        v.origin,
        v.size_bytes,
    )


def version_from_row(r: sqlite3.Row) -> VersionRecord:
    return VersionRecord(
        id=r["id"],
        owner=r["owner"],
        project=r["project"],
        parent_env_id=r["parent_env_id"],
        agent_service=r["agent_service"],
        services=[ServiceSpec.model_validate(x) for x in json.loads(r["services"])],
        volumes=[Volume.model_validate(x) for x in json.loads(r["volumes"])],
        warm_fork=bool(r["warm_fork"]),
        labels=json.loads(r["labels"]),
        created_at=r["created_at"],
        deleted=bool(r["deleted"]),
        parent_version_id=r["parent_version_id"],
        tools=None if r["tools"] is None else json.loads(r["tools"]),
        origin=r["origin"],
        size_bytes=int(r["size_bytes"]),
    )


def env_row(e: EnvRecord) -> tuple[Any, ...]:
    return (
        e.id,
        e.owner,
        e.version_id,
        e.parent_id,
        e.project,
        e.agent_service,
        e.egress,
        json.dumps(e.labels),
        e.status.value,
        e.start,
        e.created_at,
        e.expires_at,
        e.error.model_dump_json() if e.error else None,
        e.spec.model_dump_json(),
        e.runtime.model_dump_json(),
        e.lease_id,
        e.deletion.model_dump_json() if e.deletion else None,
    )


def env_from_row(r: sqlite3.Row) -> EnvRecord:
    return EnvRecord(
        id=r["id"],
        owner=r["owner"],
        version_id=r["version_id"],
        parent_id=r["parent_id"],
        project=r["project"],
        agent_service=r["agent_service"],
        egress=r["egress"],
        labels=json.loads(r["labels"]),
        status=EnvStatus(r["status"]),
        start=r["start"],
        created_at=r["created_at"],
        expires_at=r["expires_at"],
        error=EnvError.model_validate_json(r["error"]) if r["error"] else None,
        spec=EnvSpec.model_validate_json(r["spec"]),
        runtime=Runtime.model_validate_json(r["runtime"]),
        lease_id=r["lease_id"],
        deletion=EnvDeletion.model_validate_json(r["deletion"]) if r["deletion"] else None,
    )
