"""This server's connection to the Docker Engine through the ``docker`` SDK, and its labels.

``Engine`` (images, containers) and ``EnvNetworks`` (env networks) both call Docker through
it. Every call blocks; callers run them in threads. Every object carries the labels
``denv.managed``, ``denv.instance``, ``denv.env`` and ``denv.service``, and reconcile only ever
touches objects with this server's ``denv.instance``. A transport failure becomes the
node's ``EngineUnavailable`` here (``engine_errors``); the API's edge answers it (503).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import docker
import docker.errors
import requests.exceptions

from denv.server.config import DOCKER_TIMEOUT_S, START_WORKERS
from denv.server.node.errors import EngineUnavailable


@contextmanager
def engine_errors() -> Iterator[None]:
    """Docker transport failures become ``EngineUnavailable``."""
    try:
        yield
    except (requests.exceptions.ConnectionError, docker.errors.DockerException) as exc:
        if isinstance(exc, docker.errors.APIError | docker.errors.ImageNotFound):
            raise
        why = type(exc).__name__
        raise EngineUnavailable(
            f"the Docker Engine is not reachable ({why}): start dockerd, then retry"
        ) from exc


class DockerApi:
    """The Docker Engine's client (made at first use) and the labels of this server's objects."""

    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        self._client: docker.DockerClient | None = None

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            with engine_errors():
                self._client = docker.from_env(
                    timeout=DOCKER_TIMEOUT_S, max_pool_size=START_WORKERS
                )
        return self._client

    @property
    def api(self) -> Any:
        return self.client.api

    def labels(self, env_id: str, service: str = "") -> dict[str, str]:
        return {
            "denv.managed": "true",
            "denv.instance": self.instance_id,
            "denv.env": env_id,
            "denv.service": service,
        }
