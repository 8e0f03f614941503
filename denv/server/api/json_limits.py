"""Bounds on every JSON body of the API, checked before the body is parsed.

A 1 MiB body (the cap of ``app.RequestContext``) can still cost far more than 1 MiB once
parsed: ``[[],[],...]`` is some 350,000 lists, a number of a million digits is quadratic to
convert, and pydantic copies what json built. ``check_json`` walks the raw bytes with one
regular expression, token by token, and stops at the first bound passed, so a bomb costs
a few thousand regex steps and no allocation; only a body within every bound is parsed.

    problem = check_json(b'[' * 100)   # "JSON nested deeper than 32 levels ..."

``BoundedJson`` is the ASGI middleware that applies it to each ``/v1/`` request: the body is
read whole (it is at most 1 MiB), checked, and handed on unchanged; a body past a bound is
refused with 422 ``invalid_request`` naming the bound and the fix.
"""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.exceptions import HTTPException

from denv.server.config import (
    MAX_JSON_DEPTH,
    MAX_JSON_NUMBER_CHARS,
    MAX_JSON_STRING_CHARS,
    MAX_JSON_VALUES,
)

Scope = dict[str, Any]

# A string (escapes included), a bracket, or a bare scalar (number, true, false, null).
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]|[^\s\[\]{},:"]+|"')


def check_json(body: bytes) -> str | None:
    """What bound ``body`` passes, as the message of a 422; None when it is within all."""
    depth = values = 0
    for match in _TOKEN.finditer(body):
        token = match.group()
        first = token[:1]
        if first in (b"[", b"{"):
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return (
                    f"body: JSON nested deeper than {MAX_JSON_DEPTH} levels: the API's "
                    "bodies are a few levels deep; send a flatter body"
                )
        elif first in (b"]", b"}"):
            depth -= 1
            continue
        elif first == b'"':
            if len(token) == 1:
                return "body: a JSON string is not terminated: send valid JSON"
            if len(token) - 2 > MAX_JSON_STRING_CHARS and _chars(token) > MAX_JSON_STRING_CHARS:
                return (
                    f"body: a JSON string longer than {MAX_JSON_STRING_CHARS} characters "
                    "(the longest field, a compose file, may have that many): send less"
                )
        elif len(token) > MAX_JSON_NUMBER_CHARS:
            return (
                f"body: a JSON number or literal longer than {MAX_JSON_NUMBER_CHARS} "
                f"characters ({token[:16].decode('latin-1')}...): send a plain number"
            )
        values += 1
        if values > MAX_JSON_VALUES:
            return (
                f"body: more than {MAX_JSON_VALUES} JSON values (keys, strings, numbers, "
                "arrays and objects together): the API's bodies hold a few hundred; send less"
            )
    return None


def _chars(token: bytes) -> int:
    """The decoded length of a JSON string token (escapes make it shorter than its bytes)."""
    try:
        return len(json.loads(token))
    except ValueError:
        return len(token)


class BoundedJson:
    """ASGI middleware: refuse (422) an API body that passes a bound of ``check_json``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        messages: list[Any] = []
        chunks: list[bytes] = []
        while True:
            try:
                message = await receive()
            except HTTPException as exc:  # RequestContext's cap: past 1 MiB as it arrives
                await _refuse(scope, send, str(exc.detail))
                return
            messages.append(message)
            if message.get("type") != "http.request":
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        problem = check_json(b"".join(chunks)) if chunks else None
        if problem is not None:
            await _refuse(scope, send, problem)
            return
        replay = iter(messages)

        async def replayed() -> Any:
            return next(replay, None) or await receive()

        await self.app(scope, replayed, send)


async def _refuse(scope: Scope, send: Any, message: str) -> None:
    state = scope.get("state")
    rid = state.get("request_id") if isinstance(state, dict) else None
    body = json.dumps(
        {
            "code": "invalid_request",
            "message": message,
            "request_id": rid,
            "details": {"path": "body"},
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 422,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})
