"""Env lifecycle: create, start (network, volumes, containers, health), wait, delete, logs.

Starting runs on worker threads so ``fork(n)`` starts its children in parallel; each env's
own lock serialises making and removing its resources (there is no global lock around Docker).
A child of a warm-safe version may instead adopt a booted spare of a warm pool (``warm``):
its volumes are mounted into the running containers and it is ready at once.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

import httpx

from . import ids
from .config import CPU_SHARES, EXIT_CHECK_EVERY, HEALTH_POLL_S, LOG_TAIL_LINES
from .context import Context
from .errors import ApiError
from .ingress import new_token
from .netpolicy import network_name
from .spares import Spare
from .store import EnvRecord, VersionRecord, iso, now
from .warm import WarmPools

log = logging.getLogger(__name__)

HEALTH_CONNECT_TIMEOUT_S = 0.5  # the env is on a local bridge: a live one answers in far less
HEALTH_READ_TIMEOUT_S = 2.0

RUNNING_OR_LATER = {"starting", "running", "healthy", "failed", "deleted"}
HEALTHY_OR_DONE = {"running", "healthy", "failed", "deleted"}
STARTED = ("creating", "starting", "running", "healthy")


class _Aborted(Exception):
    """The env was deleted while it was starting."""


class _SpareLost(Exception):
    """The booting spare an env was promised did not boot."""


class StartFailure(Exception):
    def __init__(self, code: str, message: str, service: str | None, cid: str | None) -> None:
        super().__init__(message)
        self.code, self.message, self.service, self.cid = code, message, service, cid


def volume_slots(version: VersionRecord) -> list[tuple[dict[str, Any], int]]:
    """Each volume with its index among its service's volumes (its ``<n>`` on disk)."""
    seen: dict[str, int] = {}
    out = []
    for vol in version.volumes:
        n = seen.get(vol["service"], 0)
        seen[vol["service"]] = n + 1
        out.append((vol, n))
    return out


