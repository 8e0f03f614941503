"""The facade against the real local server, replayed from cassettes (no Docker needed).

The cassettes under tests/cassettes/ were recorded from a real `denv serve` by
scripts/record_cassettes.py (`make cassettes`), never written by hand. Each test runs the
same scenario function the recorder ran (tests/unit/facade_scenarios.py) and checks what the
facade made of the server's answers. A replay fails on any request the recording does not
hold, body, query and API key included (tests/unit/cassette_match.py), and retry sleeps fail
the test, so these also show that 401/404/409/422 from the real server are never retried.
"""

from __future__ import annotations

import importlib.util
import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from cassette_match import (
    CASSETTES,
    RECORDED_AUTHORIZATION,
    RECORDED_IDEMPOTENCY_KEY,
    SENT_AUTHORIZATION,
    Replayed,
)
from cassette_match import replay as replaying
from facade_scenarios import (
    CASSETTE_KEY,
    CASSETTE_SERVER,
    IMAGE,
    PROJECT,
    SCENARIOS,
    UNKNOWN_ENV,
)

from denv import (
    Conflict,
    Denv,
    EndpointVia,
    EnvStatus,
    InvalidRequest,
    NotFound,
    Unauthorized,
)
from denv.server.auth import new_key

RECORDER = Path(__file__).resolve().parents[2] / "scripts" / "record_cassettes.py"
PLACEHOLDER_ID = re.compile(r"^(env|ver|req|lyr)_0{10}[0-9A-HJKMNP-TV-Z]{16}$")


def _no_retry(seconds: float) -> None:
    raise AssertionError(f"the facade tried to retry (after {seconds}s) during a replay")


def replay(name: str) -> tuple[Any, Replayed]:
    """Run scenario `name` on its cassette: what it returned, and what the facade sent."""
    with (
        replaying(f"{name}.yaml") as wire,
        Denv(CASSETTE_SERVER, CASSETTE_KEY, _sleep=_no_retry, detach=True) as denv,
    ):
        result = SCENARIOS[name](denv)
    return result, wire


def test_health() -> None:
    health, _ = replay("health")
    assert health.status.value == "ok"


def test_create_sandbox() -> None:
    env, wire = replay("create_sandbox")
    assert env.status is EnvStatus.HEALTHY
    assert env.egress.value == "deny" and env.labels["scenario"] == "create_sandbox"
    (service,) = env.services
    assert service.image == IMAGE and service.image_digest.startswith("sha256:")
    (endpoint,) = env.endpoints
    assert endpoint.via is EndpointVia.INGRESS and endpoint.port == 8000
    assert endpoint.url.startswith(f"{CASSETTE_SERVER}/ingress/")
    create = wire.sent[0]
    assert (create.method, create.path) == ("POST", "/v1/sandboxes")
    assert json.loads(create.body)["egress"] == "deny"
    assert create.headers["idempotency-key"].startswith("denv-")


def test_get_env() -> None:
    (env, got), _ = replay("get_env")
    assert got.id == env.id and got.status is EnvStatus.HEALTHY


def test_list_envs_follows_cursors() -> None:
    (created, listed, by_version), wire = replay("list_envs")
    assert [e.id for e in listed] == [e.id for e in reversed(created)]  # newest first
    assert [e.id for e in by_version] == [created[0].id]
    pages = [uri for uri in wire.uris() if uri.split("?")[0].endswith("/v1/envs")]
    assert "cursor=" not in pages[0] and "cursor=" in pages[1]


def test_wait_env() -> None:
    (env, waited), _ = replay("wait_env")
    assert env.status is not EnvStatus.HEALTHY  # created with wait="none"
    assert waited.id == env.id and waited.status is EnvStatus.HEALTHY


def test_logs() -> None:
    lines, wire = replay("logs")
    assert 0 < len(lines) <= 3 and all(isinstance(line, str) for line in lines)
    assert any("tail=3" in uri for uri in wire.uris())


def test_snapshot() -> None:
    (env, version), _ = replay("snapshot")
    assert version.parent_env_id == env.id and version.labels["step"] == "1"
    assert version.services[0].image_digest == env.services[0].image_digest


