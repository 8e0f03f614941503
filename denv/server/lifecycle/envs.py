"""Env lifecycle: create, start, adopt a warm spare, wait, fail, delete, logs.

Starting runs on worker threads so ``fork(n)`` starts its children in parallel; each env's
own lock serialises what is stored of its resources (there is no global lock around Docker).
The resources themselves are the node's (``node``): a cold start asks it to bring the env up
and wait for its health path; a child of a warm-safe version may instead adopt a booted spare
of a warm pool (``warm``): the node mounts its volumes into the running containers and it is
ready at once. A delete cancels the env's boot on the node, then tears the env down.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future

from denv.server import ids
from denv.server.config import LOG_TAIL_LINES
from denv.server.db import iso, now
from denv.server.errors import ApiError
from denv.server.lifecycle.admission import Admission, Admitted, no_room
from denv.server.lifecycle.context import Context
from denv.server.lifecycle.endpoints import Route, ingress_endpoint
from denv.server.lifecycle.env_records import EnvOptions, new_record
from denv.server.lifecycle.pools.spares import Spare, pool_of
from denv.server.lifecycle.pools.warm import WarmPools
from denv.server.node.errors import Refused
from denv.server.node.live import LiveError
from denv.server.node.seam import Booted, BootFailed, BootSpec, Cancelled
from denv.server.records import (
    ACTIVE,
    FINAL,
    READY,
    Endpoint,
    EnvDeletion,
    EnvError,
    EnvRecord,
    EnvSpec,
    EnvStatus,
    Runtime,
    ServiceSpec,
    VersionRecord,
    volume_slots,
)

log = logging.getLogger(__name__)


class _Aborted(Exception):
    """The env was deleted while it was starting."""


class _SpareLost(Exception):
    """The booting spare an env was promised did not boot."""


class Envs:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.warm = WarmPools(ctx)
        self.admit = Admission(ctx, self.warm)

    # create
    def create(
        self, admitted: Admitted, version: VersionRecord, options: EnvOptions
    ) -> list[EnvRecord]:
        """Record the ``admitted.count`` envs of ``version`` and start them on worker threads.

        With ``options.use_spares`` (create, fork, create-from-version) envs take booted spares
        of the version's warm pool while there are some; ``admitted.warm`` sets that pool's
        size. With ``options.lease_id`` the lease holds them (``leases``); without, they are
        detached. ``options.spill``: they are a live fork's children that did not fit on its
        node (why). Their quota was held at admission: it is handed over as they are
        recorded, so nothing is checked again but a cluster's room (spares need none).
        """
        store = self.ctx.store
        owner, count, egress, env = admitted.owner, admitted.count, admitted.egress, admitted.env
        live_env, warm, use_spares = admitted.live, admitted.warm, options.use_spares
        if live_env:  # a spare runs the image's command without the live launcher
            use_spares, warm = False, 0
        spec = EnvSpec(
            env=env,
            wait_timeout_s=options.wait_timeout_s,
            warm=warm,
            live=bool(live_env),
            live_auto=live_env == "auto",
            spill=options.spill,
            restore=options.restore,
        )
        records = [
            new_record(owner, version, egress, options, version.parent_env_id, spec)
            for _ in range(count)
        ]
        pool = pool_of(version, egress, env, owner)  # the key's warm pool: take from, ask
        with self.ctx.quota_lock:
            # Admission held the quota; a cluster's room is looked at again (its nodes may
            # have filled since), with the spares now taken, in the step that inserts.
            spares = self.warm.take(pool, count) if use_spares else []
            room = self.ctx.node.room()  # a cluster's nodes under their caps; None: no cap
            if room is not None and count - len(spares) > room:
                self.warm.give_back(pool, spares)
                raise no_room(room, count)
            for i, rec in enumerate(records):
                rec.id = spares[i][0] if i < len(spares) else ids.new_id("env")
                # A fork's child to resume from a checkpoint: "cold" if its node had not the image.
                rec.start = "warm" if i < len(spares) else "restored" if options.restore else "cold"
            try:
                store.insert_envs(records)
            except BaseException:
                self.warm.give_back(pool, spares)
                raise
            admitted.hold.recorded(count)
        self.warm.ask([r.id for r in records], pool, warm, owner)
        for i, rec in enumerate(records):
            if i < len(spares):
                self.ctx.workers.submit(self._adopt, rec.id, version, spares[i][1])
            else:
                self.ctx.workers.submit(self._start, rec.id)
        return records

    def wait(self, env_id: str, until: frozenset[EnvStatus], timeout_s: float) -> EnvRecord:
        """Block until the env's status is in ``until`` (or final) or the timeout passes."""
        deadline = time.monotonic() + timeout_s
        with self.ctx.changed:
            while True:
                rec = self.ctx.store.get_env(env_id)
                assert rec is not None
                left = deadline - time.monotonic()
                if rec.status in until or rec.status in FINAL or left <= 0:
                    return rec
                self.ctx.changed.wait(min(left, 0.5))

    def _check(self, env_id: str) -> EnvRecord:
        rec = self.ctx.store.get_env(env_id)
        if rec is None or rec.status == EnvStatus.DELETED:
            raise _Aborted()
        return rec

    def _endpoints(
        self, rec: EnvRecord, agent: ServiceSpec, booted: Booted
    ) -> tuple[list[Endpoint], list[Route]]:
        """The agent's endpoints: published ports, or ingress routes, each with its token
        (derived from the env id, service and port: the endpoint itself keeps none)."""
        endpoints, routes = [], []
        for port in agent.ports:
            # On a cluster every env is reached through ingress, whatever its node: a port
            # published on a node's loopback is no URL for anyone else.
            if rec.egress == "allow" and booted.node == "local":
                url = f"http://127.0.0.1:{booted.host_ports[port]}"
                endpoints.append(Endpoint(service=agent.name, port=port, url=url, via="published"))
            else:
                # The URL is rendered with the server's current URL and this same token.
                endpoint, route = ingress_endpoint(
                    self.ctx.ingress_keys, rec.id, agent.name, port, booted.agent_ip
                )
                endpoints.append(endpoint)
                routes.append(route)
        return endpoints, routes

    @staticmethod
    def _runtime(booted: Booted, endpoints: list[Endpoint]) -> Runtime:
        return Runtime(
            node=booted.node,
            network=booted.network,
            containers=booted.containers,
            endpoints=endpoints,
            agent_ip=booted.agent_ip,
        )

    # warm start
    def _adopt(self, env_id: str, version: VersionRecord, booted: Future[Spare | None]) -> None:
        """Give a booted spare the env's volumes and endpoints; cold start if that fails."""
        ctx = self.ctx
        try:
            self._check(env_id)
            if not booted.done():
                self.warm.expedite(env_id)
            # A booting spare's boot ends on its own (healthy, failed, timed out, cancelled).
            spare = booted.result()
            if spare is None:  # its boot failed (or was cancelled), and removed what it had made
                self._check(env_id)
                raise _SpareLost()
            with ctx.env_lock(env_id):
                rec = self._check(env_id)
                ctx.node.mount_volumes(env_id, volume_slots(version.volumes))
                ctx.node.prioritize(env_id, list(spare.booted.containers.values()))
                agent = version.service(rec.agent_service)
                endpoints, routes = self._endpoints(rec, agent, spare.booted)
                healthy = agent.health_path and agent.ports
                status = EnvStatus.HEALTHY if healthy else EnvStatus.RUNNING
                for token, _, port, host in routes:  # routable before anyone sees it ready
                    ctx.ingress.register(token, host, port, rec.owner)
                runtime = self._runtime(spare.booted, endpoints)
                if not ctx.store.adopt(env_id, runtime, status, routes):
                    for token, *_ in routes:
                        ctx.ingress.unregister(token)
                    raise _Aborted()
            ctx.notify()
        except (_Aborted, Cancelled):
            log.info("env %s was deleted while adopting its spare", env_id)
            with ctx.env_lock(env_id):  # a spare that booted after the delete is removed too
                self.teardown(env_id)
        except Exception as exc:
            if isinstance(exc, _SpareLost):
                log.info("env %s: its warm spare failed to boot; starting it cold", env_id)
            else:
                log.exception("env %s: adopting warm spare failed; starting it cold", env_id)
            with ctx.env_lock(env_id):
                self.teardown(env_id)
                ctx.store.set_start(env_id, "cold", Runtime())
            self._start(env_id)

    # start
    def _start(self, env_id: str) -> None:
        try:
            self._start_env(env_id)
        except (_Aborted, Cancelled):
            log.info("env %s was deleted while starting", env_id)
        except BootFailed as exc:
            if exc.network or exc.containers:  # what it made, for the env's services
                runtime = Runtime(network=exc.network, containers=exc.containers)
                with self.ctx.env_lock(env_id):
                    self.ctx.store.set_runtime(env_id, runtime)
            self._fail(env_id, exc.code, exc.message, exc.service)
        except (ApiError, Refused) as exc:
            self._fail(env_id, "engine_error", exc.message, None)
        except Exception as exc:
            log.exception("starting env %s failed", env_id)
            self._fail(env_id, "start_failed", f"{type(exc).__name__}: {exc}", None)

    def _start_env(self, env_id: str) -> None:
        ctx = self.ctx
        rec = self._check(env_id)
        version = ctx.store.get_version(rec.version_id)
        if version is None:
            raise BootFailed("start_failed", f"version {rec.version_id} is gone")
        deadline = time.monotonic() + rec.spec.wait_timeout_s
        spec = BootSpec(
            env_id=env_id,
            services=version.services,
            agent=rec.agent_service,
            egress=rec.egress,
            env=rec.spec.env,
            volumes=volume_slots(version.volumes),
            timeout_s=rec.spec.wait_timeout_s,
            live=rec.spec.live,
            owner=rec.owner,
            restore=rec.spec.restore,
        )
        booted = ctx.node.bring_up(spec)
        agent = version.service(rec.agent_service)
        with ctx.env_lock(env_id):
            self._check(env_id)
            endpoints, routes = self._endpoints(rec, agent, booted)
            for token, service, port, host in routes:
                ctx.store.add_ingress(token, env_id, service, port, host)
                ctx.ingress.register(token, host, port, rec.owner)
            runtime = self._runtime(booted, endpoints)
            if rec.spec.restore and not booted.restored:  # its node had no image: a boot
                ctx.store.set_start(env_id, "cold", runtime)
            else:
                ctx.store.set_runtime(env_id, runtime)
        if ctx.store.set_status(env_id, EnvStatus.STARTING, only_from={EnvStatus.CREATING}):
            ctx.notify()
        if not agent.health_path or not agent.ports:
            ctx.store.set_status(env_id, EnvStatus.RUNNING, only_from={EnvStatus.STARTING})
            ctx.notify()
            return
        ctx.node.wait_healthy(spec, booted, deadline - time.monotonic())
        if rec.spec.live:  # its server process is what a live fork copies
            try:
                proc = ctx.node.live_root(env_id, booted.containers[agent.name], agent.ports[0])
                live: dict[str, object] = {"live": proc}
            except LiveError as exc:  # e.g. live_unsupported: the server said why
                if exc.code != "live_unsupported" or not rec.spec.live_auto:
                    raise self._live_failed(exc, agent.name) from exc
                # auto, and the server cannot be copied: it serves as it would have without
                # live (the launcher runs the image's command unchanged either way); its
                # forks are volume forks, and its record says why it is not live.
                log.info("env %s serves without live forks: %s", env_id, exc.message)
                live = {"live_unsupported": exc.message}
            with ctx.env_lock(env_id):
                current = self._check(env_id)
                ctx.store.set_runtime(env_id, current.runtime.model_copy(update=live))
        if ctx.store.set_status(env_id, EnvStatus.HEALTHY, only_from={EnvStatus.STARTING}):
            ctx.notify()

    @staticmethod
    def _live_failed(exc: LiveError, service: str) -> BootFailed:
        """A live start that failed, as an env error (the contract's codes: live_unsupported,
        or a start that failed)."""
        way_out = (
            ". Create it without live: its forks then boot from a snapshot of /work (kind volume)"
            if exc.code == "live_unsupported"
            else ""
        )
        code = exc.code if exc.code == "live_unsupported" else "start_failed"
        return BootFailed(code, exc.message + way_out, service)

    def _fail(self, env_id: str, code: str, message: str, service: str | None) -> None:
        if self.ctx.store.get_env(env_id) is None:
            return
        tail = self.ctx.node.logs(env_id, service, LOG_TAIL_LINES) if service else []
        if code == "exited" and service and (why := self.ctx.node.exit_reason(env_id, service)):
            message = f"{message}: killed, {why}"
        error = EnvError(code=code, message=message, service=service, log_tail=tail)
        if self.ctx.store.set_status(env_id, EnvStatus.FAILED, error, only_from=ACTIVE):
            log.info("env %s failed: %s %s", env_id, code, message)
            self.ctx.notify()

    # delete
    def delete(self, env_id: str, why: EnvDeletion | None = None) -> None:
        """Stop at once and remove everything the env had; deleting twice is fine. ``why``
        goes into its record (default: a client's delete request)."""
        why = why or EnvDeletion(reason="requested", message="a delete request", at=iso(now()))
        if self.ctx.store.mark_deleted(env_id, why):
            self.ctx.notify()
        self.ctx.node.cancel(env_id)
        with self.ctx.env_lock(env_id):
            self.teardown(env_id)
        self.warm.release(env_id)

    def teardown(self, env_id: str) -> None:
        """Remove an env's ingress routes, then what it has on its node (idempotent)."""
        ctx = self.ctx
        rec = ctx.store.get_env(env_id)
        for token in ctx.store.remove_ingress(env_id):
            ctx.ingress.unregister(token)
        if rec is not None and rec.runtime.live is not None:
            proc = rec.runtime.live
            last = not any(e.id != env_id for e in ctx.store.live_group(proc.group))
            ctx.node.live_teardown(env_id, proc, last)
            return
        ctx.node.teardown(env_id, list(rec.runtime.containers.values()) if rec else [])

    def logs(self, rec: EnvRecord, service: str, tail: int) -> list[str]:
        return self.ctx.node.logs(rec.id, service, tail)

    def observe(self, rec: EnvRecord, states: dict[str, str]) -> EnvRecord:
        """Mark a running env failed when its agent container has died since."""
        if rec.status not in READY:
            return rec
        cid = rec.runtime.containers.get(rec.agent_service)
        if rec.runtime.live is not None and not self.ctx.node.live_alive(rec.runtime.live):
            why = self.ctx.node.live_exit_reason(rec.id, rec.runtime.live)
            killed = f": killed, {why}" if why else ""
            self._fail(rec.id, "exited", f"the env's server process ended{killed}", None)
            return self.ctx.store.get_env(rec.id) or rec
        if cid and states.get(cid, "missing") in ("exited", "missing"):
            why = self.ctx.node.lost_reason(rec.id)  # a cluster's node found dead
            if why is not None:
                self.lose(rec.id, why)
            else:
                self._fail(rec.id, "exited", "the agent service exited", rec.agent_service)
            return self.ctx.store.get_env(rec.id) or rec
        return rec

    def lose(self, env_id: str, why: str) -> bool:
        """Fail an env whose node was lost (code ``lost``, the reason named) and drop what
        is left of it; False when it had failed or was deleted already."""
        ctx = self.ctx
        with ctx.env_lock(env_id):
            rec = ctx.store.get_env(env_id)
            if rec is None or rec.status in (EnvStatus.FAILED, EnvStatus.DELETED):
                return False
            log.warning("env %s is lost: %s", env_id, why)  # a dead node, or found at start
            error = EnvError(code="lost", message=f"{why}; delete this env")
            ctx.store.set_status(env_id, EnvStatus.FAILED, error)
            self.teardown(env_id)
        ctx.notify()
        return True
