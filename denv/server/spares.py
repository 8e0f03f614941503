"""Spares: envs booted before anyone asked for them, with their volumes still to come.

A spare has its own network, its containers started (dependencies healthy first) and the
agent healthy on its health path, and every volume mount point a shared, still empty
``mnt`` (``volumes.prepare``): mounting a child's overlay there later shows it inside the
running containers at once. ``warm`` keeps pools of them.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from inspect import signature
from typing import Any

import httpx

from .config import CPU_SHARES, HEALTH_POLL_S, WARM_BOOT_TIMEOUT_S, WARM_CPU_SHARES
from .context import Context
from .store import VersionRecord

log = logging.getLogger(__name__)

WARM_LABEL = "denv.warm"  # on a spare's containers: the key of its pool


class Cancelled(Exception):
    """The pool or the server went away while a spare was booting."""


@dataclass
class Spare:
    env_id: str
    network: str
    containers: dict[str, str]  # service -> container id
    agent_ip: str
    host_ports: dict[int, int]  # container port -> published host port (egress allow)
    memory: int = 0  # bytes, measured once it was healthy


@dataclass
class Blueprint:
    """What a spare of one pool is started from."""

    services: list[dict[str, Any]]  # the version's services, in start order
    volumes: list[tuple[str, int, str]]  # (service, n, path) of every volume slot
    agent: str
    egress: str
    env: dict[str, str]  # the agent's env overrides


def blueprint(version: VersionRecord, egress: str, env: dict[str, str]) -> Blueprint:
    from .envs import volume_slots

    return Blueprint(
        services=version.services,
        volumes=[(vol["service"], n, vol["path"]) for vol, n in volume_slots(version)],
        agent=version.agent_service,
        egress=egress,
        env=dict(env),
    )


def boot_spare(
    ctx: Context,
    bp: Blueprint,
    env_id: str,
    key: str,
    cancelled: Callable[[], bool],
    claimed: Callable[[], bool],
) -> Spare:
    """Start one spare: network, empty shared mount points, containers, healthy agent."""
    deadline = time.monotonic() + WARM_BOOT_TIMEOUT_S
    network = ctx.engine.create_network(env_id, bp.egress)
    binds: dict[str, list[tuple[str, str]]] = {}
    for service, n, path in bp.volumes:
        binds.setdefault(service, []).append((str(ctx.volumes.prepare(env_id, service, n)), path))
    by_name = {s["name"]: s for s in bp.services}
    containers: dict[str, str] = {}
    for svc in bp.services:
        for dep in svc["depends_on"]:
            if by_name[dep].get("healthcheck") and dep in svc.get("wait_healthy", []):
                _wait_exec(ctx, containers[dep], by_name[dep]["healthcheck"], deadline, cancelled)
        if cancelled():
            raise Cancelled()
        agent = svc["name"] == bp.agent
        cid = ctx.engine.create_container(
            env_id,
            svc["name"],
            svc["image_digest"],
            svc["command"],
            {**svc["env"], **(bp.env if agent else {})},
            svc["ports"],
            binds.get(svc["name"], []),
            network,
            publish=agent and bp.egress == "allow",
            extra_labels={WARM_LABEL: key},
            # Booting in the background, the envs in use go first; once an env waits for
            # this spare (claimed), it boots as fast as that env's own cold start would.
            cpu_shares=CPU_SHARES if claimed() else WARM_CPU_SHARES,
        )
        containers[svc["name"]] = cid
        ctx.engine.start(cid)
        if claimed():  # claimed while it was being created (see WarmPools.expedite)
            ctx.engine.set_cpu_shares(cid, CPU_SHARES)
    agent_svc = by_name[bp.agent]
    info = ctx.engine.inspect(containers[bp.agent])
    if info is None:
        raise RuntimeError("the agent container vanished")
    settings = info["NetworkSettings"]
    ip = str(((settings.get("Networks") or {}).get(network) or {}).get("IPAddress") or "")
    if not ip:
        raise RuntimeError("the agent container exited at once")
    host_ports = {}
    if bp.egress == "allow":
        for port in agent_svc["ports"]:
            bound = (settings.get("Ports") or {}).get(f"{port}/tcp") or []
            if not bound:
                raise RuntimeError(f"port {port} was not published")
            host_ports[port] = int(bound[0]["HostPort"])
    health = agent_svc.get("health_path")
    if health and agent_svc["ports"]:
        _wait_http(
            ctx,
            containers[bp.agent],
            f"http://{ip}:{agent_svc['ports'][0]}{health}",
            deadline,
            cancelled,
        )
        _prime(f"ws://{ip}:{agent_svc['ports'][0]}/ws")
    return Spare(env_id, network, containers, ip, host_ports)


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


def _wait_http(
    ctx: Context, cid: str, url: str, deadline: float, cancelled: Callable[[], bool]
) -> None:
    polls = 0
    with httpx.Client(timeout=2.0, trust_env=False) as http:
        while True:
            try:
                if http.get(url).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if cancelled():
                raise Cancelled()
            polls += 1
            if polls % 25 == 0 and ctx.engine.state(cid) in ("exited", "missing"):
                raise RuntimeError("the agent service exited before it answered its health path")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not answer 200 within {WARM_BOOT_TIMEOUT_S:.0f}s")
            time.sleep(HEALTH_POLL_S * 5)


def _wait_exec(
    ctx: Context, cid: str, test: list[str], deadline: float, cancelled: Callable[[], bool]
) -> None:
    while not ctx.engine.exec_ok(cid, test):
        if cancelled():
            raise Cancelled()
        if ctx.engine.state(cid) in ("exited", "missing") or time.monotonic() > deadline:
            raise RuntimeError("a dependency's healthcheck did not pass")
        time.sleep(0.1)