def test_fork_with_count_2() -> None:
    (env, forked), wire = replay("fork")
    (fork,) = [r for r in wire.sent if r.path == f"/v1/envs/{env.id}/fork"]
    assert json.loads(fork.body)["count"] == 2
    assert forked.version.parent_env_id == env.id
    assert len(forked.envs) == 2
    assert len({child.id for child in forked.envs}) == 2
    for child in forked.envs:
        assert child.parent_id == env.id and child.version_id == forked.version.id
        assert child.status is EnvStatus.HEALTHY
    urls = {child.endpoints[0].url for child in forked.envs} | {env.endpoints[0].url}
    assert len(urls) == 3  # each child has its own ingress URL


def test_envs_from_version() -> None:
    (version, envs), _ = replay("envs_from_version")
    (env,) = envs
    assert env.version_id == version.id and env.status is EnvStatus.HEALTHY


def test_create_sandboxes_sends_count_and_returns_each_env() -> None:
    envs, wire = replay("create_sandboxes")
    (create,) = [r for r in wire.sent if r.path == "/v1/sandboxes"]
    assert json.loads(create.body)["count"] == 2
    assert len({env.id for env in envs}) == 2
    assert all(env.status is EnvStatus.HEALTHY for env in envs)
    assert len({env.version_id for env in envs}) == 1  # one implicit version for the batch


def test_lineage_and_diff() -> None:
    (env, forked, later, chain, diff), wire = replay("lineage_and_diff")
    (child,) = forked.envs
    assert later.parent_env_id == child.id and later.parent_version_id == forked.version.id
    assert forked.version.parent_version_id == env.version_id
    assert [x.id for x in chain] == [child.id, forked.version.id, env.id, env.version_id]
    assert [type(x).__name__ for x in chain] == ["Env", "Version", "Env", "Version"]
    (sent,) = [r for r in wire.sent if r.path == f"/v1/versions/{later.id}/diff"]
    assert sent.uri.endswith(f"/v1/versions/{later.id}/diff?base={forked.version.id}")
    assert (diff.base_version_id, diff.version_id) == (forked.version.id, later.id)
    assert all(c.path.startswith("/work/") for c in diff.changes)


def test_get_version() -> None:
    (version, got), _ = replay("get_version")
    assert got.id == version.id and got.agent_service == "agent"


def test_list_versions_follows_cursors() -> None:
    (made, listed), wire = replay("list_versions")
    assert {v.id for v in made} <= {v.id for v in listed}
    assert any("cursor=" in uri for uri in wire.uris())


def test_delete_version_in_use_is_a_conflict() -> None:
    (in_use, deleted_later), _ = replay("delete_version_in_use")
    assert isinstance(in_use, Conflict)
    assert (in_use.status, in_use.code) == (409, "version_in_use")
    assert deleted_later is None


def test_deploy_and_list_projects() -> None:
    (version, projects), _ = replay("deploy_and_list_projects")
    assert version.project == PROJECT and version.labels["source"] == "cassette"
    (project,) = projects
    assert project.name == PROJECT and project.latest_version_id == version.id


def test_delete_env_twice_is_idempotent() -> None:
    (env, after), wire = replay("delete_env_twice")
    assert after.id == env.id and after.status is EnvStatus.DELETED
    deletes = [r for r in wire.sent if r.method == "DELETE"]
    assert len(deletes) == 2


def test_unknown_env_is_not_found() -> None:
    error, _ = replay("unknown_env")
    assert isinstance(error, NotFound)
    assert (error.status, error.code) == (404, "not_found")
    assert UNKNOWN_ENV in error.message and error.request_id


def test_bad_key_is_unauthorized() -> None:
    error, _ = replay("bad_key")
    assert isinstance(error, Unauthorized) and (error.status, error.code) == (401, "unauthorized")


def test_image_not_found() -> None:
    error, _ = replay("image_not_found")
    assert isinstance(error, InvalidRequest)
    assert (error.status, error.code) == (422, "image_not_found")
    assert "denv-no-such-image:latest" in error.message


