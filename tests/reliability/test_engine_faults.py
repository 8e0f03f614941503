"""Faults in the engine: dying children are reported failed with their log tail, and a
Docker daemon restart is survived.

The daemon restart runs against the session's private dockerd (``private_engine`` in
tests/conftest.py: own socket, data root and exec root and bridge, no iptables) that the
server is pointed at with ``DOCKER_HOST``: restarting the machine's shared dockerd would kill
the containers of every other test and user (and of other helpers' servers sharing it).
Where no second dockerd can run (no binary, no privileges), the test fails with the
daemon's log.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import httpx
import pytest
from conftest import LocalDenv, start_server
from private_dockerd import PrivateDockerd
from reliability_helpers import (
    STANDIN,
    api,
    assert_nothing_left,
    container_of,
    delete_all,
    ok,
    report,
)

pytestmark = pytest.mark.e2e

MAYBE_DIE = (
    'if [ -n "$DIE" ]; then echo child-dying-marker; exit 7; fi; '
    "exec python3 -m http.server 8000 --directory /srv/www"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    with start_server(tmp_path_factory.mktemp("denv-faults")) as srv:
        yield srv


def test_dying_children_are_failed_with_log_tail(
    server: LocalDenv, request: pytest.FixtureRequest
) -> None:
    with api(server) as c:
        parent = ok(
            c.post("/v1/sandboxes", json={"image": STANDIN, "command": ["sh", "-c", MAYBE_DIE]})
        )
        assert parent["status"] == "healthy", parent
        # a child that dies while it starts (its env var makes its server exit)
        born_dead = ok(c.post(f"/v1/envs/{parent['id']}/fork", json={"env": {"DIE": "1"}}))
        (dead,) = born_dead["envs"]
        assert dead["status"] == "failed", dead
        assert dead["error"]["code"] == "exited", dead["error"]
        assert "child-dying-marker" in dead["error"]["log_tail"], dead["error"]
        # children whose containers are killed after they were healthy
        fork = ok(c.post(f"/v1/envs/{parent['id']}/fork", json={"count": 3}))
        victims, survivor = fork["envs"][:2], fork["envs"][2]
        for child in [*victims, survivor]:
            assert httpx.get(child["endpoints"][0]["url"] + "/health", trust_env=False).is_success
        for child in victims:
            subprocess.run(["docker", "kill", container_of(child)], check=True, capture_output=True)
        for child in victims:
            got = ok(c.get(f"/v1/envs/{child['id']}"), 200)
            assert got["status"] == "failed", got
            assert got["error"]["code"] == "exited", got["error"]
            assert any("GET /health" in line for line in got["error"]["log_tail"]), got["error"]
        listed = {e["id"]: e["status"] for e in ok(c.get("/v1/envs"), 200)["items"]}
        assert all(listed[v["id"]] == "failed" for v in victims)
        assert ok(c.get(f"/v1/envs/{survivor['id']}"), 200)["status"] == "healthy"
        assert ok(c.get(f"/v1/envs/{parent['id']}"), 200)["status"] == "healthy"
        delete_all(c)
    report(
        request,
        "engine faults: 1 child dead at start and 2 killed children reported failed with their "
        "log tail, 2 siblings still healthy",
    )
    assert_nothing_left(request, server.state_dir, "engine faults: after", quiet=True)


def test_docker_daemon_restart_is_survived(
    private_engine: PrivateDockerd,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    daemon = private_engine
    try:
        monkeypatch.setenv("DOCKER_HOST", daemon.host)
        with start_server(daemon.state_dir / "faults") as srv, api(srv) as c:
            envs = [
                ok(c.post("/v1/sandboxes", json={"image": STANDIN})),
                ok(c.post("/v1/sandboxes", json={"image": STANDIN, "egress": "allow"})),
            ]
            assert all(e["status"] == "healthy" for e in envs), envs
            daemon.stop()
            # the engine is gone: the server still answers, and says so
            health = ok(c.get("/v1/health"), 200)
            assert health["engine"] == "unavailable", health
            for env in envs:
                assert c.get(f"/v1/envs/{env['id']}").status_code == 200
            res = c.post("/v1/sandboxes", json={"image": STANDIN})
            assert res.status_code == 503 and res.json()["code"] == "engine_unavailable"
            answered = 2 + len(envs)
            daemon.start()
            # back: the envs whose containers stopped with the daemon are failed, new ones run
            for env in envs:
                got = ok(c.get(f"/v1/envs/{env['id']}"), 200)
                assert got["status"] == "failed", got
            fresh = ok(c.post("/v1/sandboxes", json={"image": STANDIN}))
            assert fresh["status"] == "healthy", fresh
            delete_all(c)
            left_containers = daemon.docker("ps", "-aq").split()
            left_networks = [
                n
                for n in daemon.docker(
                    "network", "ls", "-q", "--filter", "label=denv.managed"
                ).split()
            ]
            assert_nothing_left(request, srv.state_dir, "engine faults: daemon", quiet=True)
        report(
            request,
            f"engine faults: dockerd restarted under {len(envs)} envs: {answered} requests "
            f"answered while it was down, {len(envs)} envs reported failed after, a new env "
            f"healthy, {len(left_containers)} containers and {len(left_networks)} networks left",
        )
        assert not left_containers and not left_networks
    finally:
        if not daemon.answers():  # the session's other users get it back running
            daemon.start()
