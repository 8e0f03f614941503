"""Records → the contract's JSON shapes (Env, Version, Project)."""

from __future__ import annotations

from typing import Any

from denv.server.node.egress import public as public_egress
from denv.server.records import EnvRecord, EnvStatus, VersionRecord
from denv.server.tokens import IngressKeys

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


def env_json(
    rec: EnvRecord,
    version: VersionRecord | None,
    states: dict[str, str],
    base_url: str,
    keys: IngressKeys | None = None,
) -> dict[str, Any]:
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


def version_layers(rec: VersionRecord) -> list[str]:
    """Every layer of a version's volumes, once each."""
    return list(dict.fromkeys(x for v in rec.volumes for x in v.layers))


def version_json(rec: VersionRecord, storage: str | None = None) -> dict[str, Any]:
    """The contract's Version; ``storage`` from the node (``Node.layer_storage``)."""
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
