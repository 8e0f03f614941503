"""End to end: a two-service compose project on a real server and dockerd.

The agent reaches its database by service name on the env's private network, starts only
after the database's healthcheck passes, and a fork carries the database's volume too.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import LocalDenv, leftovers, start_server

pytestmark = pytest.mark.e2e

IMAGE = "denv-base-probe:latest"
APP = (Path(__file__).parent / "probe_app.py").read_text()
REACH_DB = "import urllib.request as u; u.urlopen('http://db:5000/', timeout=5)"


def compose() -> str:
    doc: dict[str, Any] = {
        "services": {
            "agent": {
                "image": IMAGE,
                "environment": {"APP": APP},
                "command": ["sh", "-c", f'python3 -c "{REACH_DB}" && exec python3 -c "$APP"'],
                "ports": ["8000"],
                "depends_on": {"db": {"condition": "service_healthy"}},
            },
            "db": {
                "image": IMAGE,
                "command": ["python3", "-m", "http.server", "5000", "--directory", "/data"],
                "volumes": ["dbdata:/data"],
                "healthcheck": {
                    "test": ["CMD", "python3", "-c", REACH_DB.replace("db", "127.0.0.1")]
                },
            },
        },
        "volumes": {"dbdata": {}},
        "x-denv": {"agent": {"service": "agent"}},
    }
    return yaml.safe_dump(doc)


def docker_exec(env_id: str, service: str, script: str) -> str:
    name = f"denv-{env_id.lower()}-{service}"
    out = subprocess.run(
        ["docker", "exec", name, "sh", "-c", script], capture_output=True, text=True, check=False
    )
    return out.stdout.strip()


def test_two_service_project(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with (
        start_server(state) as srv,
        httpx.Client(
            base_url=srv.url,
            headers={"Authorization": f"Bearer {srv.key}"},
            timeout=180,
            trust_env=False,
        ) as c,
    ):
        res = c.post("/v1/projects/demo/deploy", json={"compose": compose()})
        assert res.status_code == 201, res.text
        ver = res.json()
        assert ver["project"] == "demo" and ver["agent_service"] == "agent"
        by_name = {s["name"]: s for s in ver["services"]}
        assert by_name["db"]["volumes"] == ["/data"]
        assert by_name["agent"]["volumes"] == ["/work"]
        assert by_name["agent"]["depends_on"] == ["db"]
        projects = c.get("/v1/projects").json()["items"]
        assert [(p["name"], p["latest_version_id"]) for p in projects] == [("demo", ver["id"])]

        res = c.post(f"/v1/versions/{ver['id']}/envs", json={"count": 1})
        assert res.status_code == 201, res.text
        (env,) = res.json()["envs"]
        assert env["status"] == "healthy", env
        assert {s["name"] for s in env["services"]} == {"agent", "db"}
        assert [e["service"] for e in env["endpoints"]] == ["agent"]
        assert env["project"] == "demo"
        docker_exec(env["id"], "db", "echo seeded > /data/seed.txt")

        res = c.post(f"/v1/envs/{env['id']}/fork", json={"count": 1})
        assert res.status_code == 201, res.text
        (child,) = res.json()["envs"]
        assert child["status"] == "healthy", child
        assert docker_exec(child["id"], "db", "cat /data/seed.txt") == "seeded"
        docker_exec(env["id"], "db", "echo later > /data/later.txt")
        assert docker_exec(child["id"], "db", "ls /data") == "seed.txt"
        logs = c.get(f"/v1/envs/{child['id']}/logs", params={"service": "db"})
        assert logs.status_code == 200 and logs.json()["service"] == "db"

        for e in (env, child):
            assert c.delete(f"/v1/envs/{e['id']}").status_code == 204
        assert c.delete(f"/v1/versions/{ver['id']}").status_code == 204
        assert leftovers(state) == {"containers": [], "networks": [], "mounts": [], "cgroups": []}


def test_invalid_compose_names_the_key(denv_server: LocalDenv) -> None:
    url, key, _ = denv_server[:3]
    bad = "services:\n  db:\n    command: [x]\nx-denv:\n  agent:\n    service: db\n"
    with httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, trust_env=False
    ) as c:
        res = c.post("/v1/projects/demo/deploy", json={"compose": bad})
        assert res.status_code == 422
        body = res.json()
        assert body["code"] == "invalid_compose"
        assert body["message"].startswith("services.db.image:")
        missing = yaml.safe_dump(
            {
                "services": {"a": {"image": "denv-no-such-image:9", "ports": [8000]}},
                "x-denv": {"agent": {"service": "a"}},
            }
        )
        res = c.post("/v1/projects/demo/deploy", json={"compose": missing})
        assert res.status_code == 422 and res.json()["code"] == "image_not_found"
        assert "services.a.image" in res.json()["message"]