def test_count_above_limit_is_invalid() -> None:
    error, _ = replay("count_above_limit")
    assert isinstance(error, InvalidRequest)
    assert (error.status, error.code) == (422, "limit_exceeded")


def test_every_scenario_has_a_test() -> None:
    tested = {name.removeprefix("test_") for name in globals() if name.startswith("test_")}
    untested = [n for n in SCENARIOS if not any(t.startswith(n) for t in tested)]
    assert not untested


# -- the cassettes hold nothing secret or volatile


def _recorder() -> Any:
    spec = importlib.util.spec_from_file_location("record_cassettes", RECORDER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", sorted(CASSETTES.glob("*.yaml")), ids=lambda p: p.stem)
def test_cassettes_are_scrubbed(path: Path) -> None:
    text = path.read_text()
    assert set(re.findall(r"dak_[A-Za-z0-9_\-]+", text)) <= {CASSETTE_KEY}
    for found in re.findall(r"\b(?:env|ver|req|lyr)_[0-9A-Z]{26}\b", text):
        assert PLACEHOLDER_ID.match(found), f"unscrubbed id {found}"
    assert set(re.findall(r"/ingress/([A-Za-z0-9_\-]+)", text)) <= {
        f"INGRESS_TOKEN_{n}" for n in range(1, 100)
    }
    assert "date:" not in text.lower().split("interactions:")[1].replace("update", "")
    assert "127.0.0.1:" not in text.replace("127.0.0.1:7711", "")


def test_recorder_and_replay_agree_on_placeholders() -> None:
    recorder = _recorder()
    assert (recorder.CASSETTE_SERVER, recorder.CASSETTE_KEY) == (CASSETTE_SERVER, CASSETTE_KEY)
    # What the replay wants sent is what the recorder scrubs; what it wants recorded, it writes.
    key = new_key()
    assert SENT_AUTHORIZATION.fullmatch(f"Bearer {key}") and recorder._KEY.fullmatch(key)
    scrubbed = recorder.Scrubber(CASSETTE_SERVER).headers(
        {"authorization": f"Bearer {key}", "idempotency-key": f"denv-{uuid.uuid4()}"}, None
    )
    assert scrubbed["authorization"] == RECORDED_AUTHORIZATION
    assert RECORDED_IDEMPOTENCY_KEY.fullmatch(scrubbed["idempotency-key"])


def test_two_recordings_scrub_to_the_same_text() -> None:
    # Two runs differ in port, key, ids, tokens, times and addresses; scrubbed, they must not.
    recorder = _recorder()

    def run(port: int, key: str, ids: tuple[str, str], token: str, when: str) -> str:
        body = (
            f'{{"id":"{ids[0]}","version_id":"{ids[1]}","created_at":"{when}",'
            f'"endpoints":[{{"url":"http://127.0.0.1:{port}/ingress/{token}/"}}],'
            f'"lines":["172.18.0.1:{port + 1} - GET /health"],"next_cursor":"'
            + recorder.base64.urlsafe_b64encode(ids[0].encode()).decode().rstrip("=")
            + '"}'
        )
        scrubber = recorder.Scrubber(f"http://127.0.0.1:{port}")
        out: str = scrubber.text(
            f"Bearer {key} GET http://127.0.0.1:{port}/v1/envs/{ids[0]} {body}"
        )
        return out

    first = run(
        40001,
        "dak_" + "a" * 43,
        ("env_01JDQ5C8M9W3X7Y2Z4A6B8C0D1", "ver_01JDQ5C8M9W3X7Y2Z4A6B8C0D2"),
        "tokenAAAA",
        "2026-11-29T14:54:10.418000Z",
    )
    second = run(
        40777,
        "dak_" + "b" * 43,
        ("env_01M8KWSEX2Q7V12JDR49WDZSA7", "ver_01M8KWTJ4KT3ZY7VSMND3AG161"),
        "tokenBBBB",
        "2027-01-02T03:04:05Z",
    )
    assert first == second
    assert "env_00000000000000000000000001" in first and "INGRESS_TOKEN_1" in first
