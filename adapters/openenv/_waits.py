"""Waiting for an env to be ready, and the errors that say why it is not (as plans: `_plan`).

First the server's long-poll (`wait_env(until="healthy")`): the server watches the env, so
readiness is noticed at once and a crash is reported at once, with the env's last log
lines. Then the probes along the client's own path (health over HTTP, a WebSocket upgrade
that opens no session), which prove the ingress or published port works.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import httpx

from denv.errors import (
    DenvError,
    EnvReadyTimeout,
    EnvStartError,
    WarmPoolStalled,
    WarmPoolTimeout,
)
from denv.progress import SLOW_S, say

from ._plan import Get, Plan, Sleep, WebSocket, api
from ._readiness import WebSocketProbe

if TYPE_CHECKING:
    from denv import Denv, Env, WarmPool

    from ._binding import Binding

logger = logging.getLogger(__name__)

#: How many log lines an error carries; enough for a traceback, short enough to read.
LOG_TAIL_LINES = 40
#: Statuses an env does not come back from.
FAILED = frozenset({"failed", "deleted"})
#: How often wait_warm_pool() asks the server how its spares are doing.
WARM_POLL_S = 0.25
#: The longest single long-poll the contract allows (WaitRequest.timeout_s).
MAX_WAIT_S = 600.0
#: Backoff between probes that fail after the server reported the env healthy.
PROBE_BACKOFF_S = (0.005, 0.25)
#: The longest one WebSocket probe may take.
WS_PROBE_MAX_S = 10.0
_SLOW_FIX = (
    "If the server is just slow to boot, allow more time: DenvProvider(timeout_s=...) "
    "(or wait_timeout=... when starting)."
)


def needs_probes(start: str | None) -> bool:
    """Whether a fork's child is probed along the client's path before fork() returns.

    Not a live child: the server answers a live fork only once each child's server accepts
    connections on its port and its ingress route is in place, and the client's path to that
    ingress is its parent's, which this client already uses. (Probing costs a health request
    per child through the ingress, ~40 ms for fork(8) here; the child's first call is the
    check.) A volume child restarts its server, so it is probed.
    """
    return start != "live"


def ready(binding: Binding, base_url: str, timeout_s: float | None) -> Plan[None]:
    """`DenvProvider.wait_for_ready`: the server's long-poll, then the probes along the
    client's path. The env is deleted when it fails or time is up."""
    config = binding.config
    timeout = timeout_s if timeout_s is not None else binding.ready_timeout_s or config.timeout_s
    env_id, origin = binding.env_id, binding.origin
    deadline = time.monotonic() + timeout
    with binding.released_on_failure():
        try:
            if binding.start == "zygote" and binding.healthy_at_bind:
                # Copied from a zygote: the server answered the create once the copy served
                # and its ingress route was in place, on the path this client's API calls
                # take; its first session is a new one, so a probe session would only cost
                # time.
                return
            if env_id is not None and not binding.healthy_at_bind:
                yield from until_healthy(env_id, origin, timeout, deadline)
            yield from until_probes_pass(
                binding.ws_probe, env_id, origin, base_url, timeout, deadline
            )
        except (EnvStartError, EnvReadyTimeout):
            if env_id is not None:
                yield from delete_quietly(env_id)
                binding.unbind(env_id)
            raise


def until_healthy(env_id: str, origin: str, timeout: float, deadline: float) -> Plan[None]:
    """Long-poll the server until the env is healthy; raise when it fails or time is up."""
    status = "not checked"
    first = True
    while True:
        remaining = deadline - time.monotonic()
        # The first poll is short, so that a slow boot (an image's first, a busy machine)
        # says what is awaited instead of waiting silently.
        poll_s = min(remaining, SLOW_S if first else MAX_WAIT_S)
        if poll_s > 0:
            env: Env = yield api("wait_env", env_id, until="healthy", timeout_s=round(poll_s, 3))
            status = str(env.status)
            if status in FAILED:
                raise (yield from start_error(env, origin))
            if status in ("healthy", "running"):  # running: no health check was asked for
                return
            if first and poll_s < remaining:
                say(
                    "waiting for env %s (%s) to boot and answer its health check (up to "
                    "%.0fs more) ...",
                    env_id,
                    origin,
                    remaining - poll_s,
                )
                first = False
                continue
        # The server's answer decides, not the local clock: a wait that covered all the
        # time left and still saw the env starting means the time is up.
        if poll_s >= remaining:
            raise (yield from timeout_error(env_id, timeout, f"still {status}"))


def until_probes_pass(
    ws_probe: WebSocketProbe,
    env_id: str | None,
    origin: str,
    base_url: str,
    timeout: float,
    deadline: float,
) -> Plan[None]:
    """Probe health, then a WebSocket upgrade (no session), along the client's path, with
    backoff."""
    delay = PROBE_BACKOFF_S[0]
    while True:
        reason = yield from probe_health(base_url)
        if reason is None:
            remaining = max(deadline - time.monotonic(), 0.5)
            reason = yield WebSocket(ws_probe, base_url, min(remaining, WS_PROBE_MAX_S))
            if reason is None:
                return
        if env_id is not None:
            env: Env = yield api("get_env", env_id)
            if str(env.status) in FAILED:
                raise (yield from start_error(env, origin))
        if time.monotonic() + delay > deadline:
            raise (yield from timeout_error(env_id, timeout, reason))
        logger.debug("env %s not ready yet: %s", env_id, reason)
        yield Sleep(delay)
        delay = min(delay * 2, PROBE_BACKOFF_S[1])


