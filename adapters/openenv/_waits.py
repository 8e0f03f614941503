"""Waiting for an env to be ready, and the errors that say why it is not.

First the server's long-poll (`wait_env(until="healthy")`): the server watches the env, so
readiness is noticed at once and a crash is reported at once, with the env's last log
lines. Then the probes along the client's own path (health over HTTP, a WebSocket session),
which prove the ingress or published port works.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol

from denv.errors import (
    DenvError,
    EnvReadyTimeout,
    EnvStartError,
    WarmPoolStalled,
    WarmPoolTimeout,
)

from ._connection import Connection
from ._readiness import WebSocketProbe, probe_health

if TYPE_CHECKING:
    from denv import Denv, Env, WarmPool

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


class ReadyWait:
    """One readiness wait of one env (or of a bare URL when `env_id` is None)."""

    def __init__(
        self,
        connection: Connection,
        ws_probe: WebSocketProbe,
        env_id: str | None,
        origin: str,
        timeout: float,
    ) -> None:
        self.connection = connection
        self.ws_probe = ws_probe
        self.env_id = env_id
        self.origin = origin
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout

    def until_healthy(self) -> None:
        """Long-poll the server until the env is healthy; raise when it fails or time is up."""
        assert self.env_id is not None
        denv = self.connection.denv
        status = "not checked"
        while True:
            remaining = self.deadline - time.monotonic()
            poll_s = min(remaining, MAX_WAIT_S)
            if poll_s > 0:
                env = denv.wait_env(self.env_id, until="healthy", timeout_s=round(poll_s, 3))
                status = str(env.status)
                if status in FAILED:
                    raise start_error(denv, env, self.origin)
                if status in ("healthy", "running"):  # running: no health check was asked for
                    return
            # The server's answer decides, not the local clock: a wait that covered all the
            # time left and still saw the env starting means the time is up.
            if poll_s >= remaining:
                raise timeout_error(denv, self.env_id, self.timeout, f"still {status}")

    def until_probes_pass(self, base_url: str) -> None:
        """Probe health, then a WebSocket session, along the client's path, with backoff."""
        delay = PROBE_BACKOFF_S[0]
        while True:
            reason = probe_health(self.connection.http, base_url)
            if reason is None:
                remaining = max(self.deadline - time.monotonic(), 0.5)
                reason = self.ws_probe(base_url, min(remaining, WS_PROBE_MAX_S))
                if reason is None:
                    return
            if self.env_id is not None:
                env = self.connection.denv.get_env(self.env_id)
                if str(env.status) in FAILED:
                    raise start_error(self.connection.denv, env, self.origin)
            if time.monotonic() + delay > self.deadline:
                raise timeout_error(self.connection.denv, self.env_id, self.timeout, reason)
            logger.debug("env %s not ready yet: %s", self.env_id, reason)
            time.sleep(delay)
            delay = min(delay * 2, PROBE_BACKOFF_S[1])


class LogSource(Protocol):
    """Where an error's log tail comes from: a `Denv`, or lines already read."""

    def logs(self, env_id: str, *, service: str | None = None, tail: int = 100) -> list[str]: ...


def start_error(denv: LogSource, env: Env, origin: str) -> EnvStartError | EnvReadyTimeout:
    """The error for an env the server reports failed (a timeout when it gave up waiting)."""
    error = env.error
    cause = f"{error.code}: {error.message}" if error else f"status {env.status}"
    tail = list(error.log_tail) if error and error.log_tail else log_tail(denv, env.id)
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


def timeout_error(
    denv: LogSource, env_id: str | None, timeout: float, reason: str
) -> EnvReadyTimeout:
    which = f"env {env_id}" if env_id else "the OpenEnv server"
    return EnvReadyTimeout(
        f"{which} was not ready within {timeout:g}s ({reason}); it has been deleted.",
        env_id=env_id,
        log_tail=log_tail(denv, env_id) if env_id else (),
        fix=_SLOW_FIX,
    )


def log_tail(denv: LogSource, env_id: str) -> list[str]:
    """The env's last log lines, or none when they cannot be read (a failure path)."""
    try:
        return list(denv.logs(env_id, tail=LOG_TAIL_LINES))
    except DenvError as exc:
        logger.debug("no logs for env %s: %s", env_id, exc)
        return []


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


def run_all(calls: Sequence[Callable[[], None]]) -> None:
    """Run the calls at once (a fork's children wait in parallel); raise the first failure
    after all have finished."""
    if len(calls) <= 1:
        for call in calls:
            call()
        return
    with ThreadPoolExecutor(max_workers=len(calls), thread_name_prefix="denv-fork") as pool:
        futures = [pool.submit(call) for call in calls]
        errors = [f.exception() for f in futures]
    for error in errors:
        if error is not None:
            raise error


def agent_url(env: Env) -> str | None:
    """The agent service's first endpoint (the port clients talk to), without a trailing slash."""
    for endpoint in env.endpoints:
        if endpoint.service == env.agent_service:
            return str(endpoint.url).rstrip("/")
    return None


class _Bound(Protocol):
    @property
    def env_id(self) -> str | None: ...
    def close(self) -> None: ...


def discard(env_ids: Sequence[str], bound: Sequence[_Bound], delete: Callable[[str], None]) -> None:
    """Delete every env of a failed fork: through its provider when one is bound to it (which
    also lets go of the connection), else with `delete`."""
    held = {b.env_id for b in bound}
    for provider in bound:
        try:
            provider.close()
        except Exception as exc:
            logger.warning("could not delete env %s: %s", provider.env_id, exc)
    for env_id in env_ids:
        if env_id not in held:
            delete(env_id)
