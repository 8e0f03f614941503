"""The exported environment's server: ``uvicorn server.app:app --host 0.0.0.0 --port 8000``.

OpenEnv's ``create_app`` serves ``/health``, ``/reset``, ``/step``, ``/state``, ``/schema``,
``/mcp`` and the WebSocket ``/ws``; each WebSocket session gets its own
``DenvVersionEnvironment``, i.e. its own denv env from the version.
"""

from __future__ import annotations

import os

from openenv.core.env_server.http_server import create_app

from .environment import (
    DenvAction,
    DenvObservation,
    DenvState,
    DenvVersionEnvironment,
    load_version,
)

app = create_app(
    DenvVersionEnvironment,
    DenvAction,
    DenvObservation,
    env_name=str(load_version().get("name", "denv_env")),
    max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "8")),
    state_cls=DenvState,
)
