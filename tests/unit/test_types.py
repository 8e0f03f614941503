"""The records `denv` returns are its own (denv.types), not the generated models: converted
field for field, with str-enums that compare equal to their wire values."""

from __future__ import annotations

import dataclasses
import datetime

import pytest
from denv_api_client import models as api
from facade_fakes import ENV_ID, env_json

import denv
from denv import Endpoint, Env, EnvStatus, StartMode, WarmPool, WarmPoolState


def _env() -> Env:
    raw = env_json()
    raw["labels"] = {"team": "rl"}
    raw["endpoints"] = [
        {"service": "agent", "port": 8000, "url": "http://x/e/tok", "via": "ingress"}
    ]
    raw["error"] = {"code": "exited", "message": "boom", "log_tail": ["a", "b"]}
    return Env.from_api(api.Env.from_dict(raw))


def test_env_from_api_keeps_every_field() -> None:
    env = _env()
    assert env.id == ENV_ID and env.status is EnvStatus.HEALTHY and env.status == "healthy"
    assert str(env.status) == "healthy" and f"{env.start}" == "cold"
    assert env.start is StartMode.COLD
    assert env.labels == {"team": "rl"} and isinstance(env.labels, dict)
    assert env.endpoints == [Endpoint("agent", 8000, "http://x/e/tok", denv.EndpointVia.INGRESS)]
    assert env.endpoints[0].url == "http://x/e/tok"
    assert env.error is not None and env.error.log_tail == ["a", "b"] and env.error.service is None
    assert env.created_at == datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)


def test_records_are_frozen_and_plain() -> None:
    env = _env()
    with pytest.raises(dataclasses.FrozenInstanceError):
        env.status = EnvStatus.DELETED  # type: ignore[misc]
    data = env.to_dict()
    assert data["status"] == "healthy" and data["labels"] == {"team": "rl"}
    assert data["created_at"].startswith("2025-01-01T00:00:00")
    assert data["error"]["code"] == "exited"


def test_an_absent_optional_field_is_none() -> None:
    pool = WarmPool.from_api(
        api.WarmPool.from_dict(
            {
                "env_id": ENV_ID,
                "state": "none",
                "target": 0,
                "ready": 0,
                "booting": 0,
                "failures": 0,
            }
        )
    )
    assert pool.state is WarmPoolState.NONE and pool.error is None


def test_denv_exports_no_generated_model() -> None:
    for name in denv.__all__:
        module = getattr(getattr(denv, name), "__module__", "")
        assert not module.startswith("denv_api_client"), name
