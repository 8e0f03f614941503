"""The echo env's server: ``uvicorn echo_env.app:app --host 0.0.0.0 --port 8000``.

OpenEnv's ``create_app`` serves ``/health``, ``/reset``, ``/step``, ``/state``, ``/schema``,
``/mcp`` and the WebSocket ``/ws``; each WebSocket session gets its own
``EchoEnvironment``, which starts from the episode saved under ``/work``.
"""

from __future__ import annotations

import os

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolObservation
from openenv.core.env_server.types import Observation

from .environment import EchoAction, EchoEnvironment, EchoState

app = create_app(
    EchoEnvironment,
    EchoAction,
    CallToolObservation,
    env_name="echo_env",
    max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "8")),
    state_cls=EchoState,
    reset_observation_cls=Observation,
)
