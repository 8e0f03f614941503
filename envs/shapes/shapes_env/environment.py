"""The shapes environment: an episode kept in memory and in files outside ``/work``.

Each step appends its message to the episode in memory and, as tool-using envs keep their
work, a line to ``episode.log`` in each folder of ``FILE_DIRS`` (default ``/workspace`` and
``/tmp/shapes``); ``state()`` reports both, the files as read back. A step whose message is
``matmul`` also multiplies two 600x600 matrices with NumPy (OpenBLAS, with threads of its
own), as envs that compute do, and answers their first element. ``INIT_DELAY_S`` makes
building the environment slow (an env that waits for a service of its own), and every
observation names the process that served it (``pid``), so a test sees which worker or
child answered.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any
from uuid import uuid4

import numpy as np
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


def _dirs() -> list[Path]:
    spec = os.environ.get("FILE_DIRS", "/workspace,/tmp/shapes")
    return [Path(d) for d in spec.split(",") if d]


def _files() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for d in _dirs():
        log = d / "episode.log"
        out[str(log)] = log.read_text().splitlines() if log.exists() else []
    return out


class ShapesAction(Action):  # type: ignore[misc]
    """One step: ``{"message": "hi"}``."""

    message: str = Field(description="The message to keep")


class ShapesObservation(Observation):  # type: ignore[misc]
    """What a step did: the message, the episode so far, and who served it."""

    echoed_message: str = Field(default="", description="The message, echoed")
    messages: list[str] = Field(default_factory=list, description="The episode's messages")
    files: dict[str, list[str]] = Field(default_factory=dict, description="The files' lines")
    pid: int = Field(default=0, description="The process that served the step")


class ShapesState(State):  # type: ignore[misc]
    """The episode: OpenEnv's ``State``, the messages in memory and the files' lines."""

    messages: list[str] = Field(default_factory=list, description="The episode's messages")
    files: dict[str, list[str]] = Field(default_factory=dict, description="The files' lines")


class ShapesEnvironment(Environment):  # type: ignore[misc]
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        time.sleep(float(os.environ.get("INIT_DELAY_S", "0")))
        self._state = ShapesState(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed: Any = None, episode_id: str | None = None, **_: Any) -> Observation:
        self._state = ShapesState(episode_id=episode_id or str(uuid4()), step_count=0)
        for d in _dirs():
            d.mkdir(parents=True, exist_ok=True)
            (d / "episode.log").write_text("")
        return ShapesObservation(files=_files(), pid=os.getpid(), done=False, reward=0.0)

    def step(self, action: ShapesAction, timeout_s: float | None = None, **_: Any) -> Observation:
        self._state.step_count += 1
        self._state.messages.append(action.message)
        echoed = action.message
        if action.message == "matmul":
            product = np.ones((600, 600)) @ np.ones((600, 600))
            echoed = f"matmul {product[0, 0]:.0f}"
        for d in _dirs():
            d.mkdir(parents=True, exist_ok=True)
            with (d / "episode.log").open("a") as f:
                f.write(action.message + "\n")
        return ShapesObservation(
            echoed_message=echoed,
            messages=list(self._state.messages),
            files=_files(),
            pid=os.getpid(),
            done=False,
            reward=float(len(action.message)),
        )

    @property
    def state(self) -> State:
        self._state.files = _files()
        return self._state
