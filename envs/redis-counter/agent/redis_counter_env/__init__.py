"""denv's multi-service reference env: an OpenEnv counter whose episode lives in Redis."""

from .environment import CounterAction, CounterObservation, CounterState, RedisCounterEnvironment

__all__ = ["CounterAction", "CounterObservation", "CounterState", "RedisCounterEnvironment"]
