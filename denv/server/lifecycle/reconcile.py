"""Bring Docker and the host's mounts in line with the database when the server starts.

Only objects labelled with this server's ``denv.instance`` are touched: several servers may
share one Docker Engine. Orphans go; envs whose containers or mounts vanished become
``failed`` with code ``lost``; stored ingress tokens of envs not deleted are registered again.
Warm spares have no stored env until one is taken, so every spare left by a server that
stopped is such an orphan; the pools that envs not deleted asked for are then refilled afresh.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from denv.server.config import IDEMPOTENCY_TTL_S
from denv.server.db import iso, now
from denv.server.lifecycle.context import Context
from denv.server.lifecycle.envs import Envs
from denv.server.lifecycle.pools.spares import pool_of
from denv.server.lifecycle.versions import referenced_layers
from denv.server.node.seam import Owned
from denv.server.records import BOOTING, EnvDeletion, EnvStatus, volume_slots

log = logging.getLogger(__name__)


def reconcile(ctx: Context, envs: Envs) -> None:
    store, node = ctx.store, ctx.node
    node.drop_partial_layers()
    existing = {r.id: r for r in store.existing_envs()}
    # A live env's group (whose container it runs in) keeps its container and volumes,
    # even when the group's own env was deleted.
    needed = set(existing) | {r.runtime.live.group for r in existing.values() if r.runtime.live}
    owned = node.owned()
    orphans = Owned(
        containers={c: e for c, e in owned.containers.items() if e not in needed},
        networks={n: e for n, e in owned.networks.items() if e not in needed},
        volume_envs=[e for e in owned.volume_envs if e not in needed],
    )
    for cid in orphans.containers:
        log.info("reconcile: removing orphan container %s", cid[:12])
    for name in orphans.networks:
        log.info("reconcile: removing orphan network %s", name)
    for env_id in orphans.volume_envs:
        log.info("reconcile: removing orphan volumes of %s", env_id)
    node.remove_owned(orphans)
    states = node.states()
    for rec in existing.values():
        problem = _problem(ctx, rec.id, states)
        if problem:
            envs.lose(rec.id, problem)
        elif rec.runtime.live is not None and rec.id != rec.runtime.live.group:
            node.live_adopt(rec.id, rec.runtime.live)  # a live child: counted on its node
    owners = {r.id: r.owner for r in store.existing_envs() if r.status != EnvStatus.FAILED}
    for token, env_id, host, port in store.ingress_routes():
        if env_id in owners:
            ctx.ingress.register(token, host, port, owners[env_id])
    unused = sorted(node.layer_ids() - referenced_layers(store))
    node.delete_layers(unused)
    store.sizes.forget(unused)
    for rec in store.existing_envs():  # warm pools live in memory: ask for them again
        warm = rec.spec.warm
        failed = rec.status == EnvStatus.FAILED
        version = store.get_version(rec.version_id) if warm and not failed else None
        if version is not None:
            envs.warm.ask(
                [rec.id], pool_of(version, rec.egress, rec.spec.env, rec.owner), warm, rec.owner
            )


def _problem(ctx: Context, env_id: str, states: dict[str, str]) -> str | None:
    rec = ctx.store.get_env(env_id)
    if rec is None:
        return None
    if rec.status in BOOTING:
        return "the server stopped while the env was starting"
    if rec.status == EnvStatus.FAILED:
        return None
    if rec.runtime.live is not None:  # a live env is its process, whatever its container
        return None if ctx.node.live_alive(rec.runtime.live) else "its server process ended"
    version = ctx.store.get_version(rec.version_id)
    slots = volume_slots(version.volumes) if version else []
    return ctx.node.recover(env_id, rec.runtime.containers, slots, states)


def fail_lost(ctx: Context, envs: Envs) -> int:
    """Fail the envs of nodes found dead (a cluster's; one machine loses none): code
    ``lost``, the node's name in the message. Returns how many."""
    # a warm spare has no record (warm.reap replaces it); a settled env is left alone
    return sum(envs.lose(env_id, why) for env_id, why in ctx.node.lost().items())


async def reap_forever(
    ctx: Context, envs: Envs, interval_s: float, *tend: Callable[[], None]
) -> None:
    """Delete envs whose TTL passed; drop expired idempotency records; tend warm pools
    (and run ``tend``: the zygotes' reaper); fail the envs of lost nodes."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await asyncio.to_thread(fail_lost, ctx, envs)
            expired = await asyncio.to_thread(ctx.store.expired_envs, iso(now()))
            for env_id in expired:
                log.info("reaper: env %s passed its ttl", env_id)
                why = EnvDeletion(reason="ttl", message="its ttl_s passed", at=iso(now()))
                await asyncio.to_thread(envs.delete, env_id, why)
            await asyncio.to_thread(ctx.store.expire_idempotent, time.time() - IDEMPOTENCY_TTL_S)
            await asyncio.to_thread(envs.warm.reap)
            for job in tend:
                await asyncio.to_thread(job)
        except Exception:
            log.exception("reaper pass failed")
