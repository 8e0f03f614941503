"""The contract's operations (``openapi/denv.yaml``), one handler each.

Handlers validate, check ownership (another key's resources are 404), and run the blocking
work in threads; the lifecycle itself lives in ``envs`` and ``versions``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Header, Query, Request, Response

from . import ids
from .auth import owner_from_request
from .config import MAX_COUNT
from .context import Context
from .envs import HEALTHY_OR_DONE, RUNNING_OR_LATER, Envs
from .errors import ApiError, invalid, not_found
from .idempotency import idempotent
from .limits import check_volume_sizes
from .models import DeployRequest, EnvsCreate, SandboxCreate, SnapshotRequest, WaitRequest
from .render import env_json, version_json
from .store import EnvRecord, VersionRecord
from .versions import Versions

log = logging.getLogger(__name__)
router = APIRouter()
Owner = Annotated[str, Depends(owner_from_request)]
IdemKey = Annotated[str | None, Header(alias="Idempotency-Key", min_length=1, max_length=255)]
Limit = Annotated[int, Query(ge=1, le=200)]
Cursor = Annotated[str | None, Query(max_length=512)]
EnvStatus = Literal["creating", "starting", "running", "healthy", "failed", "deleted"]
WAIT_MARGIN_S = 30.0
_PROJECT = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


@dataclass
class Core:
    ctx: Context
    envs: Envs
    versions: Versions


def core(request: Request) -> Core:
    value: Core = request.app.state.core
    return value


Dep = Annotated[Core, Depends(core)]


def _decode_cursor(cursor: str | None) -> str | None:
    """A cursor is the last id (or project name) of the previous page; pages go past it."""
    return cursor or None


def _page(items: list[Any], limit: int, last: str) -> str | None:
    return last if len(items) > limit else None


def _owned_env(c: Core, owner: str, env_id: str) -> EnvRecord:
    rec = c.ctx.store.get_env(env_id) if ids.is_id(env_id, "env") else None
    if rec is None or rec.owner != owner:
        raise not_found("env", env_id)
    return rec


def _states(c: Core, env_id: str | None = None) -> dict[str, str] | None:
    try:
        return c.ctx.engine.states(env_id)
    except ApiError:
        return None  # engine down: report services as missing, do not fail envs


def _env_view(c: Core, rec: EnvRecord, states: dict[str, str] | None) -> dict[str, Any]:
    if states is not None:
        rec = c.envs.observe(rec, states)
    version = c.ctx.store.get_version(rec.version_id, include_deleted=True)
    return env_json(rec, version, states or {}, c.ctx.config.public_url())


def _wait_all(c: Core, recs: list[EnvRecord], wait: str, timeout_s: float) -> list[dict[str, Any]]:
    until = {
        "none": {"creating"} | RUNNING_OR_LATER,
        "running": RUNNING_OR_LATER,
        "healthy": HEALTHY_OR_DONE,
    }[wait]
    done = [c.envs.wait(r.id, until, timeout_s + WAIT_MARGIN_S) for r in recs]
    states = _states(c)
    return [_env_view(c, r, states) for r in done]


def _check_count(c: Core, owner: str, count: int) -> None:
    if count > MAX_COUNT:
        raise ApiError(
            422,
            "limit_exceeded",
            f"count {count} is above the limit of {MAX_COUNT} envs per request: "
            "make several requests",
            {"path": "count"},
        )
    limit = c.ctx.config.max_envs_per_key
    live = c.ctx.store.count_live(owner)
    if live + count > limit:
        raise ApiError(
            429,
            "quota_exceeded",
            f"this API key has {live} live env(s); {count} more would pass the "
            f"limit of {limit}: delete envs you no longer need",
        )


@router.get("/v1/health")
async def get_health(c: Dep) -> dict[str, str]:
    from denv.server import __version__

    engine = await asyncio.to_thread(c.ctx.engine.version)
    return {"status": "ok", "version": __version__, "engine": engine}


@router.post("/v1/sandboxes")
async def create_sandbox(
    request: Request, c: Dep, owner: Owner, body: SandboxCreate, idem: IdemKey = None
) -> Response:
    async def run() -> dict[str, Any]:
        await asyncio.to_thread(_check_count, c, owner, 1)
        data = body.model_dump()
        version = await asyncio.to_thread(c.versions.implicit, owner, data)
        recs = await asyncio.to_thread(
            c.envs.create,
            owner,
            version,
            1,
            egress=body.egress,
            env={},
            labels=body.labels,
            ttl_s=body.ttl_s,
            wait_timeout_s=body.wait_timeout_s,
            warm=body.warm,
        )
        return (await asyncio.to_thread(_wait_all, c, recs, body.wait, body.wait_timeout_s))[0]

    return await idempotent(request, c.ctx.store, owner, idem, run)


@router.get("/v1/envs")
async def list_envs(
    c: Dep,
    owner: Owner,
    limit: Limit = 50,
    cursor: Cursor = None,
    status: EnvStatus | None = None,
    version_id: Annotated[str | None, Query(pattern=r"^ver_[0-9A-HJKMNP-TV-Z]{26}$")] = None,
) -> dict[str, Any]:
    def work() -> dict[str, Any]:
        recs = c.ctx.store.list_envs(owner, limit + 1, _decode_cursor(cursor), status, version_id)
        states = _states(c)
        items = [_env_view(c, r, states) for r in recs[:limit]]
        return {
            "items": items,
            "next_cursor": _page(recs, limit, recs[limit - 1].id if len(recs) > limit else ""),
        }

    return await asyncio.to_thread(work)


@router.get("/v1/envs/{env_id}")
async def get_env(c: Dep, owner: Owner, env_id: str) -> dict[str, Any]:
    def work() -> dict[str, Any]:
        rec = _owned_env(c, owner, env_id)
        return _env_view(c, rec, _states(c, rec.id))

    return await asyncio.to_thread(work)


@router.delete("/v1/envs/{env_id}", status_code=204)
async def delete_env(c: Dep, owner: Owner, env_id: str) -> Response:
    rec = await asyncio.to_thread(_owned_env, c, owner, env_id)
    await asyncio.to_thread(c.envs.delete, rec.id)
    return Response(status_code=204)


@router.post("/v1/envs/{env_id}/wait")
async def wait_env(c: Dep, owner: Owner, env_id: str, body: WaitRequest) -> dict[str, Any]:
    rec = await asyncio.to_thread(_owned_env, c, owner, env_id)
    until = {"running": RUNNING_OR_LATER, "healthy": HEALTHY_OR_DONE, "deleted": {"deleted"}}[
        body.until
    ]
    done = await asyncio.to_thread(c.envs.wait, rec.id, until, body.timeout_s)
    return await asyncio.to_thread(_env_view, c, done, _states(c, rec.id))


@router.get("/v1/envs/{env_id}/warm")
async def get_warm_pool(c: Dep, owner: Owner, env_id: str) -> dict[str, Any]:
    rec = await asyncio.to_thread(_owned_env, c, owner, env_id)
    return c.envs.warm.status(rec.id)


@router.get("/v1/envs/{env_id}/logs")
async def get_env_logs(
    c: Dep,
    owner: Owner,
    env_id: str,
    service: Annotated[str | None, Query(pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$")] = None,
    tail: Annotated[int, Query(ge=1, le=10000)] = 100,
) -> dict[str, Any]:
    def work() -> dict[str, Any]:
        rec = _owned_env(c, owner, env_id)
        name = service or rec.agent_service
        version = c.ctx.store.get_version(rec.version_id)
        if version is not None and name not in {s["name"] for s in version.services}:
            raise invalid(f"service: env {rec.id} has no service '{name}'", "service")
        return {"env_id": rec.id, "service": name, "lines": c.envs.logs(rec, name, tail)}

    return await asyncio.to_thread(work)


@router.post("/v1/envs/{env_id}/snapshot")
async def snapshot_env(
    request: Request,
    c: Dep,
    owner: Owner,
    env_id: str,
    body: Annotated[SnapshotRequest | None, Body()] = None,
    idem: IdemKey = None,
) -> Response:
    async def run() -> dict[str, Any]:
        rec = await asyncio.to_thread(_owned_env, c, owner, env_id)
        labels = body.labels if body else {}
        await asyncio.to_thread(check_volume_sizes, c.ctx, rec)
        return version_json(await asyncio.to_thread(c.versions.snapshot, rec, labels))

    return await idempotent(request, c.ctx.store, owner, idem, run)


def _start_from(
    c: Core, owner: str, version: VersionRecord, body: EnvsCreate, egress: str
) -> list[EnvRecord]:
    return c.envs.create(
        owner,
        version,
        body.count,
        egress=egress,
        env=body.env,
        labels=body.labels,
        ttl_s=body.ttl_s,
        wait_timeout_s=body.wait_timeout_s,
        warm=body.warm,
        use_spares=True,
    )


@router.post("/v1/envs/{env_id}/fork")
async def fork_env(
    request: Request,
    c: Dep,
    owner: Owner,
    env_id: str,
    body: Annotated[EnvsCreate | None, Body()] = None,
    idem: IdemKey = None,
) -> Response:
    opts = body or EnvsCreate()

    async def run() -> dict[str, Any]:
        rec = await asyncio.to_thread(_owned_env, c, owner, env_id)
        await asyncio.to_thread(_check_count, c, owner, opts.count)
        await asyncio.to_thread(check_volume_sizes, c.ctx, rec)
        t0 = time.perf_counter()
        version = await asyncio.to_thread(c.versions.snapshot, rec, {})
        t1 = time.perf_counter()
        recs = await asyncio.to_thread(
            _start_from, c, owner, version, opts, opts.egress or rec.egress
        )
        t2 = time.perf_counter()
        envs = await asyncio.to_thread(_wait_all, c, recs, opts.wait, opts.wait_timeout_s)
        log.info(
            "fork env %s into %d (%d warm): snapshot %.1f ms, create %.1f ms, wait %.1f ms",
            rec.id,
            len(recs),
            sum(r.start == "warm" for r in recs),
            (t1 - t0) * 1000,
            (t2 - t1) * 1000,
            (time.perf_counter() - t2) * 1000,
        )
        return {"version": version_json(version), "envs": envs}

    return await idempotent(request, c.ctx.store, owner, idem, run)


@router.get("/v1/versions")
async def list_versions(
    c: Dep,
    owner: Owner,
    limit: Limit = 50,
    cursor: Cursor = None,
    project: Annotated[str | None, Query(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")] = None,
) -> dict[str, Any]:
    def work() -> dict[str, Any]:
        recs = c.ctx.store.list_versions(owner, limit + 1, _decode_cursor(cursor), project)
        last = recs[limit - 1].id if len(recs) > limit else ""
        return {
            "items": [version_json(r) for r in recs[:limit]],
            "next_cursor": _page(recs, limit, last),
        }

    return await asyncio.to_thread(work)


@router.get("/v1/versions/{version_id}")
async def get_version(c: Dep, owner: Owner, version_id: str) -> dict[str, Any]:
    return version_json(await asyncio.to_thread(c.versions.get_owned, owner, version_id))


@router.delete("/v1/versions/{version_id}", status_code=204)
async def delete_version(c: Dep, owner: Owner, version_id: str) -> Response:
    await asyncio.to_thread(c.versions.delete, owner, version_id)
    return Response(status_code=204)


@router.post("/v1/versions/{version_id}/envs")
async def create_envs_from_version(
    request: Request,
    c: Dep,
    owner: Owner,
    version_id: str,
    body: Annotated[EnvsCreate | None, Body()] = None,
    idem: IdemKey = None,
) -> Response:
    opts = body or EnvsCreate()

    async def run() -> dict[str, Any]:
        version = await asyncio.to_thread(c.versions.get_owned, owner, version_id)
        await asyncio.to_thread(_check_count, c, owner, opts.count)
        egress = opts.egress or _version_egress(c, version)
        recs = await asyncio.to_thread(_start_from, c, owner, version, opts, egress)
        return {"envs": await asyncio.to_thread(_wait_all, c, recs, opts.wait, opts.wait_timeout_s)}

    return await idempotent(request, c.ctx.store, owner, idem, run)


def _version_egress(c: Core, version: VersionRecord) -> str:
    """A version keeps the egress of the env it came from; deny otherwise."""
    parent = c.ctx.store.get_env(version.parent_env_id) if version.parent_env_id else None
    return parent.egress if parent else "deny"


@router.get("/v1/projects")
async def list_projects(
    c: Dep, owner: Owner, limit: Limit = 50, cursor: Cursor = None
) -> dict[str, Any]:
    def work() -> dict[str, Any]:
        rows = c.ctx.store.list_projects(owner, limit + 1, _decode_cursor(cursor))
        items = [
            {"name": n, "latest_version_id": v, "version_count": k, "created_at": t}
            for n, t, v, k in rows[:limit]
        ]
        last = rows[limit - 1][0] if len(rows) > limit else ""
        return {"items": items, "next_cursor": _page(rows, limit, last)}

    return await asyncio.to_thread(work)


@router.post("/v1/projects/{name}/deploy")
async def deploy_project(
    request: Request,
    c: Dep,
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
        version = await asyncio.to_thread(c.versions.deploy, owner, name, body.compose, body.labels)
        return version_json(version)

    return await idempotent(request, c.ctx.store, owner, idem, run)
