"""What the facade retries, and what it never retries.

Rules (denv/client/_http.py): a connection that was never made is retried for every call;
429/5xx and a connection that broke mid-call only for idempotent calls (GET, DELETE, wait, and
creates, which always carry an Idempotency-Key). 4xx answers are never retried.

httpx.MockTransport stands in for the server here because the real local server cannot be made
to answer 503/429 or to drop a connection on demand; the connection-refused test uses a real
closed port. That 404/409/422 from the real server are not retried is checked on cassettes
(test_facade_cassettes.py); here a fake checks the same for 400/401.

Every case runs twice (the `kind` fixture): on `Denv`, and on `AsyncDenv` through its own
async transport, called the same way (tests/unit/async_driver.py).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from async_driver import Blocking
from denv_api_client.api.sandboxes import create_sandbox
from denv_api_client.models import SandboxCreate
from facade_fakes import (
    ENV_ID,
    KEY,
    VERSION_ID,
    Script,
    env_json,
    error_response,
    make_denv,
    mock_denv,
    sleeps_of,
)

from denv import (
    ConnectionFailed,
    InvalidRequest,
    RateLimited,
    ServerError,
    Unauthorized,
)
from denv.client._retry import backoff_s

UNAVAILABLE = error_response(503, "engine_unavailable", "start dockerd, then retry")
ENV_OK = httpx.Response(200, json=env_json())
ENV_CREATED = httpx.Response(201, json=env_json())
EMPTY = httpx.Response(204)
FORK_OK = httpx.Response(
    201,
    json={
        "version": {
            "id": VERSION_ID,
            "project": None,
            "parent_env_id": ENV_ID,
            "parent_version_id": None,
            "agent_service": "agent",
            "services": [],
            "layer_depth": 1,
            "warm_fork": False,
            "labels": {},
            "created_at": "2025-01-01T00:00:00Z",
        },
        "envs": [env_json()],
    },
)

# Every public call: (name, how to call it, what the fake answers when it works).
CALLS = [
    ("get_env", lambda d: d.get_env(ENV_ID), ENV_OK),
    ("delete_env", lambda d: d.delete_env(ENV_ID), EMPTY),
    ("wait_env", lambda d: d.wait_env(ENV_ID, timeout_s=1), ENV_OK),
    (
        "list_envs",
        lambda d: list(d.list_envs()),
        httpx.Response(200, json={"items": [env_json()], "next_cursor": None}),
    ),
    ("create_sandbox", lambda d: d.create_sandbox("img:latest"), ENV_CREATED),
    ("fork", lambda d: d.fork(ENV_ID, count=2), FORK_OK),
    (
        "envs_from_version",
        lambda d: d.envs_from_version(VERSION_ID),
        httpx.Response(201, json={"envs": [env_json()]}),
    ),
    ("snapshot", lambda d: d.snapshot(ENV_ID), httpx.Response(201, json=FORK_OK.json()["version"])),
    ("delete_version", lambda d: d.delete_version(VERSION_ID), EMPTY),
]
IDS = [name for name, _, _ in CALLS]


def create_without_a_key(denv: Any) -> None:
    """A create with no Idempotency-Key, sent through the facade's own HTTP client."""
    body = SandboxCreate(image="img:latest")
    if isinstance(denv, Blocking):

        async def send() -> None:
            await create_sandbox.asyncio_detailed(client=await denv.client._api(), body=body)

        denv.run(send())
    else:
        create_sandbox.sync_detailed(client=denv._api, body=body)


@pytest.mark.parametrize(("name", "call", "ok"), CALLS, ids=IDS)
def test_connect_errors_are_retried_for_every_call(name: str, call, ok, kind: str) -> None:  # type: ignore[no-untyped-def]
    script = Script(httpx.ConnectError("refused"), httpx.ConnectError("refused"), ok)
    with mock_denv(script, max_retries=2, kind=kind) as denv:
        call(denv)
    assert script.calls == 3
    assert len(sleeps_of(denv)) == 2


@pytest.mark.parametrize(("name", "call", "ok"), CALLS, ids=IDS)
def test_503_is_retried_for_idempotent_calls(name: str, call, ok, kind: str) -> None:  # type: ignore[no-untyped-def]
    script = Script(UNAVAILABLE, ok)
    with mock_denv(script, kind=kind) as denv:
        call(denv)
    assert script.calls == 2


