"""No call waits forever: a server that accepts and never answers gives `Timeout`.

The server here is a real TCP socket on loopback (fixture `silent_server`), not a mock. Tests
assert which bound the client applied (`Timeout.timeout_s`), never how long anything took;
pytest-timeout stops the run if a call were to hang.
"""

from __future__ import annotations

import httpx
import pytest
from facade_fakes import ENV_ID, KEY, VERSION_ID, Script, Sleeps, env_json, mock_denv

from denv import Denv, Timeout

pytestmark = pytest.mark.timeout(30)


def _denv(server: str, sleeps: Sleeps | None = None) -> Denv:
    # Detached: what is timed here is each call, not a lease's (test_facade_lease.py).
    return Denv(server, KEY, timeout_s=0.5, max_retries=2, _sleep=sleeps or Sleeps(), detach=True)


def test_a_server_that_never_answers_times_out_at_the_configured_bound(
    silent_server: str,
) -> None:
    sleeps = Sleeps()
    with _denv(silent_server, sleeps) as denv, pytest.raises(Timeout) as info:
        denv.get_env(ENV_ID)
    assert info.value.timeout_s == 0.5
    assert info.value.method == "GET" and info.value.url.endswith(f"/v1/envs/{ENV_ID}")
    assert "did not answer within 0.5s" in str(info.value)
    # A read timeout is not retried: the caller's bound is the bound.
    assert sleeps == []


def test_health_times_out_too(silent_server: str) -> None:
    with _denv(silent_server) as denv, pytest.raises(Timeout):
        denv.health()


def test_wait_env_gets_its_wait_plus_the_call_timeout(silent_server: str) -> None:
    with _denv(silent_server) as denv, pytest.raises(Timeout) as info:
        denv.wait_env(ENV_ID, timeout_s=1.0)
    assert info.value.timeout_s == 1.5


def test_create_with_wait_gets_its_wait_timeout_plus_the_call_timeout(
    silent_server: str,
) -> None:
    with _denv(silent_server) as denv, pytest.raises(Timeout) as info:
        denv.create_sandbox("img:latest", wait="healthy", wait_timeout_s=0.25)
    assert info.value.timeout_s == 0.75


def test_create_without_wait_gets_the_plain_call_timeout(silent_server: str) -> None:
    with _denv(silent_server) as denv, pytest.raises(Timeout) as info:
        denv.create_sandbox("img:latest", wait="none", wait_timeout_s=100)
    assert info.value.timeout_s == 0.5


def test_fork_and_envs_from_version_get_their_wait_timeout(silent_server: str) -> None:
    with _denv(silent_server) as denv:
        with pytest.raises(Timeout) as info:
            denv.fork(ENV_ID, count=2, wait_timeout_s=0.25)
        assert info.value.timeout_s == 0.75
        with pytest.raises(Timeout) as info:
            denv.envs_from_version(VERSION_ID, wait="running", wait_timeout_s=0.5)
        assert info.value.timeout_s == 1.0


def test_the_long_poll_timeout_does_not_leak_into_later_calls(silent_server: str) -> None:
    with _denv(silent_server) as denv:
        with pytest.raises(Timeout):
            denv.wait_env(ENV_ID, timeout_s=0.25)
        with pytest.raises(Timeout) as info:
            denv.get_env(ENV_ID)
    assert info.value.timeout_s == 0.5


def test_the_default_create_wait_is_sized_from_the_contract_default() -> None:
    # Without wait_timeout_s the server waits up to its default (120 s), so the client must
    # wait longer than that. A fake server records the read timeout it was sent with; the
    # silent socket cannot be used here without waiting two minutes.
    seen: list[float] = []

    def created(request: httpx.Request) -> httpx.Response:
        seen.append(request.extensions["timeout"]["read"])
        return httpx.Response(201 if request.url.path == "/v1/sandboxes" else 200, json=env_json())

    with mock_denv(Script(created), timeout_s=0.5) as denv:
        denv.create_sandbox("img:latest")
        denv.wait_env(ENV_ID)
    assert seen == [120.5, 60.5]


def test_invalid_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        Denv("http://127.0.0.1:1", KEY, timeout_s=0)
    with pytest.raises(ValueError, match="max_retries"):
        Denv("http://127.0.0.1:1", KEY, max_retries=-1)
