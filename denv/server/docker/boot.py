"""The one boot sequence of the Docker node: cold starts and warm spares alike.

Network; volumes (mounted now, or left as empty shared mount points for a late mount); each
service's container in start order, a dependency's healthcheck passing first where a service
waits for it; the agent's address; then, in a second call, the agent's health path. Every
step that makes something runs under the node's lock of the env and checks that the boot was
not cancelled, so a teardown that follows a cancel leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from inspect import signature
from typing import Any

import httpx

from denv.server.config import CPU_SHARES, EXIT_CHECK_EVERY, HEALTH_POLL_S, WARM_CPU_SHARES
from denv.server.docker import spare_progress
from denv.server.docker.checkpoints import RESTORE_ENV
from denv.server.docker.engine import Engine
from denv.server.docker.engine_queue import EngineQueue
from denv.server.docker.live import launcher_ctl
from denv.server.locks import NamedLocks
from denv.server.node.egress import egress_hosts
from denv.server.node.egress import parse as parse_egress
from denv.server.node.errors import BootFailed, Cancelled, Refused
from denv.server.node.seam import Booted, BootSpec
from denv.server.records import Limits, ServiceSpec
from denv.server.volumes.overlay import Volumes

log = logging.getLogger(__name__)

WARM_LABEL = "denv.warm"  # on a spare's containers: the key of its pool
HEALTH_CONNECT_TIMEOUT_S = 0.5  # the env is on a local bridge: a live one answers in far less
HEALTH_READ_TIMEOUT_S = 2.0
SPARE_POLL_S = HEALTH_POLL_S * 5  # a spare boots in the background: poll it less often
POLL_SPREAD_MAX = 8  # a key's starting envs poll at most this many times less often each
CANCEL_MEMORY_S = 3600.0  # a cancelled id is remembered this long (a boot lasts far less)


class BootControl:
    """The Docker node's lock per env, the boots it cancelled and the envs it put first.

    A boot makes each thing under its env's lock (``step``) and checks, between waits, that it
    was not cancelled; the node's teardown, snapshots and live forks take the same lock, so a
    ``cancel`` then a teardown leaves nothing behind, whatever a boot in flight was doing.
    Safe to call from any thread.
    """

    def __init__(self) -> None:
        self._locks = NamedLocks()
        self._mutex = threading.Lock()  # over the fields below, never across a Docker call
        self._cancelled: dict[str, float] = {}  # env id -> when (monotonic)
        self._foreground: set[str] = set()  # envs whose boots create at full CPU weight
        self._polling: Counter[str] = Counter()  # key -> its envs polling their health path
        self._stopped = False

    def lock(self, env_id: str) -> threading.Lock:
        """The env's lock: held while anything of it is made or removed."""
        return self._locks(env_id)

    @contextmanager
    def step(self, env_id: str) -> Iterator[None]:
        """Hold the env's lock; Cancelled when its boot was cancelled."""
        with self.lock(env_id):
            self.check(env_id)
            yield

    def check(self, env_id: str) -> None:
        """Cancelled when the env's boot was cancelled (or the node stopped)."""
        if self._stopped or env_id in self._cancelled:
            raise Cancelled()

    def cancel(self, env_id: str) -> None:
        now = time.monotonic()
        with self._mutex:
            for old in [x for x, t in self._cancelled.items() if now - t > CANCEL_MEMORY_S]:
                del self._cancelled[old]
            self._cancelled[env_id] = now

    def stop(self) -> None:
        """Every boot from now on is cancelled."""
        self._stopped = True

    @contextmanager
    def polling(self, owner: str) -> Iterator[Callable[[], int]]:
        """Count one more env of ``owner`` polling its health path; yields how many now."""
        with self._mutex:
            self._polling[owner] += 1
        try:
            yield lambda: min(POLL_SPREAD_MAX, max(1, self._polling[owner]))
        finally:
            with self._mutex:
                self._polling[owner] -= 1

    def foreground(self, env_id: str, first: bool) -> None:
        """Put the env's boot first (an env waits for it), or forget it (torn down)."""
        with self._mutex:
            if first:
                self._foreground.add(env_id)
            else:
                self._foreground.discard(env_id)

    def cpu_shares(self, spec: BootSpec) -> int | None:
        """The CPU weight of the next container the boot creates (None: Docker's default)."""
        if spec.warm_pool is None:
            return None
        # Booting in the background, the envs in use go first; once an env waits for
        # this spare, it boots as fast as that env's own cold start would.
        return CPU_SHARES if spec.env_id in self._foreground else WARM_CPU_SHARES