class Envs:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.warm = WarmPools(ctx)

    # create
    def create(
        self,
        owner: str,
        version: VersionRecord,
        count: int,
        *,
        egress: str,
        env: dict[str, str],
        labels: dict[str, str],
        ttl_s: int,
        wait_timeout_s: float,
        warm: int = 0,
        use_spares: bool = False,
    ) -> list[EnvRecord]:
        """Record ``count`` envs of ``version`` and start them on worker threads.

        With ``use_spares`` (fork, create-from-version) children take booted spares of the
        version's warm pool while there are some; ``warm`` sets that pool's size.
        """
        store, limit = self.ctx.store, self.ctx.config.max_envs_per_key
        created = now()
        records = [
            EnvRecord(
                id="",
                owner=owner,
                version_id=version.id,
                parent_id=version.parent_env_id,
                project=version.project,
                agent_service=version.agent_service,
                egress=egress,
                labels=dict(labels),
                status="creating",
                start="cold",
                created_at=iso(created),
                expires_at=iso(created + timedelta(seconds=ttl_s)),
                spec={"env": env, "wait_timeout_s": wait_timeout_s, "warm": warm},
                runtime={"network": None, "containers": {}, "endpoints": []},
            )
            for _ in range(count)
        ]
        with self.ctx.quota_lock:
            live = store.count_live(owner)
            if live + count > limit:
                raise ApiError(
                    429,
                    "quota_exceeded",
                    f"this API key has {live} live env(s); {count} more would pass "
                    f"the limit of {limit}: delete envs you no longer need",
                )
            spares = self.warm.take(version, egress, env, count) if use_spares else []
            for i, rec in enumerate(records):
                rec.id = spares[i][0] if i < len(spares) else ids.new_id("env")
                rec.start = "warm" if i < len(spares) else "cold"
            try:
                store.insert_envs(records)
            except BaseException:
                self.warm.give_back(version, egress, env, spares)
                raise
        self.warm.ask([r.id for r in records], version, egress, env, warm)
        for i, rec in enumerate(records):
            if i < len(spares):
                self.ctx.pool.submit(self._adopt, rec.id, version, spares[i][1])
            else:
                self.ctx.pool.submit(self._start, rec.id)
        return records

    def wait(self, env_id: str, until: set[str], timeout_s: float) -> EnvRecord:
        """Block until the env's status is in ``until`` (or terminal) or the timeout passes."""
        deadline = time.monotonic() + timeout_s
        with self.ctx.changed:
            while True:
                rec = self.ctx.store.get_env(env_id)
                assert rec is not None
                left = deadline - time.monotonic()
                if rec.status in until or rec.status in ("failed", "deleted") or left <= 0:
                    return rec
                self.ctx.changed.wait(min(left, 0.5))

    # warm start
    def _adopt(self, env_id: str, version: VersionRecord, booted: Future[Spare | None]) -> None:
        """Give a booted spare the env's volumes and endpoints; cold start if that fails."""
        ctx = self.ctx
        try:
            rec = self._check(env_id)
            if not booted.done():
                self.warm.expedite(env_id)
            # A booting spare's boot ends on its own (healthy, failed, timed out, cancelled).
            spare = booted.result()
            if spare is None:  # its boot failed, and removed what it had made
                raise _SpareLost()
            with ctx.env_lock(env_id):
                rec = self._check(env_id)
                for vol, n in volume_slots(version):
                    ctx.volumes.attach(env_id, vol["service"], n, vol["layers"])
                for cid in spare.containers.values():
                    ctx.engine.set_cpu_shares(cid, CPU_SHARES)
                agent = next(s for s in version.services if s["name"] == rec.agent_service)
                endpoints, routes = [], []
                for port in agent["ports"]:
                    if rec.egress == "allow":
                        url = f"http://127.0.0.1:{spare.host_ports[port]}"
                        endpoints.append(
                            {"service": agent["name"], "port": port, "url": url, "via": "published"}
                        )
                    else:
                        token = new_token()
                        routes.append((token, agent["name"], port, spare.agent_ip))
                        endpoints.append(
                            {"service": agent["name"], "port": port, "url": "", "via": "ingress"}
                            | {"token": token}
                        )
                runtime = {
                    "network": spare.network,
                    "containers": dict(spare.containers),
                    "endpoints": endpoints,
                    "agent_ip": spare.agent_ip,
                }
                healthy = agent.get("health_path") and agent["ports"]
                for token, _, port, host in routes:  # routable before anyone sees it ready
                    ctx.ingress.register(token, host, port)
                if not ctx.store.adopt(
                    env_id, runtime, "healthy" if healthy else "running", routes
                ):
                    for token, *_ in routes:
                        ctx.ingress.unregister(token)
                    raise _Aborted()
            ctx.notify()
        except _Aborted:
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
                ctx.store.set_start(
                    env_id, "cold", {"network": None, "containers": {}, "endpoints": []}
                )
            self._start(env_id)

    # start
    def _start(self, env_id: str) -> None:
        try:
            self._start_env(env_id)
        except _Aborted:
            log.info("env %s was deleted while starting", env_id)
        except StartFailure as exc:
            self._fail(env_id, exc.code, exc.message, exc.service, exc.cid)
        except ApiError as exc:
            self._fail(env_id, "engine_error", exc.message, None, None)
        except Exception as exc:
            log.exception("starting env %s failed", env_id)
            self._fail(env_id, "start_failed", f"{type(exc).__name__}: {exc}", None, None)

    def _check(self, env_id: str) -> EnvRecord:
        rec = self.ctx.store.get_env(env_id)
        if rec is None or rec.status == "deleted":
            raise _Aborted()
        return rec

    def _start_env(self, env_id: str) -> None:
        ctx = self.ctx
        rec = self._check(env_id)
        version = ctx.store.get_version(rec.version_id)
        if version is None:
            raise StartFailure("start_failed", f"version {rec.version_id} is gone", None, None)
        deadline = time.monotonic() + float(rec.spec.get("wait_timeout_s", 120))
        runtime = rec.runtime
        with ctx.env_lock(env_id):
            self._check(env_id)
            runtime["network"] = ctx.engine.create_network(env_id, rec.egress)
            ctx.store.set_runtime(env_id, runtime)
            binds: dict[str, list[tuple[str, str]]] = {}
            for vol, n in volume_slots(version):
                mnt = ctx.volumes.mount(env_id, vol["service"], n, vol["layers"])
                binds.setdefault(vol["service"], []).append((str(mnt), vol["path"]))
        by_name = {s["name"]: s for s in version.services}
        for svc in version.services:  # stored in start order: dependencies first
            for dep in svc["depends_on"]:
                if by_name[dep].get("healthcheck") and dep in svc.get("wait_healthy", []):
                    self._wait_healthcheck(env_id, dep, by_name[dep]["healthcheck"], deadline)
            with ctx.env_lock(env_id):
                self._check(env_id)
                agent = svc["name"] == rec.agent_service
                environment = {**svc["env"], **(rec.spec.get("env", {}) if agent else {})}
                cid = ctx.engine.create_container(
                    env_id,
                    svc["name"],
                    svc["image_digest"],
                    svc["command"],
                    environment,
                    svc["ports"],
                    binds.get(svc["name"], []),
                    runtime["network"],
                    publish=agent and rec.egress == "allow",
                )
                runtime["containers"][svc["name"]] = cid
                ctx.store.set_runtime(env_id, runtime)
                ctx.engine.start(cid)
        agent_svc = by_name[rec.agent_service]
        agent_cid = runtime["containers"][rec.agent_service]
        with ctx.env_lock(env_id):
            self._check(env_id)
            ip = self._endpoints(rec, agent_svc, agent_cid, runtime)
            ctx.store.set_runtime(env_id, runtime)
        if ctx.store.set_status(env_id, "starting", only_from=("creating",)):
            ctx.notify()
        path = agent_svc.get("health_path")
        if not path or not agent_svc["ports"]:
            ctx.store.set_status(env_id, "running", only_from=("starting",))
            ctx.notify()
            return
        self._poll_health(env_id, agent_cid, ip, agent_svc["ports"][0], path, deadline)
        if ctx.store.set_status(env_id, "healthy", only_from=("starting",)):
            ctx.notify()

    def _endpoints(
        self, rec: EnvRecord, svc: dict[str, Any], cid: str, runtime: dict[str, Any]
    ) -> str:
        """Fill ``runtime["endpoints"]`` (and ingress routes); return the agent's IP."""
        info = self.ctx.engine.inspect(cid)
        if info is None:
            raise StartFailure("exited", "the container vanished", svc["name"], None)
        nets = info["NetworkSettings"].get("Networks") or {}
        ip = str((nets.get(runtime["network"]) or {}).get("IPAddress") or "")
        if not ip:
            raise StartFailure("exited", "the container exited at once", svc["name"], cid)
        endpoints = []
        for port in svc["ports"]:
            if rec.egress == "allow":
                bound = (info["NetworkSettings"].get("Ports") or {}).get(f"{port}/tcp") or []
                if not bound:
                    raise StartFailure(
                        "start_failed", f"port {port} was not published", svc["name"], cid
                    )
                url = f"http://127.0.0.1:{bound[0]['HostPort']}"
                via = "published"
            else:
                token = new_token()
                self.ctx.store.add_ingress(token, rec.id, svc["name"], port, ip)
                self.ctx.ingress.register(token, ip, port)
                url, via = "", "ingress"  # rendered with the server's current URL
            endpoints.append({"service": svc["name"], "port": port, "url": url, "via": via})
            if via == "ingress":
                endpoints[-1]["token"] = token
        runtime["endpoints"] = endpoints
        runtime["agent_ip"] = ip
        return ip

    def _poll_health(
        self, env_id: str, cid: str, ip: str, port: int, path: str, deadline: float
    ) -> None:
        url = f"http://{ip}:{port}{path}"
        polls = 0
        # A booting server refuses at once; a connect that times out means nobody holds the
        # address any more (the container died): look at the container then, not 10 polls on.
        timeout = httpx.Timeout(HEALTH_READ_TIMEOUT_S, connect=HEALTH_CONNECT_TIMEOUT_S)
        with httpx.Client(timeout=timeout, trust_env=False) as http:
            while True:
                suspect = False
                try:
                    if http.get(url).status_code == 200:
                        return
                except httpx.TimeoutException:
                    suspect = True
                except httpx.HTTPError:
                    pass
                polls += 1
                if self.ctx.stopping.is_set():
                    raise _Aborted()
                if suspect or polls % EXIT_CHECK_EVERY == 0:
                    self._check(env_id)
                    if self.ctx.engine.state(cid) in ("exited", "missing"):
                        raise StartFailure(
                            "exited",
                            "the agent service exited before it answered its health path",
                            None,
                            cid,
                        )
                if time.monotonic() > deadline:
                    raise StartFailure(
                        "health_timeout",
                        f"{path} on port {port} did not answer 200 within wait_timeout_s",
                        None,
                        cid,
                    )
                time.sleep(HEALTH_POLL_S)

    def _wait_healthcheck(
        self, env_id: str, service: str, test: list[str], deadline: float
    ) -> None:
        cid = self._check(env_id).runtime["containers"][service]
        while not self.ctx.engine.exec_ok(cid, test):
            self._check(env_id)
            if self.ctx.engine.state(cid) in ("exited", "missing"):
                raise StartFailure(
                    "exited",
                    f"service '{service}' exited before its healthcheck passed",
                    service,
                    cid,
                )
            if time.monotonic() > deadline:
                raise StartFailure(
                    "health_timeout",
                    f"the healthcheck of service '{service}' did not pass within wait_timeout_s",
                    service,
                    cid,
                )
            time.sleep(0.1)

    def _fail(
        self, env_id: str, code: str, message: str, service: str | None, cid: str | None
    ) -> None:
        rec = self.ctx.store.get_env(env_id)
        if rec is None:
            return
        if cid and service is None:
            service = rec.agent_service
        if cid is None and service:
            cid = rec.runtime.get("containers", {}).get(service)
        tail = self.ctx.engine.logs(cid, LOG_TAIL_LINES) if cid else []
        error = {"code": code, "message": message, "service": service, "log_tail": tail}
        if self.ctx.store.set_status(env_id, "failed", error, only_from=STARTED):
            log.info("env %s failed: %s %s", env_id, code, message)
            self.ctx.notify()

    # delete
    def delete(self, env_id: str) -> None:
        """Stop at once and remove everything the env had; deleting twice is fine."""
        if self.ctx.store.set_status(env_id, "deleted"):
            self.ctx.notify()
        with self.ctx.env_lock(env_id):
            self.teardown(env_id)
        self.warm.release(env_id)

    def teardown(self, env_id: str) -> None:
        """Remove an env's containers, network, ingress routes and volumes (idempotent)."""
        ctx = self.ctx
        rec = ctx.store.get_env(env_id)
        for token in ctx.store.remove_ingress(env_id):
            ctx.ingress.unregister(token)
        cids = set((rec.runtime.get("containers") or {}).values()) if rec else set()
        cids |= set(ctx.engine.states(env_id))
        for cid in cids:
            ctx.engine.remove(cid)
        ctx.engine.remove_network(network_name(env_id))
        ctx.volumes.remove_env(env_id)

    def logs(self, rec: EnvRecord, service: str, tail: int) -> list[str]:
        cid = (rec.runtime.get("containers") or {}).get(service)
        return self.ctx.engine.logs(cid, tail) if cid else []

    def observe(self, rec: EnvRecord, states: dict[str, str]) -> EnvRecord:
        """Mark a running env failed when its agent container has died since."""
        if rec.status not in ("running", "healthy"):
            return rec
        cid = rec.runtime.get("containers", {}).get(rec.agent_service)
        if cid and states.get(cid, "missing") in ("exited", "missing"):
            self._fail(rec.id, "exited", "the agent service exited", rec.agent_service, cid)
            return self.ctx.store.get_env(rec.id) or rec
        return rec
