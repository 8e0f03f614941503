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
from denv.local import ENV_SERVER, ensure_local_server, read_local_server, resolve_server

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


class Connection:
    """One denv client, shared by a provider and the providers forked from it.

    Each holder calls `share()` once and `release()` once; the client closes
    when the last holder lets go, and with it the client's lease: the envs the providers
    started and forked and did not detach are deleted then (or, if the process dies first,
    when the lease expires).
    """

    def __init__(self, denv: Denv, api_key: str, *, detach: bool = False) -> None:
        self.denv = denv
        self.api_key = api_key
        self.detach = detach
        self._lease_id: str | None = None
        # Probes go to the env's base URL (the server's ingress or a published
        # port on its host): never through a proxy when that host is this machine.
        self.http = httpx.Client(
            timeout=PROBE_TIMEOUT_S, trust_env=not is_loopback(denv.server), verify=default_tls()
        )
        self._holders = 1
        self._lock = threading.Lock()

    def share(self) -> Connection:
        """Count one more holder and return self."""
        with self._lock:
            if self._holders == 0:
                raise RuntimeError("this denv connection is already closed")
            self._holders += 1
        return self

    def lease_id(self) -> str | None:
        """The lease the providers' envs go under, opened on first use (a request: blocking);
        None when they are detached. `AsyncDenv` clients of async runs send it too."""
        with self._lock:
            if self._lease_id is None and not self.detach:
                lease = self.denv.lease()
                self._lease_id = None if lease is None else lease.id
            return self._lease_id

    def release(self) -> None:
        """Count one holder less; close the clients when none is left."""
        with self._lock:
            self._holders -= 1
            last = self._holders == 0
        if last:
            self.http.close()
            self.denv.close()


def open_connection(server: str | None, api_key: str | None, detach: bool = False) -> Connection:
    """A connection to the configured denv server (see the module docstring); with `detach`
    its client holds no lease."""
    from denv import Denv

    if server is None and not os.environ.get(ENV_SERVER):
        server, local_key = _local_server()
        api_key = api_key or local_key
    # The client's own rules for the rest (DENV_API_KEY, the local server's key), resolved
    # here so that the provider can hand the same key to the providers it forks.
    server, api_key = resolve_server(server, api_key)
    return Connection(Denv(server, api_key, detach=detach), api_key, detach=detach)


def _local_server() -> tuple[str, str]:
    """(url, api key) of this user's local `denv serve`, started if none answers."""
    running = read_local_server()
    if running is None:
        _check_can_serve()
        logger.info("starting a local denv server (no DENV_SERVER set)")
        running = ensure_local_server()
    _check_engine(running.url, running.api_key)
    return running.url, running.api_key


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
