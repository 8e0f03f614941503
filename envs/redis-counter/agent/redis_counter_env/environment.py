"""A counter environment whose episode lives in Redis, a service of its own.

The reference for multi-service envs on denv: the OpenEnv server (service ``agent``) keeps
no episode state in memory. Reset writes a fresh episode to a Redis hash; a step adds its
``delta`` to the counter in one MULTI/EXEC transaction; ``state`` reads the hash. Redis
(service ``redis``) appends every write to its AOF under ``/data`` and fsyncs it before
answering (``appendfsync always``), so a snapshot of the ``redis-data`` volume, taken at any
instant, holds every step a client has seen answered, and a fork's Redis starts from it.
"""

from __future__ import annotations

import os
from typing import Any, cast
from uuid import uuid4

import redis
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

REDIS_URL_ENV = "REDIS_URL"
DEFAULT_REDIS_URL = "redis://redis:6379/0"
EPISODE_KEY = "denv:counter:episode"


class CounterAction(Action):  # type: ignore[misc]
    """Add ``delta`` to the counter."""

    delta: int = Field(default=1, description="How much to add (may be negative)")


class CounterObservation(Observation):  # type: ignore[misc]
    """The counter after a reset or a step."""

    count: int = Field(description="The counter's value")


class CounterState(State):  # type: ignore[misc]
    """OpenEnv's ``State`` plus the counter, all read from Redis."""

    count: int = Field(default=0, description="The counter's value")


_client: redis.Redis | None = None


def redis_client() -> redis.Redis:
    """One connection pool per server process; commands retry while Redis (re)starts."""
    global _client
    if _client is None:
        _client = redis.Redis.from_url(
            os.environ.get(REDIS_URL_ENV, DEFAULT_REDIS_URL),
            decode_responses=True,
            socket_connect_timeout=2,
            socket_timeout=10,
            retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=30),
            retry_on_error=[RedisConnectionError, RedisTimeoutError],
        )
    return _client


class RedisCounterEnvironment(Environment):  # type: ignore[misc]
    """A counter in Redis: ``reset`` zeroes it, ``step(CounterAction(delta))`` adds to it.

    Every session reads and writes the same Redis episode, so concurrent sessions are safe
    (each step is one transaction) and a new session continues the episode, as a fork's
    client must.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._redis = redis_client()

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> CounterObservation:
        episode = episode_id or str(uuid4())
        pipe = self._redis.pipeline(transaction=True)
        pipe.delete(EPISODE_KEY)
        pipe.hset(EPISODE_KEY, mapping={"episode_id": episode, "step_count": 0, "count": 0})
        pipe.execute()
        return CounterObservation(count=0, done=False, reward=0.0, metadata={"status": "ready"})

    def step(
        self, action: CounterAction, timeout_s: float | None = None, **kwargs: Any
    ) -> CounterObservation:
        pipe = self._redis.pipeline(transaction=True)
        pipe.hincrby(EPISODE_KEY, "step_count", 1)
        pipe.hincrby(EPISODE_KEY, "count", action.delta)
        step_count, count = pipe.execute()
        return CounterObservation(
            count=count, done=False, reward=float(action.delta), metadata={"step": step_count}
        )

    @property
    def state(self) -> CounterState:
        # redis-py types its sync and async clients together; this one is sync.
        saved = cast(dict[str, str], self._redis.hgetall(EPISODE_KEY))
        return CounterState(
            episode_id=saved.get("episode_id"),
            step_count=int(saved.get("step_count", 0)),
            count=int(saved.get("count", 0)),
        )
