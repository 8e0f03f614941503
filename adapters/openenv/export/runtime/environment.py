"""The exported environment: every reset is a new denv env from the version.

`reset` starts an env from the version on the denv server (DENV_SERVER, DENV_API_KEY),
connects to its agent service as an OpenEnv client, and deletes the env the session had
before; `step`, `state` and MCP tool calls go to the current env. The env starts with the
version's exact state (its volumes, databases and seeded data included). By default `reset`
does not call the env's own reset, which would start a new episode inside it and so discard
what the version holds; set DENV_RESET=env to call it as well.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from pydantic import ConfigDict

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

from .denv_api import DenvApi, agent_url
from .inner import InnerEnv
from .tools import ToolBridge

log = logging.getLogger(__name__)

#: What `denv export` wrote about the version (id, agent service, port, tools), beside server/.
VERSION_FILE = "denv-version.json"
RESET_MODES = ("version", "env")


class DenvAction(Action):  # type: ignore[misc]  # openenv ships no type hints
    """Any action of the version's env, passed on unchanged."""

    model_config = ConfigDict(extra="allow")


class DenvObservation(Observation):  # type: ignore[misc]
    """The env's observation, field for field."""

    model_config = ConfigDict(extra="allow")


class DenvState(State):  # type: ignore[misc]
    """The env's state, field for field."""

    model_config = ConfigDict(extra="allow")


def load_version() -> dict[str, Any]:
    """The version facts; DENV_EXPORT_VERSION_FILE names another file (tests do)."""
    value = os.environ.get("DENV_EXPORT_VERSION_FILE")
    path = Path(value) if value else Path(__file__).resolve().parent.parent / VERSION_FILE
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def reset_mode(version: dict[str, Any]) -> str:
    mode = os.environ.get("DENV_RESET") or version.get("reset") or "version"
    if mode not in RESET_MODES:
        raise ValueError(f"DENV_RESET={mode!r}: expected one of {', '.join(RESET_MODES)}")
    return str(mode)


_live: weakref.WeakSet[DenvVersionEnvironment] = weakref.WeakSet()


@atexit.register
def _delete_live_envs() -> None:
    # Sessions a client never closed: their envs would otherwise live until their TTL.
    for environment in list(_live):
        environment.close()


class DenvVersionEnvironment(Environment):  # type: ignore[misc]
    """One session's view of the version: the env its last reset started."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.version = load_version()
        self.tools: list[str] | None = self.version.get("tools")
        self.mcp_client = ToolBridge(self.tools, self.current)
        self._api = DenvApi.from_environ()
        self._lock = threading.RLock()
        self._env_id: str | None = None
        self._inner: InnerEnv | None = None
        self._rewards = _RewardLog.from_environ()
        _live.add(self)

    # -- the env's lifecycle

    def _start(self) -> tuple[str, InnerEnv]:
        version_id = self.version["version_id"]
        labels = {"denv.export": "openenv", "denv.export.version": version_id}
        began = time.monotonic()
        env = self._api.start_env(version_id, labels)
        try:
            url = agent_url(env, self.version["agent_service"], int(self.version["agent_port"]))
            inner = InnerEnv(url)
        except BaseException:
            self._api.delete_env(env["id"])
            raise
        log.info("env %s from %s ready in %.2fs", env["id"], version_id, time.monotonic() - began)
        return env["id"], inner

    def _replace(self) -> InnerEnv:
        """A new env from the version becomes current; the previous one is deleted."""
        with self._lock:
            env_id, inner = self._start()
            old_id, old_inner = self._env_id, self._inner
            self._env_id, self._inner = env_id, inner
        if old_inner is not None:
            old_inner.close()
        if old_id is not None:
            self._api.delete_env(old_id)
        return inner

    def current(self) -> InnerEnv:
        """The current env, started on first use when no reset came first."""
        with self._lock:
            if self._inner is not None:
                return self._inner
            return self._replace()

    def _ids(self) -> dict[str, Any]:
        return {"denv_env_id": self._env_id, "denv_version_id": self.version["version_id"]}

    # -- OpenEnv's Environment

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> Observation:
        inner = self._replace()
        self._rewards.write({"event": "reset", **self._ids()})
        if reset_mode(self.version) == "env":
            args = {k: v for k, v in (("seed", seed), ("episode_id", episode_id)) if v is not None}
            return self._observation(inner.reset(**args, **kwargs))
        return DenvObservation(done=False, reward=None, metadata=self._ids(), state=inner.state())

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        payload = action.model_dump(exclude_unset=True)
        refused = self.mcp_client.refuse_step(payload)
        if refused is not None:
            return DenvObservation(done=False, reward=None, metadata={"error": refused})
        observation = self._observation(self.current().step(payload))
        self._rewards.write(
            {"event": "step", "reward": observation.reward, "done": observation.done}
        )
        return observation

    @property
    def state(self) -> State:
        with self._lock:
            inner = self._inner
        if inner is None:
            return DenvState(episode_id=None, step_count=0, **self._ids())
        return DenvState.model_validate(inner.state())

    def close(self) -> None:
        with self._lock:
            env_id, inner = self._env_id, self._inner
            self._env_id, self._inner = None, None
        if inner is not None:
            inner.close()
        if env_id is not None:
            try:
                self._api.delete_env(env_id)
            except Exception as exc:  # the env's TTL deletes it later
                log.warning("could not delete env %s: %s", env_id, exc)

    def _observation(self, payload: dict[str, Any]) -> DenvObservation:
        fields = dict(payload.get("observation") or {})
        metadata = {**(fields.pop("metadata", None) or {}), **self._ids()}
        fields.pop("done", None)
        fields.pop("reward", None)
        return DenvObservation(
            done=bool(payload.get("done", False)),
            reward=payload.get("reward"),
            metadata=metadata,
            **fields,
        )


class _RewardLog:
    """Appends resets and step rewards to DENV_EXPORT_REWARD_LOG (JSON lines), when set.

    A Harbor export's verifier scores the episode from it.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path

    @classmethod
    def from_environ(cls) -> _RewardLog:
        value = os.environ.get("DENV_EXPORT_REWARD_LOG")
        return cls(Path(value) if value else None)

    def write(self, record: dict[str, Any]) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