@pytest.mark.parametrize("name", ["create_sandbox", "fork", "envs_from_version", "snapshot"])
def test_creates_send_one_idempotency_key_on_every_attempt(name: str, kind: str) -> None:
    _, call, ok = CALLS[IDS.index(name)]
    script = Script(UNAVAILABLE, UNAVAILABLE, ok)
    with mock_denv(script, kind=kind) as denv:
        call(denv)
    keys = {r.headers.get("idempotency-key") for r in script.requests}
    assert len(keys) == 1 and None not in keys


def test_each_create_gets_its_own_idempotency_key(kind: str) -> None:
    script = Script(ENV_CREATED)
    with mock_denv(script, kind=kind) as denv:
        denv.create_sandbox("img:latest")
        denv.create_sandbox("img:latest")
        denv.create_sandbox("img:latest", idempotency_key="mine-1")
    keys = [r.headers["idempotency-key"] for r in script.requests]
    assert keys[0] != keys[1] and keys[2] == "mine-1"


def test_503_is_not_retried_for_a_non_idempotent_call(kind: str) -> None:
    # No facade call is non-idempotent (creates always carry a key), so this sends a create
    # without one through the facade's own HTTP client: the rule must hold there too.
    script = Script(UNAVAILABLE, ENV_CREATED)
    with mock_denv(script, kind=kind) as denv, pytest.raises(ServerError):
        create_without_a_key(denv)
    assert script.calls == 1


def test_broken_connection_is_retried_only_when_idempotent(kind: str) -> None:
    broken = httpx.RemoteProtocolError("Server disconnected without sending a response.")
    script = Script(broken, ENV_OK)
    with mock_denv(script, kind=kind) as denv:
        denv.get_env(ENV_ID)
    assert script.calls == 2

    script = Script(broken, ENV_CREATED)
    with mock_denv(script, kind=kind) as denv, pytest.raises(ConnectionFailed):
        create_without_a_key(denv)
    assert script.calls == 1


@pytest.mark.parametrize(
    ("response", "error"),
    [
        (error_response(400, "invalid_request", "bad"), InvalidRequest),
        (error_response(401, "unauthorized", "unknown key"), Unauthorized),
        (error_response(422, "invalid_request", "bad"), InvalidRequest),
    ],
)
def test_client_errors_are_never_retried(response: httpx.Response, error: type, kind: str) -> None:
    script = Script(response, ENV_OK)
    with mock_denv(script, kind=kind) as denv, pytest.raises(error):
        denv.get_env(ENV_ID)
    assert script.calls == 1


def test_retries_are_bounded_by_max_retries(kind: str) -> None:
    script = Script(UNAVAILABLE)
    with mock_denv(script, max_retries=3, kind=kind) as denv, pytest.raises(ServerError):
        denv.get_env(ENV_ID)
    assert script.calls == 4
    with (
        mock_denv(script := Script(UNAVAILABLE), max_retries=0, kind=kind) as denv,
        pytest.raises(ServerError),
    ):
        denv.get_env(ENV_ID)
    assert script.calls == 1


def test_retry_after_is_honored(kind: str) -> None:
    limited = error_response(429, "rate_limited", "slow down", **{"retry-after": "3"})
    script = Script(limited, ENV_OK)
    with mock_denv(script, kind=kind) as denv:
        denv.get_env(ENV_ID)
    assert sleeps_of(denv) == [3.0]


def test_retry_after_is_capped(kind: str) -> None:
    limited = error_response(429, "rate_limited", "slow down", **{"retry-after": "86400"})
    with mock_denv(Script(limited, ENV_OK), kind=kind) as denv:
        denv.get_env(ENV_ID)
    assert sleeps_of(denv) == [60.0]


def test_rate_limited_after_the_last_retry_carries_retry_after(kind: str) -> None:
    limited = error_response(429, "quota_exceeded", "64 live envs", **{"retry-after": "5"})
    with (
        mock_denv(Script(limited), max_retries=1, kind=kind) as denv,
        pytest.raises(RateLimited) as info,
    ):
        denv.get_env(ENV_ID)
    assert info.value.retry_after_s == 5.0


def test_backoff_grows_exponentially_with_bounded_jitter() -> None:
    assert [backoff_s(n, rand=lambda: 0.0) for n in range(6)] == [0.25, 0.5, 1.0, 2.0, 4.0, 4.0]
    assert [backoff_s(n, rand=lambda: 1.0) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]


def test_connection_refused_on_a_real_port_is_retried_then_raised(
    closed_port_url: str, kind: str
) -> None:
    denv = make_denv(kind, closed_port_url, KEY, max_retries=2)
    with denv, pytest.raises(ConnectionFailed) as info:
        denv.get_env(ENV_ID)
    assert len(sleeps_of(denv)) == 2
    assert closed_port_url in str(info.value) and "denv serve" in str(info.value)
