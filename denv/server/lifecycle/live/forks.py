"""Live forks, the server's side: ``POST /v1/envs/{id}/fork`` with ``kind: live``.

A live fork copies the parent env's running server process (memory and OpenEnv sessions
included) into ``count`` children on the parent's node, at a quiescent point of the parent
(see ``live`` and docs/live-forks.md). Its /work changes become a new version, as a volume
fork's do, and each child's /work starts from that version with writes of its own.

A child is an env like any other: its own id and ingress URL, its own delete, counted in the
key's quota, reaped at its ttl, failed when its process ends, and listed with ``start:
live`` and its parent. It runs in its group's container (the env created with ``live:
true``): so it shares that container's network namespace (its egress rules), its limits and
its engine-side state; the container stays until the last env of the group is deleted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from denv.server import ids
from denv.server.db import iso, now
from denv.server.errors import ApiError
from denv.server.lifecycle.context import Context
from denv.server.lifecycle.endpoints import Route, ingress_endpoint
from denv.server.lifecycle.env_records import EnvOptions, new_record
from denv.server.lifecycle.holds import Hold
from denv.server.lifecycle.requests import EnvsCreate
from denv.server.lifecycle.versions import Versions
from denv.server.node import live
from denv.server.records import (
    EnvError,
    EnvRecord,
    EnvSpec,
    EnvStatus,
    Runtime,
    VersionRecord,
    volume_slots,
)

log = logging.getLogger(__name__)
PORT_LOCKS = 64
NODE_FULL_RETRY_S = 5  # as a cluster without room: deletes free it, not time


def node_full(message: str) -> ApiError:
    """429 ``rate_limited``: a live fork's children do not fit on its parent's node."""
    return ApiError(
        429,
        "rate_limited",
        f"{message}: fork with kind auto (the children that do not fit start as a volume "
        "fork on other nodes), fewer children, or delete envs on that node",
        {"limit": "node", "retry_after_s": NODE_FULL_RETRY_S},
    )


class LiveForks:
    def __init__(self, ctx: Context, versions: Versions) -> None:
        self.ctx = ctx
        self.versions = versions
        # Over choosing a group's ports until its children are recorded: one lock per
        # group (striped), so that forks of envs in different containers run at once.
        self._ports = [threading.Lock() for _ in range(PORT_LOCKS)]

    def fork(
        self, hold: Hold, rec: EnvRecord, parent_version: VersionRecord, opts: EnvsCreate
    ) -> tuple[VersionRecord, list[EnvRecord]]:
        """The fork's version and its children's records (admitted by ``Admission.live_fork``,
        which took ``hold``)."""
        return self._copy(
            hold,
            rec,
            parent_version,
            opts,
            lambda stacks: self.versions.child(rec, parent_version, stacks, {}, "fork"),
        )

    def from_zygote(
        self, hold: Hold, zygote: EnvRecord, planned: VersionRecord, opts: EnvsCreate
    ) -> tuple[VersionRecord, list[EnvRecord]]:
        """``opts.count`` new envs of ``hold.owner`` copied from a zygote (``zygotes``): fresh
        envs of ``planned`` (the create's implicit version, recorded here with the zygote's
        /work as its volumes' layers, under an id of its own: should the copy fail, the
        create boots and records ``planned`` itself), no parent, ``start: zygote``, fresh
        entropy."""
        zversion = self.ctx.store.get_version(zygote.version_id)
        if zversion is None:
            raise ApiError(409, "conflict", f"the version of zygote {zygote.id} is gone")

        def record(stacks: list[list[str]]) -> VersionRecord:
            volumes = [
                vol.model_copy(update={"layers": layers})
                for vol, layers in zip(planned.volumes, stacks, strict=True)
            ]
            return self.versions.add(replace(planned, id=ids.new_id("ver"), volumes=volumes))

        return self._copy(hold, zygote, zversion, opts, record, fresh=True)

    def from_zygote_of_version(
        self, hold: Hold, zygote: EnvRecord, version: VersionRecord, opts: EnvsCreate
    ) -> tuple[VersionRecord, list[EnvRecord]]:
        """``opts.count`` new envs of ``hold.owner`` started from the stored ``version``, copied
        from the zygote that booted on it. Each copy's /work is the version's, copy-on-write:
        their version is ``version`` itself, or, when the zygote's server wrote to /work
        while it booted, a version of their own on top of it (as a boot's own writes)."""
        zversion = self.ctx.store.get_version(zygote.version_id)
        if zversion is None:
            raise ApiError(409, "conflict", f"the version of zygote {zygote.id} is gone")

        def record(stacks: list[list[str]]) -> VersionRecord:
            if stacks == [vol.layers for vol in version.volumes]:
                return version
            volumes = [
                vol.model_copy(update={"layers": layers})
                for vol, layers in zip(version.volumes, stacks, strict=True)
            ]
            made = replace(
                version,
                id=ids.new_id("ver"),
                volumes=volumes,
                labels={},
                created_at=iso(now()),
                parent_version_id=version.id,
                origin="fork",
            )
            return self.versions.add(made, version)

        return self._copy(hold, zygote, zversion, opts, record, fresh=True)

    def _copy(
        self,
        hold: Hold,
        rec: EnvRecord,
        parent_version: VersionRecord,
        opts: EnvsCreate,
        version_of: Callable[[list[list[str]]], VersionRecord],
        fresh: bool = False,
    ) -> tuple[VersionRecord, list[EnvRecord]]:
        ctx = self.ctx
        proc = rec.runtime.live
        assert proc is not None
        slots = volume_slots(parent_version.volumes)
        t0 = time.perf_counter()
        reseed = True if fresh else opts.reseed
        with self._ports[hash(proc.group) % PORT_LOCKS]:
            new_ids, ports = self._new_ids(opts.count), self._free_ports(proc, opts.count)
            children = list(zip(new_ids, ports, strict=True))
            try:
                forked = ctx.node.live_fork(rec.id, proc, slots, children, reseed)
            except live.LiveError as exc:
                if exc.code == "node_full":  # another request took the node's room meanwhile
                    raise node_full(f"live fork of {rec.id}: {exc.message}") from exc
                status = 409 if exc.code in ("busy", "fork_unsafe", "env_not_running") else 500
                raise ApiError(status, exc.code, f"live fork of {rec.id}: {exc.message}") from exc
            version = version_of(forked.stacks)
            records = self._records(hold, rec, version, opts, children, forked.children, fresh)
        log.info(
            "live %s %s into %d: %s, total %.1f ms",
            "copy of zygote" if fresh else "fork",
            rec.id,
            len(records),
            ", ".join(f"{k} {v:.1f}" for k, v in forked.timings_ms.items()),
            (time.perf_counter() - t0) * 1e3,
        )
        ctx.notify()
        return version, records

    def _new_ids(self, n: int) -> list[str]:
        return [ids.new_id("env") for _ in range(n)]

    def _free_ports(self, proc: Any, n: int) -> list[int]:
        used = {
            e.runtime.live.port
            for e in self.ctx.store.live_group(proc.group)
            if e.runtime.live is not None
        }
        ports: list[int] = []
        port = live.CHILD_PORT_BASE
        while len(ports) < n:
            port += 1
            if port not in used:
                ports.append(port)
        return ports

    def _records(
        self,
        hold: Hold,
        parent: EnvRecord,
        version: VersionRecord,
        opts: EnvsCreate,
        children: list[tuple[str, int]],
        procs: list[Any],
        fresh: bool,
    ) -> list[EnvRecord]:
        """The children's records; ``fresh``: new envs copied from a zygote (no parent).
        They are inserted in the step that hands their quota over from ``hold``."""
        owner = hold.owner
        ctx = self.ctx
        records: list[EnvRecord] = []
        routes: list[tuple[str, Route]] = []
        host = parent.runtime.agent_ip or ""
        for (env_id, port), proc in zip(children, procs, strict=True):
            ok = not isinstance(proc, str)
            # A child in a network namespace of its own serves the env's port at its own
            # address (``denv serve --live-netns on``); else its own port at the container's.
            at = host
            if ok and proc.addr:
                port, at = proc.port, proc.addr
            endpoint, route = ingress_endpoint(
                ctx.ingress_keys, env_id, parent.agent_service, port, at
            )
            spec = EnvSpec(wait_timeout_s=opts.wait_timeout_s, live=True)
            records.append(
                new_record(
                    owner,
                    version,
                    parent.egress,
                    EnvOptions.of(opts),
                    None if fresh else parent.id,
                    spec,
                    id=env_id,
                    status=EnvStatus.HEALTHY if ok else EnvStatus.FAILED,
                    start="zygote" if fresh else "live",
                    error=None if ok else EnvError(code="start_failed", message=str(proc)),
                    # A child that did not come up has nothing of its own to remove: it
                    # must not name its parent's container (a delete would remove that).
                    runtime=Runtime(
                        network=parent.runtime.network,
                        containers=dict(parent.runtime.containers),
                        endpoints=[endpoint],
                        agent_ip=parent.runtime.agent_ip,
                        live=proc,
                        node=parent.runtime.node,
                    )
                    if ok
                    else Runtime(),
                )
            )
            if ok:
                routes.append((env_id, route))
        with ctx.quota_lock:
            ctx.store.insert_envs(records)
            hold.recorded(len(records))
        for env_id, (token, service, port, host_ip) in routes:
            ctx.store.add_ingress(token, env_id, service, port, host_ip)
            ctx.ingress.register(token, host_ip, port, owner)
        return records
