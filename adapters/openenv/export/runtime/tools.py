"""MCP tools: the ones the version declares, served by the session's current env.

OpenEnv's server answers `/mcp` (and `mcp` WebSocket messages) through an environment's
`mcp_client`; this bridge is that client. It forwards `tools/list` and `tools/call` to the
current env and keeps to the declared tools (all the env offers when none are declared).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from .inner import InnerEnv


class ToolError(RuntimeError):
    """An MCP request the env (or the declaration) refused; OpenEnv answers it as an error."""


class ToolBridge:
    """The `mcp_client` OpenEnv's server calls for the environment it belongs to."""

    def __init__(self, declared: list[str] | None, current: Callable[[], InnerEnv]) -> None:
        """`declared`: the tools to keep to (None: all the env offers); `current`: the
        session's current env, started on first use (a blocking call)."""
        self.declared = declared
        self._current = current

    def is_connected(self) -> bool:
        return True  # each request goes over the env's open session

    async def __aenter__(self) -> ToolBridge:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def _refusal(self, name: str) -> str | None:
        if self.declared is None or name in self.declared:
            return None
        return (
            f"tool {name!r} is not one of the tools this version declares "
            f"({', '.join(self.declared) or 'none'})"
        )

    def refuse_step(self, action: dict[str, Any]) -> str | None:
        """Why a `call_tool` step is refused, or None."""
        if action.get("type") == "call_tool":
            return self._refusal(str(action.get("tool_name")))
        return None

    async def list_tools(self) -> list[dict[str, Any]]:
        result = await self._request("tools/list", {})
        tools = [t for t in result.get("tools", []) if isinstance(t, dict)]
        return [t for t in tools if self._refusal(str(t.get("name"))) is None]

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> Any:
        refused = self._refusal(name)
        if refused is not None:
            raise ToolError(refused)
        return await self._request("tools/call", {"name": name, "arguments": arguments or {}})

    async def _request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        inner = await asyncio.to_thread(self._current)
        response = await inner.mcp(method, params)
        error = response.get("error")
        if error:
            message = error.get("message") if isinstance(error, dict) else str(error)
            raise ToolError(f"{method} failed in the env: {message}")
        result = response.get("result")
        return result if isinstance(result, dict) else {"value": result}
