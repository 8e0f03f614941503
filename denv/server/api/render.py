"""What the lifecycle answers (``lifecycle.shown``) -> the contract's JSON shapes.

The one place the server's answers take the shape ``openapi/denv.yaml`` gives them: an Env
(its endpoints' URLs made here, from the server's public address and ingress keys), a
Version, a fork's or a batch's envs, a page, a Lease, a WarmPool, logs, a VersionDiff, what a
collection freed, a Project. Routes (``api.routes``, the console's) call these; nothing below
the API knows the wire's shapes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any, TypeVar

from denv.server.db import iso_at
from denv.server.lifecycle.context import Context
from denv.server.lifecycle.shown import (
    EnvShown,
    LeaseShown,
    Logs,
    Made,
    Page,
    PoolShown,
    Project,
    VersionDiff,
    VersionShown,
)
from denv.server.node.egress import public as public_egress
from denv.server.records import EnvRecord, EnvStatus
from denv.server.tokens import IngressKeys

T = TypeVar("T")

_VERSION_SERVICE_KEYS = {
    "name",
    "image",
    "image_digest",
    "command",
    "env",
    "ports",
    "volumes",
    "depends_on",
    "health_path",
}


def _endpoints(rec: EnvRecord, base_url: str, keys: IngressKeys | None) -> list[dict[str, Any]]:
    out = []
    for e in rec.runtime.endpoints:
        token = e.token or (keys.token(rec.id, e.service, e.port) if keys else None)
        url = f"{base_url}/ingress/{token}" if e.via == "ingress" and token else e.url
        out.append({"service": e.service, "port": e.port, "url": url, "via": e.via})
    return out


def env_json(shown: EnvShown, base_url: str, keys: IngressKeys | None = None) -> dict[str, Any]:
    """The contract's Env; its ingress endpoints' URLs under ``base_url``."""
    rec, version, states = shown.rec, shown.version, shown.states
    containers = rec.runtime.containers
    services = []
    for svc in version.services if version else []:
        cid = containers.get(svc.name)
        status = states.get(cid, "missing") if cid else "missing"
        if rec.status == EnvStatus.CREATING and cid is None:
            status = "created"
        services.append(
            {
                "name": svc.name,
                "image": svc.image,
                "image_digest": svc.image_digest,
                "status": status,
                "start": rec.start,
            }
        )
    return {
        "id": rec.id,
        "status": rec.status.value,
        "version_id": rec.version_id,
        "parent_id": rec.parent_id,
        "project": rec.project,
        "agent_service": rec.agent_service,
        "egress": public_egress(rec.egress),
        "labels": rec.labels,
        "services": services,
        "endpoints": _endpoints(rec, base_url, keys) if rec.status != EnvStatus.DELETED else [],
        "start": rec.start,
        "live": rec.spec.live and rec.runtime.live_unsupported is None,
        "live_unsupported": rec.runtime.live_unsupported,
        "node": rec.runtime.node,
        "spill": rec.spec.spill,
        "created_at": rec.created_at,
        "expires_at": rec.expires_at,
        "error": rec.error.model_dump() if rec.error else None,
        "lease_id": rec.lease_id,
        "deletion": rec.deletion.model_dump() if rec.deletion else None,
    }


def version_json(shown: VersionShown) -> dict[str, Any]:
    """The contract's Version; its ``storage`` the node's (``Node.layer_storage``)."""
    rec, storage = shown.rec, shown.storage
    return {
        "id": rec.id,
        "project": rec.project,
        "parent_env_id": rec.parent_env_id,
        "parent_version_id": rec.parent_version_id,
        "agent_service": rec.agent_service,
        "services": [s.model_dump(include=_VERSION_SERVICE_KEYS) for s in rec.services],
        "layer_depth": max((len(v.layers) for v in rec.volumes), default=0),
        "warm_fork": rec.warm_fork,
        "labels": rec.labels,
        "created_at": rec.created_at,
        "tools": rec.tools,
        "storage": storage,
        "size_bytes": rec.size_bytes,
        "implicit": rec.implicit,
    }


class Edge:
    """What an Env's JSON needs of the server: its public address and ingress keys."""

    def __init__(self, base_url: str, keys: IngressKeys | None) -> None:
        self.base_url, self.keys = base_url, keys

    @classmethod
    def of(cls, ctx: Context) -> Edge:
        """The server's: its public address (``--public-url``) and its ingress keys."""
        return cls(ctx.config.public_url(), ctx.ingress_keys)

    def env(self, shown: EnvShown) -> dict[str, Any]:
        return env_json(shown, self.base_url, self.keys)

    def made(self, made: Made) -> dict[str, Any]:
        """A create of one env: its Env; a batch: ``{"envs"}``; a fork: with its version."""
        envs = [self.env(e) for e in made.envs]
        if made.one:
            return envs[0]
        if made.version is None:
            return {"envs": envs}
        return {"version": version_json(made.version), "envs": envs}

    def env_page(self, page: Page[EnvShown]) -> dict[str, Any]:
        return page_json(page, self.env)


def page_json(page: Page[T], item: Callable[[T], dict[str, Any]]) -> dict[str, Any]:
    """The contract's pages: ``items`` (each rendered by ``item``) and ``next_cursor``."""
    return {"items": [item(x) for x in page.items], "next_cursor": page.next_cursor}


def lease_json(shown: LeaseShown) -> dict[str, Any]:
    """The contract's Lease."""
    lease = shown.lease
    return {
        "id": lease.id,
        "state": lease.state,
        "timeout_s": lease.timeout_s,
        "expires_at": iso_at(lease.expires_at),
        "created_at": iso_at(lease.created_at),
        "ended_at": None if lease.ended_at is None else iso_at(lease.ended_at),
        "envs": shown.envs,
    }


def pool_json(pool: PoolShown) -> dict[str, Any]:
    """The contract's WarmPool."""
    return asdict(pool)


def logs_json(logs: Logs) -> dict[str, Any]:
    return asdict(logs)


def diff_json(diff: VersionDiff) -> dict[str, Any]:
    """The contract's VersionDiff."""
    return asdict(diff)


def project_json(project: Project) -> dict[str, Any]:
    return asdict(project)


def collected_json(versions: int, layers: int, freed_bytes: int) -> dict[str, Any]:
    """What ``POST /v1/gc`` deleted."""
    return {"versions_deleted": versions, "layers_deleted": layers, "bytes_freed": freed_bytes}
