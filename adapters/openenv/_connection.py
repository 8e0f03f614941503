"""Where a DenvProvider's denv server is, and the one client it and its forks share.

Resolution, first match wins:

1. the `server` argument (with `api_key`, or DENV_API_KEY, or the local key);
2. DENV_SERVER (with DENV_API_KEY);
3. the embedded default: a local `denv serve` owned by this user, started
   when none answers (`denv.local.ensure_local_server`).

With none of these usable, the error says what to install or set.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import ssl
import threading
from typing import TYPE_CHECKING

import httpx

from denv.errors import DenvConfigError
from denv.local import (
    ENV_API_KEY,
    ENV_SERVER,
    ENV_STATE_DIR,
    ensure_local_server,
    read_local_server,
    resolve_server,
)

from ._readiness import is_loopback

if TYPE_CHECKING:
    from denv import Denv

logger = logging.getLogger(__name__)

#: Seconds one readiness probe (GET /health) may take.
PROBE_TIMEOUT_S = 5.0
#: Packages the embedded local server needs (in the `denv[openenv]` extra).
_SERVER_PACKAGES = ("fastapi", "uvicorn", "docker")
_NO_SERVER = (
    "no denv server is configured (no server argument, DENV_SERVER is unset), so DenvProvider "
    "uses a local `denv serve`, but {problem}. Either {fix}, or set DENV_SERVER (and "
    "DENV_API_KEY) to a running denv server."
)


@functools.cache
def default_tls() -> ssl.SSLContext:
    """The probes' TLS verification (httpx's default), built once: each build loads every CA
    certificate, tens of ms of CPU that many probe clients made at once would repeat."""
    return httpx.create_ssl_context()


#: Seconds a connection no provider holds is kept for the next one of this process: a
#: trainer that makes a provider per env (start, step, stop, again) then shares one client
#: and one lease instead of opening and closing both for every env.
IDLE_KEEP_S = 30.0

_ConnectionKey = tuple[str | None, str | None, str | None, str | None, str | None, bool, int]
_kept: dict[_ConnectionKey, Connection] = {}
_kept_lock = threading.Lock()


class Connection:
    """One denv client, shared by the providers of a process that name the same server.

    Each holder calls `share()` once and `release()` once. When the last holder lets go the
    connection idles for `IDLE_KEEP_S` (the next provider takes it back), then closes, and
    with it the client's lease: the envs the providers started and forked and did not
    detach are deleted then (or, if the process dies first, when the lease expires).
    """

    def __init__(
        self,
        denv: Denv,
        api_key: str,
        *,
        detach: bool = False,
        local_pid: int | None = None,
        key: _ConnectionKey | None = None,
    ) -> None:
        self.denv = denv
        self.api_key = api_key
        self.detach = detach
        # Probes go to the env's base URL (the server's ingress or a published
        # port on its host): never through a proxy when that host is this machine.
        self.http = httpx.Client(
            timeout=PROBE_TIMEOUT_S, trust_env=not is_loopback(denv.server), verify=default_tls()
        )
        self._local_pid = local_pid  # the local server's, when that is where this goes
        self._key = key  # where `_kept` holds it, None when it is not kept
        self._holders = 1
        self._closed = False
        self._idle: threading.Timer | None = None
        self._lock = threading.Lock()

    def share(self) -> Connection:
        """Count one more holder and return self."""
        with self._lock:
            if self._closed:
                raise RuntimeError("this denv connection is already closed")
            self._holders += 1
            idle, self._idle = self._idle, None
        if idle is not None:
            idle.cancel()
        return self

    def reusable(self) -> bool:
        """Whether a new provider may take this connection: open, its lease not ended by the
        server, and (for the local server) that server still running."""
        if self._closed or self.denv.lease_ended:
            return False
        return self._local_pid is None or _alive(self._local_pid)

    def lease_id(self) -> str | None:
        """The lease the providers' envs go under, opened on first use (a request: blocking);
        None when they are detached. `AsyncDenv` clients of async runs send it too."""
        with self._lock:
            return None if self.detach else self.denv.hold_lease()

    def release(self) -> None:
        """Count one holder less; when none is left, close now (a connection not kept for
        reuse) or after `IDLE_KEEP_S` unless a provider takes it back."""
        with self._lock:
            self._holders -= 1
            if self._holders > 0 or self._closed:
                return
            if self._kept() and self.reusable():
                self._idle = threading.Timer(IDLE_KEEP_S, self._close_if_idle)
                self._idle.daemon = True
                self._idle.start()
                return
        self._close()

    def _kept(self) -> bool:
        with _kept_lock:
            return self._key is not None and _kept.get(self._key) is self

    def _close_if_idle(self) -> None:
        with self._lock:
            if self._holders > 0 or self._idle is None:
                return
            self._idle = None
        self._close()

    def _close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with _kept_lock:
            if self._key is not None and _kept.get(self._key) is self:
                del _kept[self._key]
        self.http.close()
        self.denv.close()


def open_connection(server: str | None, api_key: str | None, detach: bool = False) -> Connection:
    """A connection to the configured denv server (see the module docstring); with `detach`
    its client holds no lease. A connection of this process to the same server, with the
    same settings, is shared rather than opened again."""
    from denv import Denv

    key: _ConnectionKey = (
        server,
        api_key,
        os.environ.get(ENV_SERVER),
        os.environ.get(ENV_API_KEY),
        os.environ.get(ENV_STATE_DIR),  # whose local server
        detach,
        os.getpid(),  # never a parent's client after os.fork()
    )
    with _kept_lock:
        kept = _kept.get(key)
    if kept is not None and kept.reusable():
        try:
            return kept.share()
        except RuntimeError:  # closed in between
            pass
    local_pid = None
    server_given = server is not None or bool(os.environ.get(ENV_SERVER))
    if not server_given:
        server, local_key, local_pid = _local_server()
        api_key = api_key or local_key
    # The client's own rules for the rest (DENV_API_KEY, the local server's key), resolved
    # here so that the provider can hand the same key to the providers it forks.
    server, api_key = resolve_server(server, api_key)
    connection = Connection(
        Denv(server, api_key, detach=detach),
        api_key,
        detach=detach,
        local_pid=local_pid,
        # kept for reuse unless it is a local server whose process cannot be checked
        key=key if local_pid is not None or server_given else None,
    )
    with _kept_lock:
        _kept[key] = connection
    return connection


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it runs
        return True
    return True


def _local_server() -> tuple[str, str, int | None]:
    """(url, api key, pid) of this user's local `denv serve`, started if none answers."""
    running = read_local_server()
    if running is None:
        _check_can_serve()
        logger.info("starting a local denv server (no DENV_SERVER set)")
        running = ensure_local_server()
    _check_engine(running.url, running.api_key)
    return running.url, running.api_key, running.pid