def bring_up(
    engine: Engine,
    volumes: Volumes,
    control: BootControl,
    limits: Limits,
    spec: BootSpec,
    queue: EngineQueue,
    cgroup_parent: str | None = None,
) -> Booted:
    """Network, volumes and started containers, and the agent's address.

    ``limits``: the server's, with a service's own in their place (``Limits.of``); the same
    for cold starts and spares. Each Docker call that makes something waits for its turn in
    ``queue`` (as ``spec.owner``); the containers run under ``cgroup_parent`` (the key's).
    """
    env_id = spec.env_id
    deadline = time.monotonic() + spec.timeout_s
    network: str | None = None
    made: dict[str, str] = {}
    policy = parse_egress(spec.egress)
    try:
        with control.step(env_id):
            with queue.slot(spec.owner):
                network = engine.networks.create(env_id, spec.egress)
            binds: dict[str, list[tuple[str, str]]] = {}
            for slot in spec.volumes:
                with queue.slot(spec.owner):  # a filesystem and mounts: disk and kernel time
                    if spec.late_mount:
                        mnt = volumes.prepare(env_id, slot.service, slot.n)
                    else:
                        mnt = volumes.mount(env_id, slot.service, slot.n, slot.layers)
                binds.setdefault(slot.service, []).append((str(mnt), slot.path))
        by_name = {s.name: s for s in spec.services}
        # Without Docker's DNS (gVisor), each service finds those started before it (its
        # dependencies) in its /etc/hosts.
        started: dict[str, str] = {}
        for svc in spec.services:  # in start order: dependencies first
            for dep in svc.depends_on:
                test = by_name[dep].healthcheck
                if test and dep in svc.wait_healthy:
                    _wait_exec(engine, control, spec, dep, made[dep], test, deadline)
            with control.step(env_id):
                agent = svc.name == spec.agent
                command, live_dir, live_env = svc.command, None, {}
                if agent and spec.live:  # the image's own command, under the launcher
                    argv = engine.image_command(svc.image_digest, svc.command)
                    command = launcher_ctl.launcher_command(argv)
                    live_dir, live_env = str(volumes.live_dir(env_id)), {"DENV_ENV_ID": env_id}
                with queue.slot(spec.owner):
                    cid = engine.create_container(
                        env_id,
                        svc.name,
                        svc.image_digest,
                        command,
                        {
                            **(launcher_ctl.DEFAULT_ENV if live_dir else {}),
                            **svc.env,
                            **(spec.env if agent else {}),
                            **live_env,
                            **({RESTORE_ENV: spec.restore} if agent and spec.restore else {}),
                        },
                        svc.ports,
                        binds.get(svc.name, []),
                        network,
                        publish=agent and spec.egress == "allow",
                        extra_labels={WARM_LABEL: spec.warm_pool} if spec.warm_pool else None,
                        cpu_shares=control.cpu_shares(spec),
                        limits=limits.of(svc.limits),
                        deny=not policy.resolver,
                        extra_hosts={**egress_hosts(policy), **started},
                        live_dir=live_dir,
                        cgroup_parent=cgroup_parent,
                    )
                made[svc.name] = cid
                with queue.slot(spec.owner):
                    engine.start(cid)
                later = svc is not spec.services[-1]
                if (
                    later
                    and not engine.embedded_dns
                    and (ip := _ip_on(engine.inspect(cid), network))
                ):
                    started[svc.name] = ip  # no address: it exited, and its wait says so
        with control.step(env_id):
            ip, host_ports = _address(engine, spec, network, made[spec.agent])
    except BootFailed as exc:
        exc.network, exc.containers = network, made
        raise
    except Refused as exc:  # its engine does not answer, an image is gone...
        raise BootFailed("engine_error", exc.message, None, network, made) from exc
    return Booted(
        env_id=env_id,
        network=network,
        containers=made,
        agent_ip=ip,
        host_ports=host_ports,
        restored=bool(spec.restore),
    )


def _exited(engine: Engine, spec: BootSpec, cid: str, message: str) -> BootFailed:
    """The failure of an agent whose container exited: ``live_unsupported`` when the live
    launcher found no Python in the image (its command never ran)."""
    agent = spec.agent_service().name
    if spec.live and engine.exit_code(cid) == launcher_ctl.NO_PYTHON_EXIT:
        return BootFailed("live_unsupported", launcher_ctl.NO_PYTHON, agent)
    return BootFailed("exited", message, agent)


def _ip_on(info: dict[str, Any] | None, network: str) -> str:
    """A container's IP on ``network`` (from its inspect ``info``); "" when it has none."""
    networks = ((info or {}).get("NetworkSettings") or {}).get("Networks") or {}
    return str((networks.get(network) or {}).get("IPAddress") or "")


def _address(engine: Engine, spec: BootSpec, network: str, cid: str) -> tuple[str, dict[int, int]]:
    """The agent's IP on the env's network and its published ports (egress allow)."""
    agent = spec.agent_service()
    info = engine.inspect(cid)
    if info is None:
        raise BootFailed("exited", "the container vanished", agent.name)
    settings = info["NetworkSettings"]
    ip = _ip_on(info, network)
    if not ip:
        raise _exited(engine, spec, cid, "the container exited at once")
    host_ports = {}
    if spec.egress == "allow":
        for port in agent.ports:
            bound = (settings.get("Ports") or {}).get(f"{port}/tcp") or []
            if not bound:
                raise BootFailed("start_failed", f"port {port} was not published", agent.name)
            host_ports[port] = int(bound[0]["HostPort"])
    return ip, host_ports


