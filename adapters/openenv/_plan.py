"""The provider's operations as plans, and the runner that drives a plan with blocking calls.

An operation (start, readiness, fork, stop: `_operations`, `_waits`) takes several steps,
each depending on the answer before it, so it is written once as a plan: a generator that
yields each step and is sent its value (or thrown its error), as `denv.client._lineage` does for the
facade. `run` here drives a plan with `Denv`, `httpx.Client`, the sync WebSocket probe,
`time.sleep` and threads; `_async.run` awaits the same steps on the running event loop.
Neither knows what an operation does, only how to take a step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeAlias, TypeVar, cast

from ._connection import Connection
from ._readiness import WebSocketProbe

T = TypeVar("T")

#: The `Denv` methods a plan calls (`AsyncDenv` has the same, awaited).
Method = Literal[
    "create_sandbox", "envs_from_version", "fork", "delete_env", "wait_env", "get_env", "logs"
]


@dataclass(frozen=True)
class Api:
    """A call of the denv client: `Denv.<method>(*args, **kwargs)`, or `AsyncDenv`'s, awaited."""

    method: Method
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def api(method: Method, *args: Any, **kwargs: Any) -> Api:
    return Api(method, args, kwargs)


@dataclass(frozen=True)
class Get:
    """`GET url` along the client's path (no proxy to this machine); its value is the
    `httpx.Response`, and a transport failure is thrown into the plan."""

    url: str


@dataclass(frozen=True)
class WebSocket:
    """Run the WebSocket readiness probe `probe` on `base_url`; its value is the probe's."""

    probe: WebSocketProbe
    base_url: str
    timeout_s: float


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Together:
    """Run the plans at once; the value is each one's error, or None when it succeeded."""

    plans: Sequence[Plan[Any]]


Step: TypeAlias = Api | Get | WebSocket | Sleep | Together
#: A plan: yields steps, is sent their values, returns its result.
Plan: TypeAlias = Generator[Step, Any, T]


class ConnectionSource(Protocol):
    """Where a runner finds the server: a provider's `Binding`."""

    @property
    def connected(self) -> bool: ...
    def connection(self) -> Connection: ...


class Progress(Generic[T]):
    """A plan under way, for a runner: its next `step`, or its `result` once `step` is None.

    A runner takes each step and hands back its value (`send`) or its error (`throw`); the
    plan decides what an error means, its cleanup included.
    """

    def __init__(self, plan: Plan[T]) -> None:
        self._plan = plan
        self.step: Step | None = None
        self.result: T | None = None
        self._move(plan.send, None)

    def send(self, value: Any) -> None:
        self._move(self._plan.send, value)

    def throw(self, error: BaseException) -> None:
        self._move(self._plan.throw, error)

    def _move(self, move: Callable[[Any], Step], arg: Any) -> None:
        try:
            self.step = move(arg)
        except StopIteration as done:
            self.step, self.result = None, done.value


def run(plan: Plan[T], source: ConnectionSource) -> T:
    """Run `plan` to its result with blocking calls on `source`'s connection."""

    def take(step: Step) -> Any:
        if isinstance(step, Api):
            return getattr(source.connection().denv, step.method)(*step.args, **step.kwargs)
        if isinstance(step, Get):
            return source.connection().http.get(step.url)
        if isinstance(step, WebSocket):
            return step.probe(step.base_url, step.timeout_s)
        if isinstance(step, Sleep):
            time.sleep(step.seconds)
            return None
        return _together(step.plans, source)

    progress = Progress(plan)
    while progress.step is not None:
        try:
            value = take(progress.step)
        except BaseException as exc:
            progress.throw(exc)
        else:
            progress.send(value)
    return cast(T, progress.result)


def _together(plans: Sequence[Plan[Any]], source: ConnectionSource) -> list[BaseException | None]:
    def outcome(plan: Plan[Any]) -> BaseException | None:
        try:
            run(plan, source)
        except BaseException as exc:
            return exc
        return None

    if len(plans) <= 1:
        return [outcome(plan) for plan in plans]
    with ThreadPoolExecutor(max_workers=len(plans), thread_name_prefix="denv-fork") as pool:
        return list(pool.map(outcome, plans))
