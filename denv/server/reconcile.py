"""Bring Docker and the host's mounts in line with the database when the server starts.

Only objects labelled with this server's ``denv.instance`` are touched: several servers may
share one Docker Engine. Orphans go; envs whose containers or mounts vanished become
``failed`` with code ``lost``; stored ingress tokens of live envs are registered again.
Warm spares have no stored env until one is taken, so every spare left by a server that
stopped is such an orphan; the pools that live envs asked for are then refilled afresh.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Any

from .envs import volume_slots
from .store import iso, now

if TYPE_CHECKING:
    from .routes import Core

log = logging.getLogger(__name__)


def reconcile(core: Core) -> None:
    ctx, envs = core.ctx, core.envs
    store, engine, volumes = ctx.store, ctx.engine, ctx.volumes
    volumes.clean_tmp()
    live = {r.id: r for r in store.live_envs()}
    for c in engine.my_containers():
        if (c.get("Labels") or {}).get("denv.env", "") not in live:
            log.info("reconcile: removing orphan container %s", c["Id"][:12])
            engine.remove(c["Id"])
    for n in engine.my_networks():
        if (n.get("Labels") or {}).get("denv.env", "") not in live:
            log.info("reconcile: removing orphan network %s", n["Name"])
            engine.remove_network(n["Name"])
    for d in list(volumes.envs_dir.iterdir()):
        if d.name not in live:
            log.info("reconcile: removing orphan volumes of %s", d.name)
            volumes.remove_env(d.name)
    states = engine.states()
    for rec in live.values():
        problem = _problem(core, rec.id, states)
        if problem and rec.status != "failed":
            log.info("reconcile: env %s is lost (%s)", rec.id, problem)
            error: dict[str, Any] = {
                "code": "lost",
                "message": f"{problem}; delete this env",
                "service": None,
                "log_tail": [],
            }
            store.set_status(rec.id, "failed", error)
            envs.teardown(rec.id)
    live_ids = {r.id for r in store.live_envs() if r.status != "failed"}
    for token, env_id, host, port in store.ingress_routes():
        if env_id in live_ids:
            ctx.ingress.register(token, host, port)
    referenced = {x for v in store.all_versions() for vol in v.volumes for x in vol["layers"]}
    volumes.delete_layers(volumes.layer_ids() - referenced)
    for rec in store.live_envs():  # warm pools live in memory: ask for them again
        warm = int(rec.spec.get("warm") or 0)
        version = store.get_version(rec.version_id) if warm and rec.status != "failed" else None
        if version is not None:
            envs.warm.ask([rec.id], version, rec.egress, rec.spec.get("env") or {}, warm)


def _problem(core: Core, env_id: str, states: dict[str, str]) -> str | None:
    rec = core.ctx.store.get_env(env_id)
    if rec is None:
        return None
    if rec.status in ("creating", "starting"):
        return "the server stopped while the env was starting"
    if rec.status == "failed":
        return None
    for service, cid in (rec.runtime.get("containers") or {}).items():
        state = states.get(cid, "missing")
        core.ctx.engine.thaw(cid)  # frozen by a snapshot that was interrupted
        if state == "paused":  # paused by one through docker
            core.ctx.engine.unpause(cid)
        elif state != "running":
            return f"the container of service '{service}' is {state}"
    version = core.ctx.store.get_version(rec.version_id)
    for vol, n in volume_slots(version) if version else []:
        mnt = core.ctx.volumes.upper(env_id, vol["service"], n).parent / "mnt"
        if not os.path.ismount(mnt):
            return f"the volume {vol['path']} of service '{vol['service']}' is not mounted"
    return None


async def reap_forever(core: Core, interval_s: float) -> None:
    """Delete envs whose TTL passed; drop expired idempotency records; tend warm pools."""
    from .idempotency import expire

    while True:
        await asyncio.sleep(interval_s)
        try:
            expired = await asyncio.to_thread(core.ctx.store.expired_envs, iso(now()))
            for env_id in expired:
                log.info("reaper: env %s passed its ttl", env_id)
                await asyncio.to_thread(core.envs.delete, env_id)
            await asyncio.to_thread(expire, core.ctx.store)
            await asyncio.to_thread(core.envs.warm.reap)
        except Exception:
            log.exception("reaper pass failed")