def _wait_exec(
    engine: Engine,
    control: BootControl,
    spec: BootSpec,
    service: str,
    cid: str,
    test: list[str],
    deadline: float,
) -> None:
    """Until a dependency's healthcheck (an exec in its container) passes."""
    while not engine.exec_ok(cid, test):
        control.check(spec.env_id)
        if engine.state(cid) in ("exited", "missing"):
            raise BootFailed(
                "exited", f"service '{service}' exited before its healthcheck passed", service
            )
        if time.monotonic() > deadline:
            raise BootFailed(
                "health_timeout",
                f"the healthcheck of service '{service}' did not pass within {spec.timeout_name}",
                service,
            )
        time.sleep(0.1)


def wait_healthy(
    engine: Engine, control: BootControl, spec: BootSpec, booted: Booted, timeout_s: float
) -> None:
    """Until the agent answers 200 on its health path (a spare then primes its sessions)."""
    agent = spec.agent_service()
    if not agent.health_path or not agent.ports:
        return
    port = agent.ports[0]
    cid = booted.containers[agent.name]
    deadline = time.monotonic() + timeout_s
    _poll_health(engine, control, spec, agent, cid, f"http://{booted.agent_ip}:{port}", deadline)
    if spec.warm_pool:
        _prime(f"ws://{booted.agent_ip}:{port}/ws")


def _poll_health(
    engine: Engine,
    control: BootControl,
    spec: BootSpec,
    agent: ServiceSpec,
    cid: str,
    base: str,
    deadline: float,
) -> None:
    if spec.warm_pool:  # a spare polls less often anyway, and an env may wait for it
        _poll_until_healthy(
            engine, control, spec, agent, cid, base, deadline, SPARE_POLL_S, lambda: 1
        )
        return
    with control.polling(spec.owner) as polling:
        _poll_until_healthy(
            engine, control, spec, agent, cid, base, deadline, HEALTH_POLL_S, polling
        )


def _poll_until_healthy(
    engine: Engine,
    control: BootControl,
    spec: BootSpec,
    agent: ServiceSpec,
    cid: str,
    base: str,
    deadline: float,
    interval: float,
    polling: Callable[[], int],
) -> None:
    """Poll until healthy, every ``interval`` times ``polling()``: a key with n envs
    starting polls each n times less often (at most POLL_SPREAD_MAX), so the server spends
    about as much on one key's polls as on another's, and a key starting one env is not
    slowed by the polls of another key's sixteen (measured with test_flood: that key's
    create 1.59x its idle time with every env polling every 20 ms, 1.30x with this)."""
    path, port = agent.health_path, agent.ports[0]
    polls = 0
    # A booting server refuses at once; a connect that times out means nobody holds the
    # address any more (the container died): look at the container then, not 10 polls on.
    timeout = httpx.Timeout(HEALTH_READ_TIMEOUT_S, connect=HEALTH_CONNECT_TIMEOUT_S)
    # Plain HTTP to the env's address: no TLS, so no CA bundle to load. A client made with
    # the default verification loads every CA certificate first, ~19 ms of CPU per boot
    # holding the GIL (a third of the server's CPU under a flood of creates).
    with httpx.Client(timeout=timeout, trust_env=False, verify=False) as http:
        while True:
            suspect = False
            try:
                if http.get(f"{base}{path}").status_code == 200:
                    return
            except httpx.TimeoutException:
                suspect = True
            except httpx.HTTPError:
                pass
            polls += 1
            control.check(spec.env_id)
            if (suspect or polls % EXIT_CHECK_EVERY == 0) and engine.state(cid) in (
                "exited",
                "missing",
            ):
                raise _exited(
                    engine, spec, cid, "the agent service exited before it answered its health path"
                )
            if time.monotonic() > deadline:
                if spec.warm_pool and (more := spare_progress.more_time(cid)):
                    deadline += more  # a spare that still boots under load is given time
                    continue
                raise BootFailed(
                    "health_timeout",
                    f"{path} on port {port} did not answer 200 within {spec.timeout_name}",
                    agent.name,
                )
            time.sleep(interval * polling())


def _prime(url: str) -> None:
    """Open and end one OpenEnv session, so a child's first one finds its code loaded.

    An OpenEnv server imports much of its environment's code when the first session
    starts (hundreds of ms); a spare pays that before a fork, not after. The session sees
    the still empty mount points: what it writes there is hidden by the child's overlay.
    Best effort: a server with no ``/ws`` is a spare all the same.
    """
    from websockets.exceptions import WebSocketException
    from websockets.sync.client import connect

    # websockets >= 15 reads proxy settings from the environment; this is a bridge address.
    direct: dict[str, Any] = {"proxy": None} if "proxy" in signature(connect).parameters else {}
    try:
        with connect(url, open_timeout=10, close_timeout=10, **direct) as ws:
            ws.send('{"type": "close"}')
            with contextlib.suppress(TimeoutError, WebSocketException):
                ws.recv(timeout=10)
    except (OSError, TimeoutError, WebSocketException) as exc:
        log.debug("warm: priming %s failed: %s", url, exc)
