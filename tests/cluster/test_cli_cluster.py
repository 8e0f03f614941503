"""`denv cluster up`, `status` and `down` as a user runs them (issue 18).

The session's cluster (conftest's ``cluster``) is itself started with ``denv cluster up``
and stopped with ``denv cluster down --purge``, whose teardown asserts that nothing is left.
This file runs first in tests/cluster (its name sorts first), while every node is alive and
no env has been placed: what `up` printed, then an env placed through the URL it exported,
as `status` reports it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest
from cluster_helpers import LocalCluster

pytestmark = pytest.mark.e2e

CLI = [sys.executable, "-m", "denv", "cluster"]
STANDIN = "denv-http-standin:latest"  # built by `make images`
STANDIN_CMD = ["python3", "-m", "http.server", "8000", "--directory", "/srv/www"]


def _api(cluster: LocalCluster, method: str, path: str, body: object = None) -> object:
    request = urllib.request.Request(
        f"{cluster.url}{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {cluster.api_key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


def test_up_exports_the_server_and_status_counts_an_env_placed_through_it(
    cluster: LocalCluster,
) -> None:
    exports = dict(
        line.removeprefix("export ").split("=", 1)
        for line in cluster.up_stdout.splitlines()
        if line.startswith("export ")
    )
    assert exports == {"DENV_SERVER": cluster.url, "DENV_API_KEY": cluster.api_key}, exports
    where = ["--state-dir", str(cluster.dir)]
    env = _api(cluster, "POST", "/v1/sandboxes", {"image": STANDIN, "command": STANDIN_CMD})
    assert isinstance(env, dict)
    try:
        status = subprocess.run(
            [*CLI, "status", "--json", *where], capture_output=True, text=True, timeout=120
        )
        assert status.returncode == 0, status.stderr
        found = json.loads(status.stdout)
        assert [(n["name"], n["alive"]) for n in found["nodes"]] == [
            (name, True) for name in cluster.nodes
        ]
        assert sum(n["envs"] for n in found["nodes"]) == 1, found
        assert found["server"]["running"] and found["store"], found
        text = subprocess.run(
            [*CLI, "status", *where], capture_output=True, text=True, timeout=120
        ).stdout
        head = "isolated" if cluster.isolated else f"{cluster.head} *"  # the head runs no envs
        assert head in text and "alive" in text, text
    finally:
        _api(cluster, "DELETE", f"/v1/envs/{env['id']}")
