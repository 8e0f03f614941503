"""429s of the fairness caps (issue 17): what the facade retries after Retry-After, and not.

A busy key's 429 `rate_limited` (too many requests, starts, waits or ingress connections at
once) frees on its own: an idempotent call waits Retry-After and goes again. A 429
`quota_exceeded` (envs not deleted, versions, warm spares) frees only when the caller deletes
something, so it is raised at once whatever its Retry-After (the server sends 30 s).

httpx.MockTransport stands in for the server (facade_fakes), as in test_facade_retries.py:
the real server's caps are exercised in tests/reliability/test_fairness.py.
"""

from __future__ import annotations

import httpx
import pytest
from facade_fakes import ENV_ID, Script, env_json, error_response, mock_denv, sleeps_of

from denv import RateLimited

ENV_OK = httpx.Response(200, json=env_json())


def test_rate_limited_is_retried_after_retry_after(kind: str) -> None:
    busy = error_response(429, "rate_limited", "--max-waits-per-key", **{"retry-after": "1"})
    script = Script(busy, busy, ENV_OK)
    with mock_denv(script, kind=kind) as denv:
        denv.get_env(ENV_ID)
    assert script.calls == 3
    assert sleeps_of(denv) == [1.0, 1.0]


def test_quota_exceeded_is_raised_at_once(kind: str) -> None:
    quota = error_response(429, "quota_exceeded", "--max-versions-per-key", **{"retry-after": "30"})
    script = Script(quota, ENV_OK)
    with mock_denv(script, kind=kind) as denv, pytest.raises(RateLimited) as info:
        denv.get_env(ENV_ID)
    assert script.calls == 1
    assert sleeps_of(denv) == []
    assert info.value.code == "quota_exceeded" and info.value.retry_after_s == 30.0


def test_rate_limited_is_waited_out_past_the_usual_retries(kind: str) -> None:
    """A burst of creates (a trainer's 64 starts at once) queues behind the per-key caps:
    a `rate_limited` 429 is retried well past the two retries other errors get."""
    busy = error_response(429, "rate_limited", "--max-creates-per-key", **{"retry-after": "1"})
    script = Script(*([busy] * 10), ENV_OK)
    with mock_denv(script, kind=kind) as denv:
        denv.get_env(ENV_ID)
    assert script.calls == 11
    assert sleeps_of(denv) == [1.0] * 10


def test_an_other_429_still_stops_after_the_usual_retries(kind: str) -> None:
    other = error_response(429, "limit_exceeded", "--something", **{"retry-after": "1"})
    script = Script(*([other] * 10), ENV_OK)
    with mock_denv(script, kind=kind) as denv, pytest.raises(RateLimited):
        denv.get_env(ENV_ID)
    assert script.calls == 3
