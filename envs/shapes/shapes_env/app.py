"""The shapes env's server: ``uvicorn shapes_env.app:app --host 0.0.0.0 --port 8000``.

``MAX_SESSIONS`` (default 4) is OpenEnv's ``max_concurrent_envs``: 1 makes a single-session
env, as envs that hold one external resource (a game, a repository server) are.
"""

from __future__ import annotations

import os

from openenv.core.env_server.http_server import create_app

from .environment import ShapesAction, ShapesEnvironment, ShapesObservation, ShapesState

app = create_app(
    ShapesEnvironment,
    ShapesAction,
    ShapesObservation,
    env_name="shapes_env",
    max_concurrent_envs=int(os.environ.get("MAX_SESSIONS", "4")),
    state_cls=ShapesState,
)
