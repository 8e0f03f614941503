"""Limits answer with clear errors: fork count, envs per key, volume size, timeouts, body size.

A server of its own with small limits (``--max-envs-per-key 3 --max-volume-mb 1``) so each
limit is reached with a few stand-in envs (a volume's: a write past it fails inside the
env). Each error must carry its stable code and a message that names the limit and what to
do; the env a refused request was about keeps running.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import LocalDenv, start_server
from reliability_helpers import (
    STANDIN,
    STANDIN_CMD,
    api,
    assert_nothing_left,
    container_of,
    delete_all,
    ok,
    report,
    standin,
)

pytestmark = pytest.mark.e2e

MAX_ENVS = 3
MAX_VOLUME_MB = 1
BIG_CMD = [
    "sh",
    "-c",
    "head -c 2097152 /dev/urandom > /work/big.bin; "
    "exec python3 -m http.server 8000 --directory /srv/www",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    state = tmp_path_factory.mktemp("denv-limits")
    with start_server(
        state, "--max-envs-per-key", str(MAX_ENVS), "--max-volume-mb", str(MAX_VOLUME_MB)
    ) as srv:
        yield srv


def refused(res: httpx.Response, status: int, code: str, *words: str) -> dict[str, Any]:
    assert res.status_code == status, res.text
    err: dict[str, Any] = res.json()
    assert err["code"] == code, err
    assert err["request_id"].startswith("req_"), err
    for word in words:
        assert word in err["message"], (word, err["message"])
    return err


def test_limits_answer_with_clear_errors(server: LocalDenv, request: pytest.FixtureRequest) -> None:
    checked = 0
    with api(server) as c:
        parent = standin(c)
        version = parent["version_id"]

        # fork count: at most 32 envs per request, whatever the route
        for path in (f"/v1/envs/{parent['id']}/fork", f"/v1/versions/{version}/envs"):
            refused(c.post(path, json={"count": 33}), 422, "limit_exceeded", "32", "count 33")
            checked += 1

        # envs per key: 3 live envs, then 429 for a sandbox and for a fork
        second = standin(c, wait="none")
        third = standin(c, wait="none")
        refused(
            c.post("/v1/sandboxes", json={"image": STANDIN, "command": STANDIN_CMD}),
            429,
            "quota_exceeded",
            f"limit of {MAX_ENVS}",
            "delete envs",
        )
        refused(
            c.post(f"/v1/envs/{parent['id']}/fork", json={"count": 1}),
            429,
            "quota_exceeded",
            f"limit of {MAX_ENVS}",
        )
        checked += 2
        for env in (second, third):
            assert c.delete(f"/v1/envs/{env['id']}").status_code == 204
        fork = ok(c.post(f"/v1/envs/{parent['id']}/fork", json={"count": 1}))
        assert fork["envs"][0]["status"] == "healthy"  # room again after deletes
        assert c.delete(f"/v1/envs/{fork['envs'][0]['id']}").status_code == 204

        # volume size: writing 2 MiB to /work stops at 1 MiB inside the env (ENOSPC: the
        # volume's changes live on a filesystem of --max-volume-mb); what it holds snapshots
        big = ok(c.post("/v1/sandboxes", json={"image": STANDIN, "command": BIG_CMD}))
        assert big["status"] == "healthy", big
        size = subprocess.run(
            ["docker", "exec", container_of(big), "stat", "-c", "%s", "/work/big.bin"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert 0 < int(size) < MAX_VOLUME_MB * 1024 * 1024, size
        assert ok(c.get(f"/v1/envs/{big['id']}"), 200)["status"] == "healthy"
        ok(c.post(f"/v1/envs/{big['id']}/snapshot", json={}))  # within the limit: it passes
        checked += 1
        assert c.delete(f"/v1/envs/{big['id']}").status_code == 204

        # request timeouts: waits are capped at 600 s and end (200) when theirs passes
        for path, body in (
            (f"/v1/envs/{parent['id']}/wait", {"timeout_s": 601}),
            ("/v1/sandboxes", {"image": STANDIN, "wait_timeout_s": 601}),
            (f"/v1/envs/{parent['id']}/fork", {"wait_timeout_s": 601}),
        ):
            refused(c.post(path, json=body), 422, "invalid_request", "600")
            checked += 1
        slow = ok(
            c.post(
                "/v1/sandboxes",
                json={
                    "image": STANDIN,
                    "command": STANDIN_CMD,
                    "health_path": "/never-there",
                    "wait": "none",
                },
            )
        )
        waited = ok(c.post(f"/v1/envs/{slow['id']}/wait", json={"timeout_s": 1}), 200)
        assert waited["status"] in ("creating", "starting"), waited  # answered, not hung
        assert c.delete(f"/v1/envs/{slow['id']}").status_code == 204
        timed_out = standin(c, health_path="/never-there", wait_timeout_s=2)
        assert timed_out["status"] == "failed", timed_out
        assert timed_out["error"]["code"] == "health_timeout"
        assert "wait_timeout_s" in timed_out["error"]["message"]
        checked += 2

        # request bodies: at most 1 MiB
        huge = {"image": STANDIN, "labels": {"x": "y" * 255}, "command": ["a" * 32768] * 40}
        refused(c.post("/v1/sandboxes", json=huge), 422, "invalid_request", "1 MiB")
        checked += 1
        delete_all(c)
    report(request, f"limits: {checked} limits reached, each refused with its code and message")
    assert_nothing_left(request, server.state_dir, "limits: after deletes")
