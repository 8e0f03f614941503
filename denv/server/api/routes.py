"""The contract's operations (``openapi/denv.yaml``), one handler each: HTTP only.

A handler parses the request (FastAPI and the models of ``lifecycle.requests`` validate it),
calls one ``Service`` method on a worker thread, and renders the record it returns as the
contract's JSON (``render``; or a 204); creates go through ``idempotent`` so an
``Idempotency-Key`` replays the first answer.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Header, Query, Request, Response

from denv.server import __version__
from denv.server.api import render
from denv.server.api.idempotency import idempotent
from denv.server.auth import owner_from_request
from denv.server.errors import invalid
from denv.server.lifecycle.requests import (
    DeployRequest,
    EnvsCreate,
    LeaseCreate,
    SandboxCreate,
    SnapshotRequest,
    WaitRequest,
)
from denv.server.lifecycle.service import Service
from denv.server.records import EnvStatus

log = logging.getLogger(__name__)
router = APIRouter()
Owner = Annotated[str, Depends(owner_from_request)]
IdemKey = Annotated[str | None, Header(alias="Idempotency-Key", min_length=1, max_length=255)]
Limit = Annotated[int, Query(ge=1, le=200)]
Cursor = Annotated[str | None, Query(max_length=512)]
_PROJECT = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


def service(request: Request) -> Service:
    value: Service = request.app.state.service
    return value


Dep = Annotated[Service, Depends(service)]


def _cursor(cursor: str | None) -> str | None:
    """A cursor is the last id (or project name) of the previous page; pages go past it."""
    return cursor or None


@router.get("/v1/health")
async def get_health(s: Dep) -> dict[str, Any]:
    engine = await asyncio.to_thread(s.engine_version)
    guard = s.ctx.host_guard.status()
    return {"status": "ok", "version": __version__, "engine": engine, "host_guard": guard}


@router.post("/v1/sandboxes")
async def create_sandbox(
    request: Request, s: Dep, owner: Owner, body: SandboxCreate, idem: IdemKey = None
) -> Response:
    async def run() -> dict[str, Any]:
        made = await s.ctx.fair.run(owner, "creates", s.create_sandbox, owner, body)
        return render.Edge.of(s.ctx).made(made)

    return await idempotent(request, s.ctx.store, owner, idem, run)


@router.get("/v1/envs")
async def list_envs(
    s: Dep,
    owner: Owner,
    limit: Limit = 50,
    cursor: Cursor = None,
    status: EnvStatus | None = None,
    version_id: Annotated[str | None, Query(pattern=r"^ver_[0-9A-HJKMNP-TV-Z]{26}$")] = None,
    include_deleted: bool = False,
) -> dict[str, Any]:
    page = await asyncio.to_thread(
        s.list_envs, owner, limit, _cursor(cursor), status, version_id, include_deleted
    )
    return render.Edge.of(s.ctx).env_page(page)


@router.get("/v1/envs/{env_id}")
async def get_env(s: Dep, owner: Owner, env_id: str) -> dict[str, Any]:
    return render.Edge.of(s.ctx).env(await asyncio.to_thread(s.get_env, owner, env_id))


@router.delete("/v1/envs/{env_id}", status_code=204)
async def delete_env(s: Dep, owner: Owner, env_id: str) -> Response:
    await asyncio.to_thread(s.delete_env, owner, env_id)
    return Response(status_code=204)


@router.post("/v1/envs/{env_id}/wait")
async def wait_env(s: Dep, owner: Owner, env_id: str, body: WaitRequest) -> dict[str, Any]:
    done = await s.ctx.fair.run(
        owner, "waits", s.wait_env, owner, env_id, body.until, body.timeout_s
    )
    return render.Edge.of(s.ctx).env(done)


@router.post("/v1/envs/{env_id}/detach")
async def detach_env(s: Dep, owner: Owner, env_id: str) -> dict[str, Any]:
    return render.Edge.of(s.ctx).env(await asyncio.to_thread(s.detach_env, owner, env_id))


@router.get("/v1/envs/{env_id}/warm")
async def get_warm_pool(s: Dep, owner: Owner, env_id: str) -> dict[str, Any]:
    return render.pool_json(await asyncio.to_thread(s.warm_pool, owner, env_id))


@router.get("/v1/envs/{env_id}/logs")
async def get_env_logs(
    s: Dep,
    owner: Owner,
    env_id: str,
    service: Annotated[str | None, Query(pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$")] = None,
    tail: Annotated[int, Query(ge=1, le=10000)] = 100,
) -> dict[str, Any]:
    return render.logs_json(await asyncio.to_thread(s.logs, owner, env_id, service, tail))


@router.post("/v1/envs/{env_id}/snapshot")
async def snapshot_env(
    request: Request,
    s: Dep,
    owner: Owner,
    env_id: str,
    body: Annotated[SnapshotRequest | None, Body()] = None,
    idem: IdemKey = None,
) -> Response:
    labels = body.labels if body else {}

    async def run() -> dict[str, Any]:
        made = await s.ctx.fair.run(owner, "creates", s.snapshot, owner, env_id, labels)
        return render.version_json(made)

    return await idempotent(request, s.ctx.store, owner, idem, run)


@router.post("/v1/envs/{env_id}/fork")
async def fork_env(
    request: Request,
    s: Dep,
    owner: Owner,
    env_id: str,
    body: Annotated[EnvsCreate | None, Body()] = None,
    idem: IdemKey = None,
) -> Response:
    opts = body or EnvsCreate()

    async def run() -> dict[str, Any]:
        return render.Edge.of(s.ctx).made(
            await s.ctx.fair.run(owner, "creates", s.fork, owner, env_id, opts)
        )

    return await idempotent(request, s.ctx.store, owner, idem, run)


@router.get("/v1/versions")
async def list_versions(
    s: Dep,
    owner: Owner,
    limit: Limit = 50,
    cursor: Cursor = None,
    project: Annotated[str | None, Query(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")] = None,
) -> dict[str, Any]:
    page = await asyncio.to_thread(s.list_versions, owner, limit, _cursor(cursor), project)
    return render.page_json(page, render.version_json)


@router.get("/v1/versions/{version_id}")
async def get_version(s: Dep, owner: Owner, version_id: str) -> dict[str, Any]:
    return render.version_json(await asyncio.to_thread(s.get_version, owner, version_id))


@router.delete("/v1/versions/{version_id}", status_code=204)
async def delete_version(s: Dep, owner: Owner, version_id: str) -> Response:
    await asyncio.to_thread(s.delete_version, owner, version_id)
    return Response(status_code=204)


@router.post("/v1/gc")
async def collect_versions(s: Dep, owner: Owner) -> dict[str, Any]:
    freed = await asyncio.to_thread(s.gc, owner)
    return render.collected_json(freed.versions, freed.layers, freed.bytes)


@router.get("/v1/versions/{version_id}/diff")
async def diff_versions(
    s: Dep,
    owner: Owner,
    version_id: str,
    base: Annotated[str, Query(pattern=r"^ver_[0-9A-HJKMNP-TV-Z]{26}$")],
) -> dict[str, Any]:
    return render.diff_json(await asyncio.to_thread(s.diff_versions, owner, base, version_id))


@router.post("/v1/versions/{version_id}/envs")
async def create_envs_from_version(
    request: Request,
    s: Dep,
    owner: Owner,
    version_id: str,
    body: Annotated[EnvsCreate | None, Body()] = None,
    idem: IdemKey = None,
) -> Response:
    opts = body or EnvsCreate()

    async def run() -> dict[str, Any]:
        made = await s.ctx.fair.run(
            owner, "creates", s.create_from_version, owner, version_id, opts
        )
        return render.Edge.of(s.ctx).made(made)

    return await idempotent(request, s.ctx.store, owner, idem, run)


@router.get("/v1/projects")
async def list_projects(
    s: Dep, owner: Owner, limit: Limit = 50, cursor: Cursor = None
) -> dict[str, Any]:
    page = await asyncio.to_thread(s.list_projects, owner, limit, _cursor(cursor))
    return render.page_json(page, render.project_json)


@router.post("/v1/projects/{name}/deploy")
async def deploy_project(
    request: Request,
    s: Dep,
    owner: Owner,
    name: str,
    body: DeployRequest,
    idem: IdemKey = None,
) -> Response:
    if not _PROJECT.match(name):
        raise invalid(
            f"name: '{name}' is not a project name (lower-case letters, digits and "
            "dashes, at most 63)",
            "name",
        )

    async def run() -> dict[str, Any]:
        version = await s.ctx.fair.run(
            owner, "creates", s.deploy, owner, name, body.compose, body.labels
        )
        return render.version_json(version)

    return await idempotent(request, s.ctx.store, owner, idem, run)


@router.post("/v1/leases")
async def open_lease(
    request: Request,
    s: Dep,
    owner: Owner,
    body: Annotated[LeaseCreate | None, Body()] = None,
    idem: IdemKey = None,
) -> Response:
    if (await request.body()).strip() == b"null":  # optional, but an object when sent
        raise invalid('body: send a JSON object ({} or {"timeout_s": 30}), or none', "body")
    timeout_s = body.given_timeout_s() if body else None

    async def run() -> dict[str, Any]:
        return render.lease_json(await asyncio.to_thread(s.open_lease, owner, timeout_s))

    return await idempotent(request, s.ctx.store, owner, idem, run)


@router.get("/v1/leases/{lease_id}")
async def get_lease(s: Dep, owner: Owner, lease_id: str) -> dict[str, Any]:
    return render.lease_json(await asyncio.to_thread(s.get_lease, owner, lease_id))


@router.delete("/v1/leases/{lease_id}", status_code=204)
async def close_lease(s: Dep, owner: Owner, lease_id: str) -> Response:
    await asyncio.to_thread(s.close_lease, owner, lease_id)
    return Response(status_code=204)


@router.post("/v1/leases/{lease_id}/renew")
async def renew_lease(s: Dep, owner: Owner, lease_id: str) -> dict[str, Any]:
    # No fairness cap: a renewal that waits behind a key's own creates could let it expire.
    return render.lease_json(await asyncio.to_thread(s.renew_lease, owner, lease_id))
