"""DenvProvider against the real local server, replayed from cassettes (no Docker needed).

The cassettes (tests/cassettes/provider_*.yaml) were recorded from a real `denv serve` by
scripts/record_provider_cassettes.py, never written by hand. Each test runs the scenario the
recorder ran (tests/unit/provider_scenarios.py) and checks what the provider made of the
server's answers. A replay fails on any request the recording does not hold, body, query and
API key included (tests/unit/cassette_match.py); the assertions read the requests the provider
sent during the replay, not the recorded ones.

Seam: vcrpy records HTTP only, so the WebSocket half of readiness (`DenvProvider.ws_probe`)
cannot be replayed. The recorder ran the real probe against the real env; here a stand-in
answers "ready" and notes each URL, so the tests check that every ready env was probed.
"""

from __future__ import annotations

import json
from typing import Any

from cassette_match import Replayed
from cassette_match import replay as replaying
from denv.openenv import EnvReadyTimeout, EnvStartError
from provider_scenarios import (
    BAD_KEY,
    CASSETTE_KEY,
    CASSETTE_SERVER,
    MISSING_IMAGE,
    SCENARIOS,
)
from vcr.request import Request

from denv import InvalidRequest, Unauthorized

INGRESS = CASSETTE_SERVER + "/ingress/"


def replay(name: str) -> tuple[Any, Replayed, list[str]]:
    """Run scenario `name` on its cassette: its result, what was sent, the URLs probed."""
    probed: list[str] = []

    def ws_probe(base_url: str, timeout_s: float) -> str | None:
        probed.append(base_url)
        return None

    with replaying(f"provider_{name}.yaml") as wire:
        result = SCENARIOS[name](CASSETTE_SERVER, CASSETTE_KEY, ws_probe)
    return result, wire, probed


def calls(wire: Replayed) -> list[str]:
    """'METHOD /path' of each request sent, in order, the ingress token kept."""
    return [f"{r.method} {r.uri.removeprefix(CASSETTE_SERVER)}" for r in wire.sent]


def body(request: Request) -> Any:
    return json.loads(request.body)


def test_start_returns_the_ingress_url_and_does_not_wait() -> None:
    result, wire, probed = replay("start")
    assert result["base_url"].startswith(INGRESS) and not result["base_url"].endswith("/")
    assert result["env_id"].startswith("env_")
    assert [c.split()[0] for c in calls(wire)] == ["POST", "DELETE"]
    create = body(wire.sent[0])
    assert create["wait"] == "running" and create["env"] == {"GREETING": "hi"}
    assert create["ports"] == [8000] and create["egress"] == "deny"
    assert probed == []


def test_ready_long_polls_then_probes_health_and_websocket() -> None:
    result, wire, probed = replay("ready")
    env = result["env_id"]
    assert calls(wire)[1:] == [
        f"POST /v1/envs/{env}/wait",
        result["base_url"].removeprefix(CASSETTE_SERVER).join(["GET ", "/health"]),
        f"DELETE /v1/envs/{env}",
    ]
    assert probed == [result["base_url"]]


def test_fork_binds_a_ready_child() -> None:
    result, wire, probed = replay("fork")
    assert result["child"] != result["parent"] and result["url"].startswith(INGRESS)
    assert result["same_config"]
    sent = calls(wire)
    assert f"POST /v1/envs/{result['parent']}/fork" in sent
    assert body(next(r for r in wire.sent if r.uri.endswith("/fork")))["wait"] == "healthy"
    assert f"POST /v1/envs/{result['child']}/wait" not in sent  # healthy in the fork's answer
    # The default forks live: the server's answer is the proof the child serves (it is a copy
    # of a server that answered), so the client probes only the root it started.
    assert result["start"] == "live" and result["url"] not in probed
    child, parent = result["child"], result["parent"]
    assert sent[-2:] == [f"DELETE /v1/envs/{child}", f"DELETE /v1/envs/{parent}"]


def test_fork_n_is_one_request_and_every_child_is_ready() -> None:
    result, wire, probed = replay("fork_n")
    sent = calls(wire)
    assert sent.count(f"POST /v1/envs/{result['parent']}/fork") == 1
    assert body(next(r for r in wire.sent if r.uri.endswith("/fork")))["count"] == 3
    assert len(set(result["children"])) == 3
    assert result["starts"] == ["live"] * 3  # the default: live children, not probed
    for child, url in zip(result["children"], result["urls"], strict=True):
        assert f"GET {url.removeprefix(CASSETTE_SERVER)}/health" not in sent
        assert f"DELETE /v1/envs/{child}" in sent
    assert not set(probed) & set(result["urls"])


def test_stop_deletes_the_env() -> None:
    result, wire, _ = replay("stop")
    assert result["after"] is None
    assert calls(wire)[-1] == f"DELETE /v1/envs/{result['env_id']}"


def test_double_stop_sends_one_delete_and_tolerates_a_deleted_env() -> None:
    result, wire, _ = replay("double_stop")
    sent = calls(wire)
    assert [c.split()[0] for c in sent] == ["POST", "DELETE", "POST", "DELETE", "DELETE"]
    assert sent[3] == sent[4]  # deleted behind its back, then stopped: still fine
    assert result["after"] is None


def test_unknown_image() -> None:
    error, _, _ = replay("unknown_image")
    assert isinstance(error, InvalidRequest) and error.code == "image_not_found"
    assert MISSING_IMAGE in str(error) and "docker images" in str(error)


def test_refused_key_fails_at_once() -> None:
    error, wire, _ = replay("refused_key")
    assert isinstance(error, Unauthorized)
    assert len(wire.sent) == 1  # no retry, nothing created
    assert BAD_KEY not in str(error) and BAD_KEY not in repr(error)


def test_crash_during_start_carries_log_lines_and_deletes_the_env() -> None:
    error, wire, probed = replay("crash_during_start")
    assert isinstance(error, EnvStartError) and isinstance(error, RuntimeError)
    assert error.log_tail[-1] == "boom: lost the database"
    assert "boom: lost the database" in str(error) and "exited" in str(error)
    assert calls(wire)[-1] == f"DELETE /v1/envs/{error.env_id}"
    assert probed == []


def test_readiness_timeout_carries_log_lines_and_deletes_the_env() -> None:
    error, wire, probed = replay("readiness_timeout")
    assert isinstance(error, EnvReadyTimeout) and isinstance(error, TimeoutError)
    assert "booting" in error.log_tail
    assert "timeout_s" in str(error)
    assert calls(wire)[-1] == f"DELETE /v1/envs/{error.env_id}"
    assert probed == []