def probe_health(base_url: str) -> Plan[str | None]:
    """`GET <base_url>/health`; None when it answers 200, else why not."""
    try:
        response: httpx.Response = yield Get(base_url.rstrip("/") + "/health")
    except httpx.TransportError as exc:
        return f"GET /health failed: {type(exc).__name__}: {exc}"
    if response.status_code == 200:
        return None
    return f"GET /health answered {response.status_code}"


def delete_quietly(env_id: str) -> Plan[None]:
    """Delete an env on a failure path, where a second error would hide the first."""
    try:
        yield api("delete_env", env_id)
    except Exception as exc:
        logger.warning("could not delete env %s: %s", env_id, exc)


def start_error(env: Env, origin: str) -> Plan[EnvStartError | EnvReadyTimeout]:
    """The error for an env the server reports failed (a timeout when it gave up waiting)."""
    error = env.error
    cause = f"{error.code}: {error.message}" if error else f"status {env.status}"
    if error and error.log_tail:
        tail = list(error.log_tail)
    else:
        tail = yield from log_tail(env.id)
    if error is not None and str(error.code) == "health_timeout":
        # The server gave up waiting for the health path (its wait_timeout_s).
        return EnvReadyTimeout(
            f"env {env.id} ({origin}) was not ready in time ({cause}); it has been deleted.",
            env_id=env.id,
            log_tail=tail[-LOG_TAIL_LINES:],
            fix=_SLOW_FIX,
        )
    return EnvStartError(
        f"env {env.id} ({origin}) failed to start ({cause}); it has been deleted.",
        env_id=env.id,
        log_tail=tail[-LOG_TAIL_LINES:],
        fix="Fix the image's server (the log lines show why it stopped); `docker run` "
        "of the same image shows the same failure.",
    )


def timeout_error(env_id: str | None, timeout: float, reason: str) -> Plan[EnvReadyTimeout]:
    which = f"env {env_id}" if env_id else "the OpenEnv server"
    tail = (yield from log_tail(env_id)) if env_id else []
    return EnvReadyTimeout(
        f"{which} was not ready within {timeout:g}s ({reason}); it has been deleted.",
        env_id=env_id,
        log_tail=tail,
        fix=_SLOW_FIX,
    )


def log_tail(env_id: str) -> Plan[list[str]]:
    """The env's last log lines, or none when they cannot be read (a failure path)."""
    try:
        lines: list[str] = yield api("logs", env_id, tail=LOG_TAIL_LINES)
    except DenvError as exc:
        logger.debug("no logs for env %s: %s", env_id, exc)
        return []
    return list(lines)


def wait_warm_pool(
    denv: Denv,
    env_id: str,
    timeout_s: float,
    progress: Callable[[WarmPool], None] | None = None,
) -> WarmPool:
    """Poll the env's warm pool until it is full (or none was asked for); see
    `DenvProvider.wait_warm`."""
    deadline = time.monotonic() + timeout_s
    seen: tuple[str, int, int] | None = None
    if progress is None:

        def progress(pool: WarmPool) -> None:
            if str(pool.state) != "none":
                say(
                    "warm pool of env %s: %d/%d spares ready, %d booting",
                    env_id,
                    pool.ready,
                    pool.target,
                    pool.booting,
                )

    while True:
        pool = denv.warm_pool(env_id)
        state = str(pool.state)
        if (state, pool.ready, pool.booting) != seen and progress is not None:
            progress(pool)
        seen = (state, pool.ready, pool.booting)
        if state in ("none", "ready"):
            return pool
        if state == "stalled":
            raise WarmPoolStalled(
                f"the warm pool of env {env_id} stopped filling at {pool.ready}/"
                f"{pool.target} spares: {pool.error or 'no reason given'}. Forks start "
                "cold meanwhile; fix the cause (the server's log names it), then fork "
                "again with warm to restart the pool.",
                pool,
            )
        if time.monotonic() + WARM_POLL_S > deadline:
            raise WarmPoolTimeout(
                f"the warm pool of env {env_id} had {pool.ready}/{pool.target} spares "
                f"ready ({pool.booting} booting) after {timeout_s:g}s: the machine may be "
                "busy; wait longer (timeout_s) or fork now (children without a spare "
                "start cold).",
                pool,
            )
        time.sleep(WARM_POLL_S)


def agent_url(env: Env) -> str | None:
    """The agent service's first endpoint (the port clients talk to), without a trailing slash."""
    for endpoint in env.endpoints:
        if endpoint.service == env.agent_service:
            return str(endpoint.url).rstrip("/")
    return None
