"""The counter env's server: ``uvicorn redis_counter_env.app:app --host 0.0.0.0 --port 8000``.

Redis is found at ``$REDIS_URL`` (default ``redis://redis:6379/0``, the compose service).
"""

from __future__ import annotations

import os

from openenv.core.env_server.http_server import create_app

from .environment import CounterAction, CounterObservation, CounterState, RedisCounterEnvironment

app = create_app(
    RedisCounterEnvironment,
    CounterAction,
    CounterObservation,
    env_name="redis_counter",
    max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "8")),
    state_cls=CounterState,
)
