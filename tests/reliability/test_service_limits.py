"""A compose service's own limits reach its container; the others get the server's.

A server of its own with ``--env-memory 512 --env-pids 256 --env-cpus 1``; a project whose
agent asks for less (``mem_limit: 128m``, ``pids_limit: 64``, ``cpus: 0.5``) and whose
second service (``deploy.resources.limits``: ``memory: 256M``) sets only memory. The
containers' Docker limits are read back; a deploy asking for more than the server gives
is refused (422 ``invalid_compose``, naming the key and the option) and makes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import LocalDenv, docker_engine, start_server
from reliability_helpers import STANDIN, api, delete_all, ok, report

pytestmark = pytest.mark.e2e

MIB = 1024 * 1024
SERVE = "python3 -m http.server 8000 --directory /srv/www"
COMPOSE = f"""
x-denv: {{agent: {{service: app}}}}
services:
  app:
    image: {STANDIN}
    command: {SERVE}
    ports: [8000]
    mem_limit: 128m
    pids_limit: 64
    cpus: 0.5
  side:
    image: {STANDIN}
    command: {SERVE}
    deploy:
      resources:
        limits: {{memory: 256M}}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    docker_engine(STANDIN)
    limits = ("--env-memory", "512", "--env-pids", "256", "--env-cpus", "1")
    with start_server(tmp_path_factory.mktemp("denv-service-limits"), *limits) as srv:
        yield srv


def host_config(env_id: str, service: str) -> dict[str, int]:
    engine = docker_engine()
    info = engine.api.inspect_container(f"denv-{env_id.lower()}-{service}")["HostConfig"]
    return {k: int(info.get(k) or 0) for k in ("Memory", "PidsLimit", "NanoCpus")}


def test_a_service_gets_its_own_limits_within_the_servers(
    server: LocalDenv, request: pytest.FixtureRequest
) -> None:
    with api(server) as c:
        version = ok(c.post("/v1/projects/limits/deploy", json={"compose": COMPOSE}))
        env = ok(c.post(f"/v1/versions/{version['id']}/envs", json={"wait": "healthy"}))["envs"][0]
        app, side = host_config(env["id"], "app"), host_config(env["id"], "side")
        too_much = c.post(
            "/v1/projects/limits/deploy",
            json={"compose": COMPOSE.replace("mem_limit: 128m", "mem_limit: 1g")},
        )
        versions = [v["id"] for v in ok(c.get("/v1/versions"), 200)["items"]]
        delete_all(c)
    report(
        request,
        f"service limits: app {app['Memory'] // MIB} MiB / {app['PidsLimit']} pids / "
        f"{app['NanoCpus'] / 1e9:g} CPUs, side {side['Memory'] // MIB} MiB / "
        f"{side['PidsLimit']} pids / {side['NanoCpus'] / 1e9:g} CPUs (server 512/256/1); "
        f"asking for 1g: {too_much.status_code} {too_much.json()['code']}",
    )
    assert app == {"Memory": 128 * MIB, "PidsLimit": 64, "NanoCpus": 500_000_000}
    assert side == {"Memory": 256 * MIB, "PidsLimit": 256, "NanoCpus": 1_000_000_000}
    assert too_much.status_code == 422, too_much.text
    body = too_much.json()
    assert body["code"] == "invalid_compose"
    assert body["details"]["path"] == "services.app.mem_limit"
    assert "--env-memory" in body["message"], body
    assert versions == [version["id"]]  # the refused deploy made no version
