"""Fakes and sample bodies for the facade's unit tests (each test says why it needs a fake)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
from async_driver import Blocking

from denv import AsyncDenv, Denv

# A well-formed key that tests look for in every message, repr and log line.
KEY = "dak_" + "SeCrEt0123456789" * 2 + "abcdefghijk"
SERVER = "http://denv.test"
ENV_ID = "env_01JDQ5C8M9W3X7Y2Z4A6B8C0D1"
VERSION_ID = "ver_01JDQ5C8M9W3X7Y2Z4A6B8C0D1"
REQUEST_ID = "req_01JDQ5C8M9W3X7Y2Z4A6B8C0D1"

Step = httpx.Response | Exception | Callable[[httpx.Request], httpx.Response]


def error_response(status: int, code: str, message: str, **headers: str) -> httpx.Response:
    body = {"code": code, "message": message, "request_id": REQUEST_ID, "details": None}
    return httpx.Response(status, json=body, headers=headers)


def env_json(env_id: str = ENV_ID, status: str = "healthy") -> dict[str, Any]:
    return {
        "id": env_id,
        "status": status,
        "version_id": VERSION_ID,
        "parent_id": None,
        "project": None,
        "agent_service": "agent",
        "egress": "deny",
        "labels": {},
        "services": [],
        "endpoints": [],
        "start": "cold",
        "created_at": "2025-01-01T00:00:00Z",
        "expires_at": "2025-01-01T01:00:00Z",
        "error": None,
    }


class Script:
    """A MockTransport handler: answers with `steps` in order (the last one repeats)."""

    def __init__(self, *steps: Step) -> None:
        self.steps = list(steps)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        step = self.steps[min(len(self.requests), len(self.steps)) - 1]
        if isinstance(step, Exception):
            raise step
        if isinstance(step, httpx.Response):
            # A fresh copy each time, so a repeated step can be read again.
            return httpx.Response(step.status_code, headers=step.headers, content=step.content)
        return step(request)

    @property
    def calls(self) -> int:
        return len(self.requests)


class Sleeps(list[float]):
    """Records the retry delays instead of sleeping them."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


class AsyncSleeps(Sleeps):
    """`Sleeps` for an `AsyncDenv` (its retry pause is awaited)."""

    async def __call__(self, seconds: float) -> None:  # type: ignore[override]
        self.append(seconds)


def make_denv(kind: str, server: str, key: str, **kw: Any) -> Denv | Blocking:
    """A `Denv` (kind "sync"), or an `AsyncDenv` called the same way (kind "async").

    Detached unless told otherwise: a lease would put its own calls (open, renewals on a
    timer, close) into every script; tests/unit/test_facade_lease.py covers those."""
    kw.setdefault("detach", True)
    if kind == "sync":
        return Denv(server, key, _sleep=Sleeps(), **kw)
    assert kind == "async", kind
    return Blocking(AsyncDenv(server, key, _sleep=AsyncSleeps(), **kw))


def mock_denv(
    script: Script, *, max_retries: int = 2, timeout_s: float = 5.0, kind: str = "sync"
) -> Any:
    """A Denv (or AsyncDenv) whose network is `script` (see each test for why a fake is needed)."""
    # httpx.MockTransport is both a sync and an async transport.
    transport = httpx.MockTransport(script)
    return make_denv(
        kind, SERVER, KEY, timeout_s=timeout_s, max_retries=max_retries, _transport=transport
    )


def sleeps_of(denv: Denv | Blocking) -> Sleeps:
    """The retry pauses the client took, as its retry transport was given them."""
    if isinstance(denv, Blocking):
        client = denv.client._client  # built by the calls made (and kept after close)
        assert client is not None
        transport: Any = client.get_async_httpx_client()._transport
    else:
        transport = denv._api.get_httpx_client()._transport
    sleep = transport._sleep
    assert isinstance(sleep, Sleeps)
    return sleep


def body_of(request: httpx.Request) -> Any:
    return json.loads(request.content) if request.content else None
