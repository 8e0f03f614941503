"""The echo environment: OpenEnv's reference echo env, with an episode that survives a fork.

Like OpenEnv's ``envs/echo_env``, it is an ``MCPEnvironment`` with two MCP tools,
``echo_message(message) -> message`` and ``echo_with_length(message) -> {message, length}``;
every step counts, tool calls earn no reward, and ``reset`` answers
``{"status": "ready", "message": "Echo environment ready!"}``. A step may also be a plain
message, ``{"message": "hi"}``, answered as the classic echo env did (the message, its
length, and reward ``0.1 * length``).

What denv adds is one line: the ``ForkableState`` base. The episode id, the step count and
the last message sent live in ``EchoState`` and are saved under ``/work`` after each reset
and step, so a forked child (cold or warm) continues the parent's episode.
"""

from __future__ import annotations

from typing import Any, Literal, Self
from uuid import uuid4

from denv.openenv.state import ForkableState
from fastmcp import FastMCP
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, ListToolsAction
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field, model_validator


class EchoState(State):  # type: ignore[misc]
    """The echo env's episode: OpenEnv's ``State`` plus the last message sent."""

    last_message: str | None = Field(default=None, description="The last message stepped")


class EchoAction(Action):  # type: ignore[misc]
    """One step: an MCP tool call or tool listing (OpenEnv's echo env), or a plain message.

    ``{"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": "hi"}}``,
    ``{"type": "list_tools"}``, or ``{"message": "hi"}``.
    """

    type: Literal["message", "call_tool", "list_tools"] = "message"
    message: str | None = Field(default=None, description="The message to echo")
    tool_name: str | None = Field(default=None, description="The MCP tool to call")
    arguments: dict[str, Any] = Field(default_factory=dict, description="The tool's arguments")

    @model_validator(mode="after")
    def _complete(self) -> Self:
        if self.type == "message" and self.message is None:
            raise ValueError('a message step needs "message" (or "type": "call_tool")')
        if self.type == "call_tool" and not self.tool_name:
            raise ValueError('a call_tool step needs "tool_name"')
        return self

    def as_mcp(self) -> Action | None:
        """The MCP action this step stands for, or ``None`` for a plain message."""
        if self.type == "call_tool":
            return CallToolAction(
                tool_name=self.tool_name, arguments=self.arguments, metadata=self.metadata
            )
        if self.type == "list_tools":
            return ListToolsAction(metadata=self.metadata)
        return None


class EchoObservation(Observation):  # type: ignore[misc]
    """The answer to a plain message step."""

    echoed_message: str = Field(description="The message, echoed")
    message_length: int = Field(description="Its length in characters")


def _message_of(action: Any) -> str | None:
    if isinstance(action, EchoAction) and action.type == "message":
        return action.message
    arguments = getattr(action, "arguments", None)
    if isinstance(arguments, dict) and isinstance(arguments.get("message"), str):
        return str(arguments["message"])
    return None


class EchoEnvironment(ForkableState, MCPEnvironment):  # type: ignore[misc]
    """OpenEnv's echo environment, forkable."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("echo_env")

        @mcp.tool
        def echo_message(message: str) -> str:
            """Echo back the provided message.

            Args:
                message: The message to echo back
            """
            return message

        @mcp.tool
        def echo_with_length(message: str) -> dict[str, Any]:
            """Echo back the message with its length.

            Args:
                message: The message to echo back
            """
            return {"message": message, "length": len(message)}

        super().__init__(mcp)
        self._state = EchoState(episode_id=str(uuid4()))

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> Observation:
        self._state = EchoState(episode_id=episode_id or str(uuid4()))
        return Observation(
            done=False,
            reward=0.0,
            metadata={"status": "ready", "message": "Echo environment ready!"},
        )

    def _count(self, action: Any) -> Any:
        """Count the step, remember its message, and return what MCPEnvironment routes."""
        self._state.step_count += 1
        message = _message_of(action)
        if message is not None:
            self._state.last_message = message
        if isinstance(action, EchoAction):
            return action.as_mcp() or action
        return action

    def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return super().step(self._count(action), timeout_s=timeout_s, **kwargs)

    async def step_async(
        self, action: Any, timeout_s: float | None = None, **kwargs: Any
    ) -> Observation:
        # OpenEnv's WebSocket handler calls this one (MCPEnvironment overrides it).
        return await super().step_async(self._count(action), timeout_s=timeout_s, **kwargs)

    def _step_impl(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        if isinstance(action, EchoAction) and action.message is not None:
            length = len(action.message)
            return EchoObservation(
                echoed_message=action.message,
                message_length=length,
                reward=length * 0.1,
                metadata={"step": self._state.step_count},
            )
        return Observation(
            done=False,
            reward=0.0,
            metadata={
                "error": f"Unknown action type: {type(action).__name__}. "
                "Use a message, ListToolsAction or CallToolAction."
            },
        )

    @property
    def state(self) -> EchoState:
        return self._state
