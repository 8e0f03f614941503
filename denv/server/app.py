"""The FastAPI application: ``create_app(config)``."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, suppress
from typing import Any

from fastapi import FastAPI, HTTPException

from denv.ingress_host import host_base
from denv.server import ids
from denv.server.api.json_limits import BoundedJson
from denv.server.api.routes import router
from denv.server.auth import KeyRing, digest, private_dir
from denv.server.config import (
    HOST_GUARD_CHECK_S,
    LEASE_CHECK_S,
    MAX_BODY_BYTES,
    REAPER_INTERVAL_S,
    ServerConfig,
)
from denv.server.console import router as console_router
from denv.server.db import Store
from denv.server.docker import ksm
from denv.server.docker.engine import Engine
from denv.server.docker.node import DockerNode
from denv.server.errors import install_error_handlers
from denv.server.gvisor import runtime as gvisor
from denv.server.ingress.hosts import HostIngress
from denv.server.ingress.proxy import mount_ingress
from denv.server.ingress.routes import IngressTable
from denv.server.lifecycle.collect import collect_forever
from denv.server.lifecycle.context import Context
from denv.server.lifecycle.leases import end_due_forever
from denv.server.lifecycle.reconcile import reap_forever
from denv.server.lifecycle.service import Service
from denv.server.net.host_guard import HostGuardWatch
from denv.server.net.subnets import SubnetPool
from denv.server.node.abilities import EVERYTHING
from denv.server.node.seam import Node
from denv.server.tokens import IngressKeys
from denv.server.volumes.overlay import Volumes

log = logging.getLogger(__name__)

Scope = dict[str, Any]


class RequestContext:
    """Gives every request a ``req_`` id (``X-Request-Id``) and caps API bodies at 1 MiB."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = ids.new_id("req")
        scope.setdefault("state", {})["request_id"] = rid
        # The cap is the API's (see the contract); ingress streams env traffic of any size.
        api = str(scope.get("path", "")).startswith("/v1/")
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length", b"0")
        if api and length.isdigit() and int(length) > MAX_BODY_BYTES:
            body = json.dumps(
                {
                    "code": "invalid_request",
                    "request_id": rid,
                    "details": None,
                    "message": "request body larger than 1 MiB: send less",
                }
            ).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 422,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"x-request-id", rid.encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return

        async def send_with_id(message: Any) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", rid.encode())]
            await send(message)

        if api:
            receive = _capped(receive)  # a chunked body has no Content-Length to check
        await self.app(scope, receive, send_with_id)


def _capped(receive: Any) -> Any:
    """``receive`` that refuses (422) a body once more than 1 MiB of it has arrived."""
    seen = 0

    async def capped() -> Any:
        nonlocal seen
        message = await receive()
        if message.get("type") == "http.request":
            seen += len(message.get("body", b""))
            if seen > MAX_BODY_BYTES:
                # FastAPI re-raises HTTPException from body parsing; the error handler maps it.
                raise HTTPException(422, "request body larger than 1 MiB: send less")
        return message

    return capped


def _write_server_json(config: ServerConfig) -> None:
    path = config.state_dir / "server.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"url": config.public_url(), "pid": os.getpid()}))
    os.replace(tmp, path)


def _remove_server_json(config: ServerConfig) -> None:
    path = config.state_dir / "server.json"
    with suppress(OSError, ValueError):
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()


def create_app(
    config: ServerConfig, node: Node | None = None, relay_key: bytes | None = None
) -> FastAPI:
    """The denv API on the local Docker Engine, with state under ``config.state_dir``; or
    on ``node`` (a cluster's nodes, ``denv serve --cluster``), which runs every env, its
    ingress reaching envs through node relays with ``relay_key`` (``ingress.relay``)."""
    private_dir(config.state_dir)
    store = Store(config.db_path)
    store.add_key_digest(digest(config.api_key))
    table = IngressTable()
    guard = HostGuardWatch()
    engine = Engine(
        store.instance_id(),
        SubnetPool(config.subnet_pool, config.subnet_prefix),
        firewall=guard.firewall,
        allow_private_egress=config.allow_private_egress,
    )
    engine.pull_credentials = config.pull_credentials
    abilities = EVERYTHING  # what the envs' runtime takes away (the admission refuses it)
    saver = None  # how the runtime saves a sandbox (the node's checkpoints); runc: none
    if config.isolation == "gvisor":
        abilities, saver = gvisor.use(engine)  # GvisorUnavailable naming the fix: first
    volumes = Volumes(config.state_dir, config.max_volume_mb)
    if volumes.fs is not None and node is None:  # a cluster's node agents check their own
        volumes.fs.check()  # OSError naming the fix: before serving, not at the first env
    clustered = node is not None
    if config.merge_pages and node is None:
        ksm.enable()  # OSError naming the fix: before serving, not at the first fork
    node = node or DockerNode(
        engine,
        volumes,
        config.limits,
        live_netns=config.live_netns,
        merge_pages=config.merge_pages,
        saver=saver,
    )
    ctx = Context(
        config=config, store=store, node=node, ingress=table, host_guard=guard, abilities=abilities
    )
    ctx.ingress_keys = IngressKeys.load_or_create(config.state_dir)  # beside api_key, 0600
    service = Service(ctx)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Waits and Docker calls run in threads: more than the default handful.
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(256, thread_name_prefix="denv-io")
        )
        # Fail fast: without the guard, egress-deny envs could reach the host (on a
        # cluster each node agent keeps its own machine's guard).
        if not clustered:
            await asyncio.to_thread(guard.check)
        try:
            await asyncio.to_thread(service.reconcile)
        except Exception:
            log.exception("reconcile failed; serving anyway (is dockerd running?)")
        try:  # the firewall rules of envs that outlived the last server process
            if not clustered:  # a cluster's node agents take back their own
                await asyncio.to_thread(engine.adopt_egress)
        except Exception:
            log.exception("the egress rules of running envs were not taken back")
        reaper = asyncio.create_task(
            reap_forever(ctx, service.envs, REAPER_INTERVAL_S, service.zygotes.reap)
        )
        leases = asyncio.create_task(end_due_forever(service.leases, LEASE_CHECK_S))
        collector = asyncio.create_task(
            collect_forever(service.collector, config.gc_interval_s)
            if config.gc_interval_s > 0
            else asyncio.sleep(0)
        )
        watch = asyncio.create_task(
            guard.forever(HOST_GUARD_CHECK_S) if not clustered else asyncio.sleep(0)
        )
        _write_server_json(config)
        log.info("denv server %s listening at %s", engine.instance_id, config.public_url())
        try:
            yield
        finally:
            reaper.cancel()
            leases.cancel()
            collector.cancel()
            watch.cancel()
            await asyncio.to_thread(service.shutdown)
            _remove_server_json(config)

    app = FastAPI(title="denv", lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    app.state.service = service
    app.state.keyring = KeyRing(store)
    install_error_handlers(app)
    app.include_router(router)
    app.include_router(console_router)
    mount_ingress(
        app,
        table,
        ctx.fair,
        config.ingress_read_timeout_s,
        config.ws_idle_timeout_s,
        relay_key,
    )
    app.add_middleware(BoundedJson)  # inside RequestContext: its request id and 1 MiB cap
    app.add_middleware(RequestContext)
    # Outermost: a request to <label>.localhost is an env's, whatever its path (/v1/...).
    bases = {b for b in ("localhost", host_base(config.host)) if b}
    app.add_middleware(HostIngress, proxy=app.state.denv_ingress, bases=bases)
    return app
