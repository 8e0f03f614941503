"""The console's routes under ``/ui``: the page, its assets, sign-in, and the calls it makes.

The page calls ``/ui/api/...`` with its cookie (``console.session``), never the bearer API;
every call goes to the same ``Service`` methods as the API's, for the signed-in key only.
``/ui/api/events`` is a Server-Sent Events stream of the key's envs and versions
(``console.tree``): the whole view, then what changed, pushed after each write to the store;
and of what its envs use (``console.usage``), sampled while a stream is open.
``/ui/api/envs/{id}/logs/events`` streams an env's log as it is written.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from denv.server.api import render
from denv.server.console import page, tree, usage
from denv.server.console.feed import Feed
from denv.server.console.session import console_owner, sign_in, sign_out, signed_in_owner
from denv.server.console.usage import Meter
from denv.server.lifecycle.requests import EnvsCreate
from denv.server.lifecycle.service import Service

log = logging.getLogger(__name__)
router = APIRouter(include_in_schema=False)
Owner = Annotated[str, Depends(console_owner)]

#: A burst of writes (a fork of 64) is pushed as one change, this long after the first; or
#: as long as the last view took to make, so a stream of forks never keeps the server busy
#: making views more than half the time (a view of 1,000 nodes takes tens of ms).
COALESCE_S = 0.05
#: An idle stream sends a comment this often, so proxies and the browser keep it open.
KEEPALIVE_S = 15.0
MAX_FORK = 64
#: A log stream asks the node for new lines this long at a time (its thread is held).
LOG_WAIT_S = 5.0


def service(request: Request) -> Service:
    value: Service = request.app.state.service
    return value


Dep = Annotated[Service, Depends(service)]


class SignIn(BaseModel):
    key: str = Field(min_length=1, max_length=200)


class Fork(BaseModel):
    count: int = Field(default=1, ge=1, le=MAX_FORK)


@router.get("/ui")
@router.get("/ui/")
async def get_page(request: Request) -> Response:
    """The page; for a signed-in key, with its view inside, so it draws at once."""
    owner = signed_in_owner(request)
    view = None
    if owner is not None:
        gen, nodes = await asyncio.to_thread(_feed(request).view, owner)
        view = {
            "gen": gen,
            "nodes": list(nodes.values()),
            "usage": _meter(request).latest(owner)[1],
        }
    return Response(page.html(view), media_type="text/html", headers=page.headers())


@router.post("/ui/session", status_code=204)
async def post_session(request: Request, body: SignIn) -> Response:
    response = Response(status_code=204)
    sign_in(request, response, body.key)
    return response


@router.delete("/ui/session", status_code=204)
async def delete_session() -> Response:
    response = Response(status_code=204)
    sign_out(response)
    return response


@router.get("/ui/api/whoami")
async def whoami(owner: Owner) -> dict[str, Any]:
    return {"owner": owner[:12]}  # a prefix of the key's digest: which key, not the key


@router.get("/ui/api/envs/{env_id}")
async def get_env(s: Dep, owner: Owner, env_id: str) -> dict[str, Any]:
    def read() -> dict[str, Any]:
        env = render.Edge.of(s.ctx).env(s.get_env(owner, env_id))
        asked = usage.metered(s.owned_env(owner, env_id))
        memory = cpu = None
        if asked is not None:
            try:
                [used] = s.ctx.node.usage([asked])
                memory, cpu = used.memory_bytes, used.cpu_s
            except Exception:  # the engine is down: show the env without it
                log.debug("usage of %s not read", env_id, exc_info=True)
        return {**env, "memory_bytes": memory, "cpu_s": cpu}

    return await asyncio.to_thread(read)


@router.get("/ui/api/envs/{env_id}/logs")
async def logs(
    s: Dep, owner: Owner, env_id: str, tail: Annotated[int, Query(ge=1, le=2000)] = 200
) -> dict[str, Any]:
    return render.logs_json(await asyncio.to_thread(s.logs, owner, env_id, None, tail))


@router.get("/ui/api/envs/{env_id}/logs/events")
async def log_events(
    s: Dep, owner: Owner, env_id: str, tail: Annotated[int, Query(ge=1, le=2000)] = 200
) -> StreamingResponse:
    """The env's log as Server-Sent Events: ``lines`` (its last ``tail`` first, then each
    batch as it is written) and ``end`` when it has no more (its container is gone)."""
    rec = await asyncio.to_thread(s.owned_env, owner, env_id)  # 404 for another key's env
    node, service = s.ctx.node, rec.agent_service

    async def stream() -> AsyncIterator[str]:
        cursor: str | None = None
        while True:
            lines, after = await asyncio.to_thread(
                node.logs_after, env_id, service, cursor, tail, LOG_WAIT_S
            )
            if lines or cursor is None:
                yield _event("lines", {"lines": lines})
            elif after == cursor:
                yield ": keep-alive\n\n"  # a closed page ends the stream at this write
            if after is None:
                yield _event("end", {})
                return
            cursor = after

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"cache-control": "no-store", "x-accel-buffering": "no"},
    )


@router.delete("/ui/api/envs/{env_id}")
async def delete_env(s: Dep, owner: Owner, env_id: str) -> dict[str, Any]:
    await asyncio.to_thread(s.delete_env, owner, env_id)
    return {"deleted": [env_id]}


@router.post("/ui/api/envs/{env_id}/delete-subtree")
async def delete_subtree(request: Request, s: Dep, owner: Owner, env_id: str) -> dict[str, Any]:
    """Delete an env and every env that grew from it, deepest first."""

    def run() -> list[str]:
        s.owned_env(owner, env_id)  # 404 for another key's env
        nodes = tree.view(s.ctx.store, owner, "", None)
        deleted = []
        for node_id in tree.subtree(nodes, env_id):
            node = nodes.get(node_id)
            if node and node["kind"] == "env" and node["status"] != "deleted":
                s.delete_env(owner, node_id)
                deleted.append(node_id)
        return deleted

    return {"deleted": await asyncio.to_thread(run)}


@router.post("/ui/api/envs/{env_id}/fork")
async def fork(s: Dep, owner: Owner, env_id: str, body: Annotated[Fork, Body()]) -> dict[str, Any]:
    """Fork n: live when the env runs live, else from a snapshot of its volumes."""
    opts = EnvsCreate(count=body.count, kind="auto", wait="running")
    made = await s.ctx.fair.run(owner, "creates", s.fork, owner, env_id, opts)
    version = made.version.rec.id if made.version else None
    return {"version": version, "envs": [e.rec.id for e in made.envs]}


@router.post("/ui/api/envs/{env_id}/snapshot")
async def snapshot(s: Dep, owner: Owner, env_id: str) -> dict[str, Any]:
    version = await s.ctx.fair.run(owner, "creates", s.snapshot, owner, env_id, {})
    return {"version": version.rec.id}


@router.get("/ui/api/events")
async def events(
    request: Request,
    owner: Owner,
    since: Annotated[int | None, Query(ge=0)] = None,
) -> StreamingResponse:
    """The key's view, then its changes, as Server-Sent Events: ``view`` (every node),
    ``change`` (nodes new or changed, ids gone), ``usage`` (its envs' memory and CPU: all
    of it, then what changed) and ``ready``. A page rendered with the view of generation
    ``since`` gets only what changed after it (or the whole view, if that one is no longer
    kept)."""
    feed, meter = _feed(request), _meter(request)

    async def stream() -> AsyncIterator[str]:
        changed = feed.subscribe()
        meter.watch(owner, changed)
        try:
            base = feed.kept(owner, since) if since is not None else None
            t0 = time.monotonic()
            gen, nodes = await asyncio.to_thread(feed.view, owner)
            took = time.monotonic() - t0
            if base is None:
                yield _event("view", {"nodes": list(nodes.values())})
            else:
                diff = tree.changes(base, nodes)
                if diff["upsert"] or diff["remove"]:
                    yield _event("change", diff)
            used_gen, used = meter.latest(owner)
            yield _event("usage", {"set": used, "remove": [], "whole": True})
            yield _event("ready", {})
            while True:
                try:
                    await asyncio.wait_for(changed.wait(), KEEPALIVE_S)
                except TimeoutError:
                    yield ": keep-alive\n\n"
                    continue
                if feed.generation != gen:
                    await asyncio.sleep(max(COALESCE_S, took))
                changed.clear()  # before reading: a write from now on is seen next time
                if feed.generation != gen:
                    t0 = time.monotonic()
                    gen, after = await asyncio.to_thread(feed.view, owner)
                    took = time.monotonic() - t0
                    diff = tree.changes(nodes, after)
                    nodes = after
                    if diff["upsert"] or diff["remove"]:
                        yield _event("change", diff)
                if meter.latest(owner)[0] != used_gen:
                    before = used
                    used_gen, used = meter.latest(owner)
                    yield _event("usage", usage.diff(before, used))
        finally:
            meter.unwatch(owner, changed)
            feed.unsubscribe(changed)

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"cache-control": "no-store", "x-accel-buffering": "no"},
    )


def _feed(request: Request) -> Feed:
    """The app's feed, made at its first use (one per app: one store watcher)."""
    feed: Feed | None = getattr(request.app.state, "console_feed", None)
    if feed is None:
        s: Service = request.app.state.service
        feed = Feed(s.ctx.store, s.ctx.config.public_url(), s.ctx.ingress_keys)
        request.app.state.console_feed = feed
    return feed


def _meter(request: Request) -> Meter:
    """The app's usage meter, made at its first use."""
    meter: Meter | None = getattr(request.app.state, "console_meter", None)
    if meter is None:
        s: Service = request.app.state.service
        meter = Meter(s.ctx.store, s.ctx.node)
        request.app.state.console_meter = meter
    return meter


def _event(name: str, data: Any) -> str:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"
