"""What a parsed compose file is: ``ComposeSpec``, its ``ComposeService``s, ``ComposeError``.

The records the parser (``parse``, ``services``) builds and the deploy path reads
(``versions``, ``limits``), in a module of their own so that both parser modules import them
without importing each other. ``ComposeService`` is one compose service as written (its
container paths, its own limits); ``records.ServiceSpec`` is what a version stores once the
image is pinned.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass, field

from denv.server.errors import ApiError

SHORT = reprlib.Repr()  # for values in messages: a shared structure is never written out
SHORT.maxlevel, SHORT.maxlist, SHORT.maxdict = 2, 3, 3
SHORT.maxstring = SHORT.maxother = 40


class ComposeError(ApiError):
    def __init__(self, path: str, problem: str) -> None:
        super().__init__(422, "invalid_compose", f"{path}: {problem}", {"path": path})


@dataclass
class ComposeService:
    name: str
    image: str
    command: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    ports: list[int] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)  # container paths
    depends_on: list[str] = field(default_factory=list)
    wait_healthy: list[str] = field(default_factory=list)  # dependencies to wait healthy for
    healthcheck: list[str] | None = None  # argv run with docker exec
    # The service's own limits (None: the server's); checked against the server's at deploy.
    memory_mb: int | None = None
    pids: int | None = None
    cpus: float | None = None


@dataclass
class ComposeSpec:
    agent_service: str
    health_path: str
    services: list[ComposeService]  # in start order (dependencies first)
    fork: str | None = None  # x-denv.agent.fork: "warm", "cold", or None (undeclared)
    tools: list[str] | None = None  # x-denv.tools: the MCP tools it declares, None: none said
