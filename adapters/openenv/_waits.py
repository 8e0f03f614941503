"""Waiting for an env to be ready, and the errors that say why it is not.

First the server's long-poll (`wait_env(until="healthy")`): the server watches the env, so
readiness is noticed at once and a crash is reported at once, with the env's last log
lines. Then the probes along the client's own path (health over HTTP, a WebSocket session),
which prove the ingress or published port works.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from denv.errors import DenvError, EnvReadyTimeout, EnvStartError

from ._connection import Connection
from ._readiness import WebSocketProbe, probe_health

if TYPE_CHECKING:
    from denv import Denv, Env

logger = logging.getLogger(__name__)

#: How many log lines an error carries; enough for a traceback, short enough to read.
LOG_TAIL_LINES = 40
#: Statuses an env does not come back from.
FAILED = frozenset({"failed", "deleted"})
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


def start_error(denv: Denv, env: Env, origin: str) -> EnvStartError | EnvReadyTimeout:
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


def timeout_error(denv: Denv, env_id: str | None, timeout: float, reason: str) -> EnvReadyTimeout:
    which = f"env {env_id}" if env_id else "the OpenEnv server"
    return EnvReadyTimeout(
        f"{which} was not ready within {timeout:g}s ({reason}); it has been deleted.",
        env_id=env_id,
        log_tail=log_tail(denv, env_id) if env_id else (),
        fix=_SLOW_FIX,
    )


def log_tail(denv: Denv, env_id: str) -> list[str]:
    """The env's last log lines, or none when they cannot be read (a failure path)."""
    try:
        return list(denv.logs(env_id, tail=LOG_TAIL_LINES))
    except DenvError as exc:
        logger.debug("no logs for env %s: %s", env_id, exc)
        return []
