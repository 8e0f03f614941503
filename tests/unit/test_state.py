"""denv.openenv.state: forkable state on real OpenEnv environment classes, no Docker."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any, ClassVar
from uuid import uuid4

import pytest
from denv.openenv import state as forkable_state
from denv.openenv.state import (
    STATE_PATH_ENV,
    ForkableState,
    StateFileError,
    forkable,
    save_state,
    state_path,
)
from openenv.core.env_server._utils import overrides_method
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import BaseModel


class Note(BaseModel):
    text: str
    tags: list[str] = []


class CountAction(Action):  # type: ignore[misc]
    delta: int = 1


class CounterState(State):  # type: ignore[misc]
    total: int = 0


class Counter(ForkableState, Environment):  # type: ignore[misc]
    __denv_fields__: ClassVar[tuple[str, ...]] = ("history", "note")

    def __init__(self) -> None:
        super().__init__()
        self._state = CounterState(episode_id=str(uuid4()))
        self.history: list[int] = []
        self.note = Note(text="")

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Any:
        self._state = CounterState(episode_id=episode_id or str(uuid4()))
        self.history = []
        return Observation()

    def step(self, action: Any, timeout_s: float | None = None, **kw: Any) -> Any:
        self._state.step_count += 1
        self._state.total += action.delta
        self.history.append(action.delta)
        self.note = Note(text=f"step {self._state.step_count}", tags=["a", "b"])
        if action.delta < 0:
            raise ValueError("negative delta")
        return Observation(reward=float(action.delta))

    @property
    def state(self) -> CounterState:
        return self._state


@pytest.fixture
def path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    p = tmp_path / "work" / ".denv" / "state.json"
    monkeypatch.setenv(STATE_PATH_ENV, str(p))
    return p


def saved(path: Path) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(path.read_text())
    return record


def test_reset_and_step_persist(path: Path) -> None:
    env = Counter()
    assert not path.exists(), "creating an instance must not write"
    env.reset(episode_id="ep-1")
    assert saved(path)["state"]["episode_id"] == "ep-1"
    env.step(CountAction(delta=3))
    env.step(CountAction(delta=4))
    record = saved(path)
    assert record["state"] == {"episode_id": "ep-1", "step_count": 2, "total": 7}
    assert record["fields"]["history"] == [3, 4]
    assert record["env"].endswith("Counter")


def test_fresh_instance_restores_state_and_fields(path: Path) -> None:
    parent = Counter()
    parent.reset(episode_id="ep-2")
    parent.step(CountAction(delta=5))

    child = Counter()
    assert child.state == parent.state
    assert isinstance(child.state, CounterState)
    assert child.history == [5]
    assert child.note == Note(text="step 1", tags=["a", "b"])
    assert isinstance(child.note, Note)

    # The child goes on from the parent's step, and a later child sees the child's.
    child.step(CountAction(delta=1))
    assert Counter().state.step_count == 2
    assert parent.state.step_count == 1


def test_no_saved_file_keeps_the_fresh_episode(path: Path) -> None:
    env = Counter()
    assert env.state.step_count == 0
    assert env.history == []


def test_crash_mid_write_leaves_the_previous_file(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = Counter()
    env.reset(episode_id="ep-3")
    env.step(CountAction(delta=1))
    before = path.read_bytes()

    def crash(fd: int) -> None:
        raise OSError("simulated crash before the data reached the disk")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError, match="simulated crash"):
        env.step(CountAction(delta=1))
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["state.json"], "temp file left"
    monkeypatch.undo()
    monkeypatch.setenv(STATE_PATH_ENV, str(path))
    assert Counter().state.step_count == 1


def test_failed_step_saves_what_memory_holds(path: Path) -> None:
    env = Counter()
    env.reset(episode_id="ep-4")
    with pytest.raises(ValueError, match="negative"):
        env.step(CountAction(delta=-1))
    assert saved(path)["state"]["step_count"] == 1
    assert Counter().state == env.state


def test_nested_calls_save_once_and_init_reset_does_not_clobber(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Resetting(Counter):
        def __init__(self) -> None:
            super().__init__()
            self.reset()  # some envs start an episode in __init__

        def step(self, action: Any, timeout_s: float | None = None, **kw: Any) -> Any:
            return super().step(action, timeout_s, **kw)

    parent = Resetting()
    parent.reset(episode_id="ep-5")
    writes: list[Path] = []
    real_write = forkable_state._write_atomic

    def counting_write(p: Path, data: bytes) -> None:
        writes.append(p)
        real_write(p, data)

    monkeypatch.setattr(forkable_state, "_write_atomic", counting_write)
    parent.step(CountAction(delta=2))
    assert len(writes) == 1

    child = Resetting()
    assert child.state.episode_id == "ep-5"
    assert child.state.step_count == 1
    assert len(writes) == 1, "an __init__ that resets must not save over the parent's state"


class AsyncCounter(Counter):
    async def step_async(self, action: Any, timeout_s: float | None = None, **kw: Any) -> Any:
        await asyncio.sleep(0)
        self._state.step_count += 10
        return Observation()


def test_async_overrides_persist(path: Path) -> None:
    env = AsyncCounter()
    env.reset(episode_id="ep-6")
    asyncio.run(env.step_async(CountAction()))
    assert saved(path)["state"]["step_count"] == 10


def test_base_async_defaults_stay_unhooked(path: Path) -> None:
    # OpenEnv runs sync step() in a worker thread unless step_async is overridden;
    # the mixin must not make a sync env look async to the server.
    env = Counter()
    assert not overrides_method(env.step_async, Environment.step_async)
    assert not overrides_method(env.reset_async, Environment.reset_async)
    assert overrides_method(AsyncCounter().step_async, Environment.step_async)
    # The base default calls step(), which saves.
    env.reset(episode_id="ep-7")
    asyncio.run(env.step_async(CountAction(delta=2)))
    assert saved(path)["state"]["total"] == 2


def test_decorator_form(path: Path) -> None:
    @forkable(fields=("last",))
    class Echo(Environment):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self._state = State(episode_id="fresh")
            self.last: int | None = None

        def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Any:
            self._state = State(episode_id=episode_id)
            return Observation()

        def step(self, action: Any, timeout_s: float | None = None, **kw: Any) -> Any:
            self._state.step_count += 1
            self.last = action.delta
            return Observation()

        @property
        def state(self) -> State:
            return self._state

    env = Echo()
    env.reset(episode_id="ep-8")
    env.step(CountAction(delta=9))
    child = Echo()
    assert child.state == State(episode_id="ep-8", step_count=1)
    assert child.last == 9


def test_corrupt_file_names_the_file_and_the_fix(path: Path) -> None:
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(StateFileError, match=r"not valid JSON .*delete it"):
        Counter()


def test_unserializable_field_says_what_to_store(path: Path) -> None:
    class Bad(Counter):
        __denv_fields__ = ("handle",)

        def __init__(self) -> None:
            super().__init__()
            self.handle = object()

    with pytest.raises(TypeError, match="JSON value or a pydantic model"):
        Bad().reset()


def test_default_path_only_where_work_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(STATE_PATH_ENV, raising=False)
    monkeypatch.setattr(forkable_state, "DEFAULT_STATE_PATH", tmp_path / "nowork" / ".denv" / "s")
    assert state_path() is None
    env = Counter()
    env.reset()
    assert save_state(env) is None
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setattr(forkable_state, "DEFAULT_STATE_PATH", work / ".denv" / "state.json")
    assert state_path() == work / ".denv" / "state.json"
    env.step(CountAction())
    assert Counter().state == env.state


def test_mcp_environment_tool_call_through_step_async(path: Path) -> None:
    from fastmcp import FastMCP
    from openenv.core.env_server.mcp_environment import MCPEnvironment
    from openenv.core.env_server.mcp_types import CallToolAction

    class Tools(ForkableState, MCPEnvironment):  # type: ignore[misc]
        __denv_fields__ = ("last_message",)

        def __init__(self) -> None:
            mcp = FastMCP("t")

            @mcp.tool
            def shout(message: str) -> str:
                return message.upper()

            super().__init__(mcp)
            self._state = State(episode_id="x")
            self.last_message: str | None = None

        def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Any:
            self._state = State(episode_id=episode_id)
            return Observation()

        def _step_impl(self, action: Any, timeout_s: float | None = None, **kw: Any) -> Any:
            return Observation()

        async def step_async(self, action: Any, timeout_s: float | None = None, **kw: Any) -> Any:
            self._state.step_count += 1
            self.last_message = action.arguments.get("message")
            return await super().step_async(action, timeout_s=timeout_s, **kw)

        @property
        def state(self) -> State:
            return self._state

    env = Tools()
    env.reset(episode_id="ep-9")
    obs = asyncio.run(
        env.step_async(CallToolAction(tool_name="shout", arguments={"message": "hi"}))
    )
    assert obs.error is None
    child = Tools()
    assert child.state == State(episode_id="ep-9", step_count=1)
    assert child.last_message == "hi"
