"""End to end: warm forks from booted spares, on a real server, dockerd and overlay mounts.

A warm-safe env (the probe app reads /work per request; the echo env per session) asks for
``warm: n`` spares; its forks adopt them: children report ``start: warm`` and see the
parent's /work at the fork. Not warm-safe: cold. Pools refill, are reaped with their
envs, stay within ``--warm-max-spares`` / ``--warm-max-memory``, and no spare survives a
server restart (clean or killed). Spares are found by the ``denv.warm`` label and the
server log's "spare ... ready" lines; nothing here asserts on time.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import LocalDenv, clean, instance_id, leftovers, start_server, stop
from openenv.core import GenericEnvClient

pytestmark = pytest.mark.e2e

PROBE = "denv-base-probe:latest"
ECHO = "denv-echo-env:latest"
APP = (Path(__file__).parent / "probe_app.py").read_text()
READY = re.compile(r"spare (env_[0-9A-Z]{26}) ready in pool")
WAIT_S = 240.0
NOTHING: dict[str, list[str]] = {"containers": [], "networks": [], "dirs": [], "mounts": []}


def api(srv: LocalDenv) -> httpx.Client:
    return httpx.Client(
        base_url=srv.url,
        headers={"Authorization": f"Bearer {srv.key}"},
        timeout=300,
        trust_env=False,
    )


def probe_sandbox(c: httpx.Client, **body: Any) -> dict[str, Any]:
    res = c.post("/v1/sandboxes", json={"image": PROBE, "command": ["python3", "-c", APP], **body})
    assert res.status_code == 201, res.text
    env: dict[str, Any] = res.json()
    assert env["status"] == "healthy", env
    return env


def fork(c: httpx.Client, env: dict[str, Any], count: int, **body: Any) -> list[dict[str, Any]]:
    res = c.post(f"/v1/envs/{env['id']}/fork", json={"count": count, **body})
    assert res.status_code == 201, res.text
    envs: list[dict[str, Any]] = res.json()["envs"]
    assert all(e["status"] == "healthy" for e in envs), envs
    return envs


def url_of(env: dict[str, Any]) -> str:
    return str(env["endpoints"][0]["url"])


def read(env: dict[str, Any], name: str) -> str | None:
    res = httpx.get(f"{url_of(env)}/files/{name}", trust_env=False, timeout=30)
    return res.text if res.status_code == 200 else None


def write(env: dict[str, Any], name: str, text: str) -> None:
    res = httpx.put(f"{url_of(env)}/files/{name}", content=text.encode(), trust_env=False)
    assert res.status_code == 201, res.text


def spare_containers(srv: LocalDenv) -> dict[str, str]:
    """Container id -> env id of every container of this server made as a spare."""
    out = subprocess.run(
        [
            "docker",
            "ps",
            "-a",
            "--filter",
            f"label=denv.instance={instance_id(srv.state_dir)}",
            "--filter",
            "label=denv.warm",
            "--format",
            '{{.ID}} {{.Label "denv.env"}}',
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(line.split() for line in out.splitlines())


def known_envs(c: httpx.Client) -> set[str]:
    return {e["id"] for e in c.get("/v1/envs", params={"limit": 200}).json()["items"]}


def idle_spares(srv: LocalDenv, c: httpx.Client) -> set[str]:
    """Spares that are booted (the log says so), still there, and not taken by an env."""
    ready = set(READY.findall((srv.state_dir / "server.log").read_text()))
    there = set(spare_containers(srv).values())
    return (ready & there) - known_envs(c)


def wait_for(what: str, check: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting: {what}")
        time.sleep(0.25)


def left_of(srv: LocalDenv, env_ids: set[str]) -> dict[str, list[str]]:
    """What the given env ids still have: containers, networks, volume dirs."""
    lowered = {e.lower() for e in env_ids}
    nets = subprocess.run(
        ["docker", "network", "ls", "--format", "{{.Name}}"], capture_output=True, text=True
    ).stdout.split()
    return {
        "containers": [c for c, e in spare_containers(srv).items() if e in env_ids],
        "networks": [n for n in nets if n.removeprefix("denv-") in lowered],
        "dirs": [e for e in env_ids if (srv.state_dir / "envs" / e).exists()],
        "mounts": [m for m in leftovers(srv.state_dir)["mounts"] if any(e in m for e in env_ids)],
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    with start_server(tmp_path_factory.mktemp("denv-warm")) as srv:
        yield srv


def test_warm_children_see_the_parents_work_and_the_pool_refills(server: LocalDenv) -> None:
    with api(server) as c:
        root = probe_sandbox(c, warm=2, warm_fork=True)
        assert root["start"] == "cold"
        write(root, "note", "before the fork")
        wait_for("2 spares", lambda: len(idle_spares(server, c)) >= 2)
        first = idle_spares(server, c)

        children = fork(c, root, 2, warm=2)
        assert [e["start"] for e in children] == ["warm", "warm"]
        assert all(s["start"] == "warm" for e in children for s in e["services"])
        assert {e["id"] for e in children} == first  # the spares became the children
        version = c.get(f"/v1/versions/{children[0]['version_id']}").json()
        assert version["warm_fork"] is True
        for child in children:
            assert read(child, "note") == "before the fork"
        write(root, "later", "after the fork")
        write(children[0], "mine", "child 0 only")
        assert read(children[0], "later") is None
        assert read(children[1], "mine") is None
        assert read(root, "mine") is None

        # The pool refills in the background, with new spares.
        wait_for("the pool to refill", lambda: len(idle_spares(server, c) - first) >= 2)
        refilled = idle_spares(server, c)

        # Deleting every env that asked for the pool reaps it.
        for env in [root, *children]:
            assert c.delete(f"/v1/envs/{env['id']}").status_code == 204
        gone = refilled | first | {root["id"]}
        wait_for("the pool to be reaped", lambda: left_of(server, gone) == NOTHING)


def test_a_fork_takes_spares_still_booting(server: LocalDenv) -> None:
    with api(server) as c:
        root = probe_sandbox(c, warm_fork=True)
        write(root, "note", "booting")
        # The first fork asks for the pool and returns at once: its spares are still booting.
        res = c.post(f"/v1/envs/{root['id']}/fork", json={"warm": 2, "wait": "none"})
        assert res.status_code == 201, res.text
        first = res.json()["envs"]
        children = fork(c, root, 2)
        assert [e["start"] for e in children] == ["warm", "warm"]
        for child in children:
            assert read(child, "note") == "booting"
        for env in [root, *first, *children]:
            assert c.delete(f"/v1/envs/{env['id']}").status_code == 204
        wait_for("the pool to be reaped", lambda: not spare_containers(server))


def test_echo_state_equal_across_root_and_warm_children(server: LocalDenv) -> None:
    with api(server) as c:
        res = c.post("/v1/sandboxes", json={"image": ECHO, "warm": 2})
        assert res.status_code == 201, res.text
        root = res.json()
        try:
            with GenericEnvClient(base_url=url_of(root)).sync() as env:
                env.reset()
                for i in range(3):
                    env.step({"message": f"prefix {i}"})
                want = env.state()
            assert want["step_count"] == 3
            wait_for("2 echo spares", lambda: len(idle_spares(server, c)) >= 2)
            children = fork(c, root, 2)
            assert [e["start"] for e in children] == ["warm", "warm"]
            for child in [root, *children]:
                with GenericEnvClient(base_url=url_of(child)).sync() as env:
                    assert env.state() == want
            with GenericEnvClient(base_url=url_of(children[0])).sync() as env:
                env.step({"message": "branch 0"})
                assert env.state()["step_count"] == 4
            with GenericEnvClient(base_url=url_of(root)).sync() as env:
                assert env.state() == want
        finally:
            for env_id in known_envs(c):
                c.delete(f"/v1/envs/{env_id}")
        wait_for("the echo pool to be reaped", lambda: not spare_containers(server))


def test_not_warm_safe_falls_back_to_cold(server: LocalDenv) -> None:
    with api(server) as c:
        root = probe_sandbox(c, warm=2)  # no warm_fork, and the image declares nothing
        write(root, "note", "cold")
        children = fork(c, root, 1, warm=2)
        assert children[0]["start"] == "cold"
        assert read(children[0], "note") == "cold"
        version = c.get(f"/v1/versions/{children[0]['version_id']}").json()
        assert version["warm_fork"] is False
        assert not spare_containers(server)  # a pool it cannot use is never booted
        for env in [root, *children]:
            c.delete(f"/v1/envs/{env['id']}")


def two_services(fork: str) -> str:
    """The agent (probe app) and a db whose http.server reads /data per request."""
    reach_db = "import urllib.request as u; u.urlopen('http://db:5000/', timeout=5)"
    doc: dict[str, Any] = {
        "services": {
            "agent": {
                "image": PROBE,
                "command": ["python3", "-c", APP],
                "ports": ["8000"],
                "depends_on": {"db": {"condition": "service_healthy"}},
            },
            "db": {
                "image": PROBE,
                "command": ["python3", "-m", "http.server", "5000", "--directory", "/data"],
                "volumes": ["dbdata:/data"],
                "healthcheck": {
                    "test": ["CMD", "python3", "-c", reach_db.replace("db", "127.0.0.1")]
                },
            },
        },
        "volumes": {"dbdata": {}},
        "x-denv": {"agent": {"service": "agent", "fork": fork}},
    }
    return yaml.safe_dump(doc)


def db_file(env: dict[str, Any], name: str, text: str | None = None) -> str:
    """Write (with ``text``) or read /data/<name> in the env's db container."""
    script = f"echo {text} > /data/{name}" if text else f"cat /data/{name}"
    out = subprocess.run(
        ["docker", "exec", f"denv-{env['id'].lower()}-db", "sh", "-c", script],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip()


def test_multi_service_warm_fork_and_create_from_version(server: LocalDenv) -> None:
    with api(server) as c:
        res = c.post("/v1/projects/warm2/deploy", json={"compose": two_services("warm")})
        assert res.status_code == 201, res.text
        assert res.json()["warm_fork"] is True
        res = c.post(f"/v1/versions/{res.json()['id']}/envs", json={"warm": 1})
        assert res.status_code == 201, res.text
        (root,) = res.json()["envs"]
        assert root["status"] == "healthy", root
        write(root, "note", "agent")
        db_file(root, "seed", "db")
        wait_for("a two-service spare", lambda: len(idle_spares(server, c)) >= 1)

        (child,) = fork(c, root, 1)
        assert child["start"] == "warm"
        assert {s["name"]: s["start"] for s in child["services"]} == {"agent": "warm", "db": "warm"}
        assert read(child, "note") == "agent"
        assert db_file(child, "seed") == "db"  # every service's volumes are mounted late

        # Create-from-version takes a spare too (the pool refilled after the fork).
        wait_for("the pool to refill", lambda: len(idle_spares(server, c)) >= 1)
        res = c.post(f"/v1/versions/{child['version_id']}/envs", json={"count": 1})
        assert res.status_code == 201, res.text
        (again,) = res.json()["envs"]
        assert again["status"] == "healthy" and again["start"] == "warm", again
        assert read(again, "note") == "agent" and db_file(again, "seed") == "db"
        for env in (root, child, again):
            assert c.delete(f"/v1/envs/{env['id']}").status_code == 204
        wait_for("the pool to be reaped", lambda: not spare_containers(server))


def test_compose_declared_cold_is_cold(server: LocalDenv) -> None:
    with api(server) as c:
        res = c.post("/v1/projects/cold2/deploy", json={"compose": two_services("cold")})
        assert res.status_code == 201, res.text
        assert res.json()["warm_fork"] is False


def test_idle_pool_is_reaped(tmp_path: Path) -> None:
    with start_server(tmp_path / "state", "--warm-idle-minutes", "0.02") as srv, api(srv) as c:
        probe_sandbox(c, warm=1, warm_fork=True)
        wait_for("a spare", lambda: len(idle_spares(srv, c)) >= 1)
        # Nobody forks: the pool passes its idle time (1.2 s) and the reaper removes it.
        wait_for("the idle pool to be reaped", lambda: not spare_containers(srv))


def test_spare_count_bound(tmp_path: Path) -> None:
    with start_server(tmp_path / "state", "--warm-max-spares", "2") as srv, api(srv) as c:
        root = probe_sandbox(c, warm=4, warm_fork=True)
        wait_for("2 spares", lambda: len(idle_spares(srv, c)) >= 2)
        for _ in range(8):  # it asked for 4; the bound is 2, booting ones included
            assert len(spare_containers(srv)) <= 2
            time.sleep(0.5)
        children = fork(c, root, 3)
        assert sorted(e["start"] for e in children) == ["cold", "warm", "warm"]


def test_spare_memory_bound(tmp_path: Path) -> None:
    with start_server(tmp_path / "state", "--warm-max-memory", "1") as srv, api(srv) as c:
        root = probe_sandbox(c, warm=2, warm_fork=True)
        for _ in range(8):  # no spare fits in 1 MiB
            assert not spare_containers(srv)
            time.sleep(0.5)
        assert [e["start"] for e in fork(c, root, 1)] == ["cold"]


def test_restart_leaves_no_spare_behind(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with start_server(state, cleanup=False) as srv, api(srv) as c:
        root = probe_sandbox(c, warm=2, warm_fork=True)
        wait_for("2 spares", lambda: len(idle_spares(srv, c)) >= 2)
        killed = idle_spares(srv, c)
        assert srv.proc is not None
        srv.proc.kill()  # no clean shutdown: the spares stay until the next start
        srv.proc.wait()
        assert set(spare_containers(srv).values()) >= killed

    with start_server(state, cleanup=False) as srv, api(srv) as c:
        assert left_of(srv, killed) == NOTHING
        env = c.get(f"/v1/envs/{root['id']}").json()
        assert env["status"] == "healthy"
        # The pool the live env asked for is booted again.
        wait_for("2 new spares", lambda: len(idle_spares(srv, c) - killed) >= 2)
        stopped = idle_spares(srv, c)
    # A clean stop removes its spares; the env itself stays for the next start.
    assert left_of(srv, stopped) == NOTHING
    assert left_of(srv, {root["id"]})["dirs"] == [root["id"]]

    with start_server(state) as srv, api(srv) as c:  # this one cleans up everything
        assert c.delete(f"/v1/envs/{root['id']}").status_code == 204


@pytest.mark.parametrize("delete", [False, True], ids=["spares-booting", "env-deleted"])
def test_a_stop_leaves_no_spare(tmp_path: Path, delete: bool) -> None:
    # SIGTERM while the spares boot: their boots stop and remove what they made; the env
    # stays for the next start. SIGTERM just after deleting the only env that asked for the
    # pool: its ready spares' removal was handed to worker threads the server does not wait
    # for; shutdown removes them (it left both running). tests/server/test_server_node_seam
    # holds the deterministic version of the second.
    state = tmp_path / "state"
    try:
        with start_server(state, cleanup=False) as srv, api(srv) as c:
            res = c.post("/v1/sandboxes", json={"image": ECHO, "warm": 2, "wait": "running"})
            assert res.status_code == 201, res.text
            root = res.json()
            if delete:
                wait_for("2 echo spares", lambda: len(idle_spares(srv, c)) >= 2)
                assert c.delete(f"/v1/envs/{root['id']}").status_code == 204
            else:
                wait_for("a spare's container", lambda: bool(spare_containers(srv)))
            assert srv.proc is not None
            stop(srv.proc)  # SIGTERM, as `denv stop` and a service manager send
            assert srv.proc.returncode in (0, -15), srv.proc.returncode  # not SIGKILLed
            assert spare_containers(srv) == {}
        kept = set() if delete else {root["id"]}
        assert len(leftovers(state)["containers"]) == len(kept)
    finally:
        clean(state)