def _check_can_serve() -> None:
    missing = [name for name in _SERVER_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise DenvConfigError(
            _NO_SERVER.format(
                problem=f"the packages it needs are not installed ({', '.join(missing)})",
                fix="pip install 'denv[openenv]' and install Docker Engine "
                "(https://docs.docker.com/engine/install/)",
            )
        )
    if not _docker_reachable():
        raise DenvConfigError(
            _NO_SERVER.format(
                problem="the Docker Engine is not reachable (docker ping failed)",
                fix="install Docker Engine (https://docs.docker.com/engine/install/) and start "
                "it, or point DOCKER_HOST at a running one",
            )
        )


def _docker_reachable() -> bool:
    import docker

    try:
        client = docker.from_env(timeout=5)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # docker raises DockerException, requests and OS errors alike
        return False


def _check_engine(url: str, api_key: str) -> None:
    """A local server that answers but has no engine cannot start anything: say so now."""
    from denv import Denv

    with Denv(url, api_key) as denv:
        engine = denv.health().engine
    if engine == "unavailable":
        raise DenvConfigError(
            _NO_SERVER.format(
                problem=f"the local server at {url} cannot reach the Docker Engine",
                fix="install Docker Engine (https://docs.docker.com/engine/install/) and start "
                "it, then restart the local server (denv serve)",
            )
        )
