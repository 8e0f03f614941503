"""End to end: a real server process, real dockerd, real overlay mounts.

Sandbox → write /work → fork(3) → children see the write, not the parent's later one;
snapshot / versions / 409 version_in_use; egress deny through ingress; auth isolation;
idempotency; a restart keeps envs; everything deleted leaves nothing behind.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import LocalDenv, leftovers, start_server

pytestmark = pytest.mark.e2e

IMAGE = "denv-base-probe:latest"
APP = (Path(__file__).parent / "probe_app.py").read_text()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    with start_server(tmp_path_factory.mktemp("denv-lifecycle")) as srv:
        yield srv


def api(srv: LocalDenv, key: str | None = None) -> httpx.Client:
    return httpx.Client(
        base_url=srv.url,
        headers={"Authorization": f"Bearer {key or srv.key}"},
        timeout=180,
        trust_env=False,
    )


def sandbox(c: httpx.Client, **body: Any) -> dict[str, Any]:
    res = c.post("/v1/sandboxes", json={"image": IMAGE, "command": ["python3", "-c", APP], **body})
    assert res.status_code == 201, res.text
    env: dict[str, Any] = res.json()
    # wait=running returns once the container runs; a fast app may be healthy by then.
    allowed = {"none": {"creating"}, "running": {"starting", "healthy"}}
    assert env["status"] in allowed.get(body.get("wait", ""), {"healthy"}), env
    return env


def url_of(env: dict[str, Any]) -> str:
    return str(env["endpoints"][0]["url"])


def read(env: dict[str, Any], name: str) -> str | None:
    res = httpx.get(f"{url_of(env)}/files/{name}", trust_env=False, timeout=10)
    return res.text if res.status_code == 200 else None


def write(env: dict[str, Any], name: str, text: str) -> None:
    res = httpx.put(f"{url_of(env)}/files/{name}", content=text.encode(), trust_env=False)
    assert res.status_code == 201


def test_sandbox_fork_versions_and_cleanup(server: LocalDenv) -> None:
    with api(server) as c:
        parent = sandbox(c, egress="allow", labels={"case": "fork"})
        assert parent["endpoints"][0]["via"] == "published"
        assert parent["endpoints"][0]["url"].startswith("http://127.0.0.1:")
        write(parent, "a.txt", "before fork")

        res = c.post(f"/v1/envs/{parent['id']}/fork", json={"count": 3})
        assert res.status_code == 201, res.text
        fork = res.json()
        children = fork["envs"]
        assert len(children) == 3
        assert fork["version"]["parent_env_id"] == parent["id"]
        write(parent, "b.txt", "after fork")
        urls = {url_of(child) for child in children}
        assert len(urls) == 3 and url_of(parent) not in urls
        for child in children:
            assert child["status"] == "healthy" and child["parent_id"] == parent["id"]
            assert read(child, "a.txt") == "before fork"
            assert read(child, "b.txt") is None
        assert read(parent, "b.txt") == "after fork"

        # a stored version starts envs too; it cannot be deleted while they live
        version = c.post(f"/v1/envs/{parent['id']}/snapshot", json={"labels": {"k": "v"}})
        assert version.status_code == 201, version.text
        ver = version.json()
        assert ver["layer_depth"] == 1 and ver["labels"] == {"k": "v"}
        res = c.post(f"/v1/versions/{ver['id']}/envs", json={"count": 1})
        assert res.status_code == 201, res.text
        (from_version,) = res.json()["envs"]
        assert read(from_version, "b.txt") == "after fork"
        res = c.delete(f"/v1/versions/{ver['id']}")
        assert res.status_code == 409 and res.json()["code"] == "version_in_use"

        listed = c.get("/v1/envs", params={"version_id": fork["version"]["id"]}).json()
        assert {e["id"] for e in listed["items"]} == {e["id"] for e in children}

        for env in [parent, *children, from_version]:
            assert c.delete(f"/v1/envs/{env['id']}").status_code == 204
            assert c.delete(f"/v1/envs/{env['id']}").status_code == 204  # idempotent
            assert c.get(f"/v1/envs/{env['id']}").json()["status"] == "deleted"
        assert c.delete(f"/v1/versions/{ver['id']}").status_code == 204
        assert c.get(f"/v1/versions/{ver['id']}").status_code == 404
    assert leftovers(server.state_dir) == {
        "containers": [],
        "networks": [],
        "mounts": [],
        "cgroups": [],
    }


def test_deny_env_through_ingress_and_fork(server: LocalDenv) -> None:
    with api(server) as c:
        env = sandbox(c)  # egress deny is the default
        (endpoint,) = env["endpoints"]
        assert endpoint["via"] == "ingress"
        assert endpoint["url"].startswith(f"{server.url}/ingress/")
        write(env, "x.txt", "through ingress")
        res = c.post(f"/v1/envs/{env['id']}/fork", json={"count": 1})
        assert res.status_code == 201, res.text
        (child,) = res.json()["envs"]
        assert child["egress"] == "deny" and url_of(child) != url_of(env)
        assert read(child, "x.txt") == "through ingress"
        for e in (env, child):
            assert c.delete(f"/v1/envs/{e['id']}").status_code == 204
        # a deleted env's ingress URL answers nothing any more
        assert httpx.get(f"{url_of(env)}/health", trust_env=False).status_code == 404


def test_auth_isolation_and_errors(server: LocalDenv) -> None:
    from denv.server.auth import create_api_key

    other = create_api_key(server.state_dir)
    with api(server) as c, api(server, other) as o:
        assert httpx.get(f"{server.url}/v1/envs", trust_env=False).status_code == 401
        bad = api(server, "dak_" + "x" * 43).get("/v1/envs")
        assert bad.status_code == 401 and bad.json()["code"] == "unauthorized"
        env = sandbox(c, wait="running")
        assert o.get(f"/v1/envs/{env['id']}").status_code == 404
        assert o.delete(f"/v1/envs/{env['id']}").status_code == 404
        assert o.post(f"/v1/envs/{env['id']}/fork", json={}).status_code == 404
        assert o.get(f"/v1/versions/{env['version_id']}").status_code == 404
        assert o.get("/v1/envs").json()["items"] == []

        missing = c.post("/v1/sandboxes", json={"image": "denv-no-such-image:1"})
        assert missing.status_code == 422
        err = missing.json()
        assert err["code"] == "image_not_found" and "denv-no-such-image:1" in err["message"]
        assert "build or load" in err["message"] and err["request_id"].startswith("req_")
        res = c.post(f"/v1/envs/{env['id']}/fork", json={"count": 33})
        assert res.status_code == 422 and res.json()["code"] == "limit_exceeded"
        res = c.post("/v1/sandboxes", json={"image": IMAGE, "bogus": 1})
        assert res.status_code == 422 and res.json()["code"] == "invalid_request"
        res = c.get("/v1/nowhere")
        assert res.status_code == 404 and res.json()["code"] == "not_found"
        logs = c.get(f"/v1/envs/{env['id']}/logs", params={"tail": 5})
        assert logs.status_code == 200 and logs.json()["service"] == "agent"
        assert c.delete(f"/v1/envs/{env['id']}").status_code == 204


def test_idempotency_key(server: LocalDenv) -> None:
    body = {"image": IMAGE, "command": ["python3", "-c", APP], "wait": "none"}
    with api(server) as c:
        first = c.post("/v1/sandboxes", json=body, headers={"Idempotency-Key": "k1"})
        again = c.post("/v1/sandboxes", json=body, headers={"Idempotency-Key": "k1"})
        assert first.status_code == again.status_code == 201
        assert first.json()["id"] == again.json()["id"]
        other = c.post(
            "/v1/sandboxes", json={**body, "labels": {"x": "y"}}, headers={"Idempotency-Key": "k1"}
        )
        assert other.status_code == 409 and other.json()["code"] == "idempotency_conflict"
        env_id = first.json()["id"]
        waited = c.post(f"/v1/envs/{env_id}/wait", json={"until": "healthy", "timeout_s": 60})
        assert waited.json()["status"] == "healthy"
        assert c.delete(f"/v1/envs/{env_id}").status_code == 204


def test_failed_start_reports_log_tail(server: LocalDenv) -> None:
    with api(server) as c:
        res = c.post(
            "/v1/sandboxes",
            json={"image": IMAGE, "command": ["sh", "-c", "echo boom-marker; exit 3"]},
        )
        assert res.status_code == 201
        env = res.json()
        assert env["status"] == "failed"
        assert env["error"]["code"] == "exited"
        assert any("boom-marker" in line for line in env["error"]["log_tail"])
        assert c.delete(f"/v1/envs/{env['id']}").status_code == 204


def test_restart_keeps_envs(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with start_server(state, cleanup=False) as srv, api(srv) as c:
        env = sandbox(c)
        write(env, "keep.txt", "kept")
    # the server stopped; its env survives and its ingress token still works after restart
    with start_server(state) as srv, api(srv) as c:
        got = c.get(f"/v1/envs/{env['id']}").json()
        assert got["status"] == "healthy", got
        assert url_of(got).startswith(srv.url)
        assert read(got, "keep.txt") == "kept"
        assert c.delete(f"/v1/envs/{env['id']}").status_code == 204
        assert leftovers(state) == {"containers": [], "networks": [], "mounts": [], "cgroups": []}


def test_reconcile_marks_lost_and_removes_orphans(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with start_server(state, cleanup=False) as srv, api(srv) as c:
        env = sandbox(c)
    cid = f"denv-{env['id'].lower()}-agent"
    subprocess.run(["docker", "rm", "-f", cid], check=True, capture_output=True)
    with start_server(state) as srv, api(srv) as c:
        got = c.get(f"/v1/envs/{env['id']}").json()
        assert got["status"] == "failed" and got["error"]["code"] == "lost"
        assert leftovers(state) == {"containers": [], "networks": [], "mounts": [], "cgroups": []}
        assert c.delete(f"/v1/envs/{env['id']}").status_code == 204


def test_ttl_reaper_deletes_expired_envs(server: LocalDenv) -> None:
    with api(server) as c:
        env = sandbox(c, ttl_s=1, wait="running")
        res = c.post(f"/v1/envs/{env['id']}/wait", json={"until": "deleted", "timeout_s": 60})
        assert res.status_code == 200 and res.json()["status"] == "deleted"
