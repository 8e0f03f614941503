"""DenvProvider against the real local server, replayed from cassettes (no Docker needed).

The cassettes (tests/cassettes/provider_*.yaml) were recorded from a real `denv serve` by
scripts/record_provider_cassettes.py, never written by hand. Each test runs the scenario the
recorder ran (tests/unit/provider_scenarios.py) and checks what the provider made of the
server's answers. A replay fails on any request the recording does not hold.

Seam: vcrpy records HTTP only, so the WebSocket half of readiness (`DenvProvider.ws_probe`)
cannot be replayed. The recorder ran the real probe against the real env; here a stand-in
answers "ready" and notes each URL, so the tests check that every ready env was probed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import vcr
from denv.openenv import EnvReadyTimeout, EnvStartError
from provider_scenarios import (
    BAD_KEY,
    CASSETTE_KEY,
    CASSETTE_SERVER,
    MISSING_IMAGE,
    SCENARIOS,
)
from vcr.cassette import Cassette

from denv import InvalidRequest, Unauthorized

CASSETTES = Path(__file__).resolve().parents[1] / "cassettes"
REPLAY = vcr.VCR(
    cassette_library_dir=str(CASSETTES),
    record_mode="none",
    match_on=["method", "path"],  # each recorded answer plays once
)
INGRESS = CASSETTE_SERVER + "/ingress/"


def replay(name: str) -> tuple[Any, Cassette, list[str]]:
    path = CASSETTES / f"provider_{name}.yaml"
    if not path.exists():
        pytest.skip(f"{path.name} is missing: record it (scripts/record_provider_cassettes.py)")
    probed: list[str] = []

    def ws_probe(base_url: str, timeout_s: float) -> str | None:
        probed.append(base_url)
        return None

    with REPLAY.use_cassette(path.name) as cassette:
        result = SCENARIOS[name](CASSETTE_SERVER, CASSETTE_KEY, ws_probe)
    assert cassette.all_played, f"{name}: the provider skipped requests the recording holds"
    return result, cassette, probed


def calls(cassette: Cassette) -> list[str]:
    """'METHOD /path' of each request, in order, the ingress token kept."""
    return [f"{r.method} {r.uri.removeprefix(CASSETTE_SERVER)}" for r in cassette.requests]


def test_start_returns_the_ingress_url_and_does_not_wait() -> None:
    result, cassette, probed = replay("start")
    assert result["base_url"].startswith(INGRESS) and not result["base_url"].endswith("/")
    assert result["env_id"].startswith("env_")
    assert [c.split()[0] for c in calls(cassette)] == ["POST", "DELETE"]
    body = cassette.requests[0].body
    assert b'"wait":"running"' in body and b'"GREETING":"hi"' in body
    assert b'"ports":[8000]' in body and b'"egress":"deny"' in body
    assert probed == []


def test_ready_long_polls_then_probes_health_and_websocket() -> None:
    result, cassette, probed = replay("ready")
    env = result["env_id"]
    assert calls(cassette)[1:] == [
        f"POST /v1/envs/{env}/wait",
        result["base_url"].removeprefix(CASSETTE_SERVER).join(["GET ", "/health"]),
        f"DELETE /v1/envs/{env}",
    ]
    assert probed == [result["base_url"]]


def test_fork_binds_a_ready_child() -> None:
    result, cassette, probed = replay("fork")
    assert result["child"] != result["parent"] and result["url"].startswith(INGRESS)
    sent = calls(cassette)
    assert f"POST /v1/envs/{result['parent']}/fork" in sent
    assert b'"wait":"healthy"' in next(r.body for r in cassette.requests if r.uri.endswith("/fork"))
    assert f"POST /v1/envs/{result['child']}/wait" not in sent  # healthy in the fork's answer
    assert probed[-1] == result["url"]
    child, parent = result["child"], result["parent"]
    assert sent[-2:] == [f"DELETE /v1/envs/{child}", f"DELETE /v1/envs/{parent}"]


def test_fork_n_is_one_request_and_every_child_is_ready() -> None:
    result, cassette, probed = replay("fork_n")
    sent = calls(cassette)
    assert sent.count(f"POST /v1/envs/{result['parent']}/fork") == 1
    fork_body = next(r.body for r in cassette.requests if r.uri.endswith("/fork"))
    assert b'"count":3' in fork_body
    assert len(set(result["children"])) == 3
    for child, url in zip(result["children"], result["urls"], strict=True):
        assert f"GET {url.removeprefix(CASSETTE_SERVER)}/health" in sent
        assert f"DELETE /v1/envs/{child}" in sent
    assert sorted(probed[1:]) == sorted(result["urls"])


def test_stop_deletes_the_env() -> None:
    result, cassette, _ = replay("stop")
    assert result["after"] is None
    assert calls(cassette)[-1] == f"DELETE /v1/envs/{result['env_id']}"


def test_double_stop_sends_one_delete_and_tolerates_a_deleted_env() -> None:
    result, cassette, _ = replay("double_stop")
    sent = calls(cassette)
    assert [c.split()[0] for c in sent] == ["POST", "DELETE", "POST", "DELETE", "DELETE"]
    assert sent[3] == sent[4]  # deleted behind its back, then stopped: still fine
    assert result["after"] is None


def test_unknown_image() -> None:
    error, _, _ = replay("unknown_image")
    assert isinstance(error, InvalidRequest) and error.code == "image_not_found"
    assert MISSING_IMAGE in str(error) and "docker images" in str(error)


def test_refused_key_fails_at_once() -> None:
    error, cassette, _ = replay("refused_key")
    assert isinstance(error, Unauthorized)
    assert len(cassette.requests) == 1  # no retry, nothing created
    assert BAD_KEY not in str(error) and BAD_KEY not in repr(error)


def test_crash_during_start_carries_log_lines_and_deletes_the_env() -> None:
    error, cassette, probed = replay("crash_during_start")
    assert isinstance(error, EnvStartError) and isinstance(error, RuntimeError)
    assert error.log_tail[-1] == "boom: lost the database"
    assert "boom: lost the database" in str(error) and "exited" in str(error)
    assert calls(cassette)[-1] == f"DELETE /v1/envs/{error.env_id}"
    assert probed == []


def test_readiness_timeout_carries_log_lines_and_deletes_the_env() -> None:
    error, cassette, probed = replay("readiness_timeout")
    assert isinstance(error, EnvReadyTimeout) and isinstance(error, TimeoutError)
    assert "booting" in error.log_tail
    assert "timeout_s" in str(error)
    assert calls(cassette)[-1] == f"DELETE /v1/envs/{error.env_id}"
    assert probed == []
