"""Nothing leaks: create/fork/delete cycles, killed clients, failing starts, a killed server.

Afterwards no container, network, Docker volume, host mount or per-env upper dir of the
server's instance is left that no live env owns, and no layer that no version references.
The stand-in image (``python -m http.server``) is used where the env type does not matter:
it starts in about a second. Counts: CI-sized under ``make test``, the issue's under
``make soak`` (200 cycles).
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import LocalDenv, clean, start_server
from reliability_helpers import (
    ECHO,
    STANDIN,
    STANDIN_CMD,
    api,
    assert_nothing_left,
    delete_all,
    existing_envs,
    ok,
    report,
    scale,
    standin,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    with start_server(tmp_path_factory.mktemp("denv-leaks")) as srv:
        yield srv


def unreferenced_layers(state_dir: Path) -> list[str]:
    """Layer dirs that no version (deleted or not) references, and half-made ones."""
    with sqlite3.connect(state_dir / "denv.db") as con:
        rows = con.execute("SELECT volumes FROM versions WHERE deleted = 0").fetchall()
    referenced = {x for (vols,) in rows for vol in json.loads(vols) for x in vol["layers"]}
    layers = state_dir / "layers"
    return [
        p.name
        for p in layers.iterdir()
        if (p.name.startswith("lyr_") and p.name not in referenced) or p.name.startswith(".")
    ]


def test_create_fork_delete_cycles(server: LocalDenv, request: pytest.FixtureRequest) -> None:
    cycles = scale(10, 200)
    with api(server) as c:
        for _ in range(cycles):
            parent = standin(c)
            assert parent["status"] == "healthy", parent
            fork = ok(c.post(f"/v1/envs/{parent['id']}/fork", json={"count": 1}))
            (child,) = fork["envs"]
            assert child["status"] == "healthy", child
            for env in (child, parent):
                assert c.delete(f"/v1/envs/{env['id']}").status_code == 204
            for version in (fork["version"]["id"], parent["version_id"]):
                assert c.delete(f"/v1/versions/{version}").status_code == 204
    left = unreferenced_layers(server.state_dir)
    assert not left, left
    assert_nothing_left(request, server.state_dir, f"leaks: {cycles} create/fork/delete cycles")


# A client that starts an episode and is killed in its middle: over HTTP through ingress
# (the stand-in), or over an OpenEnv WebSocket session (the echo env).
CLIENT = r"""
import sys, httpx
url, key, image, mode = sys.argv[1:5]
c = httpx.Client(base_url=url, headers={"Authorization": "Bearer " + key}, timeout=120,
                 trust_env=False)
body = {"image": image, "ttl_s": 4, **({"ports": [8000]} if mode == "ws" else {})}
env = c.post("/v1/sandboxes", json=body).json()
print(env["id"], flush=True)
base = env["endpoints"][0]["url"]
if mode == "ws":
    from openenv.core.generic_client import GenericEnvClient
    with GenericEnvClient(base_url=base).sync() as session:
        session.reset()
        i = 0
        while True:
            session.step({"message": f"step {i}"})
            i += 1
else:
    with httpx.Client(trust_env=False, timeout=30) as http:
        while True:
            http.get(base + "/health")
"""


def test_killed_clients_leave_nothing(server: LocalDenv, request: pytest.FixtureRequest) -> None:
    from denv.server.auth import create_api_key

    key = create_api_key(server.state_dir)  # this test's envs only: the reaper must take all
    modes = [("http", STANDIN)] * scale(2, 16) + [("ws", ECHO)] * scale(1, 4)
    procs = []
    for mode, image in modes:
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", CLIENT, server.url, key, image, mode],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    # One more client is killed before its create returns.
    early = subprocess.Popen(
        [sys.executable, "-c", CLIENT, server.url, key, STANDIN, "http"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.3)
    early.send_signal(signal.SIGKILL)
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().strip()  # the env id: the episode has begun
        assert line.startswith("env_"), (line, proc.stderr.read() if proc.stderr else b"")
        time.sleep(0.5)  # in the middle of the episode
        proc.send_signal(signal.SIGKILL)
    for proc in [*procs, early]:
        proc.wait()
    with api(server, key) as c:
        assert ok(c.get("/v1/health"), 200)["status"] == "ok"
        deadline = time.monotonic() + 90  # ttl 4 s, reaper every 5 s
        while (left := existing_envs(c)) and time.monotonic() < deadline:
            time.sleep(1)
        assert not left, [(e["id"], e["status"]) for e in left]
    assert_nothing_left(
        request,
        server.state_dir,
        f"leaks: {len(procs) + 1} clients killed mid-episode ({len(procs)} while stepping, "
        "1 during create), all envs reaped by ttl",
    )


def test_failing_starts_leave_nothing(server: LocalDenv, request: pytest.FixtureRequest) -> None:
    rounds = scale(2, 20)
    dying_later = (
        "import socket,time; s=socket.socket(); s.bind(('',8000)); s.listen(); "
        "print('listening', flush=True); time.sleep(1); print('dying', flush=True)"
    )
    failures: dict[str, int] = {}
    with api(server) as c:
        for _ in range(rounds):
            res = c.post("/v1/sandboxes", json={"image": "denv-no-such-image:0"})
            assert res.status_code == 422 and res.json()["code"] == "image_not_found"
            failures["bad image"] = failures.get("bad image", 0) + 1
            cases = {
                "crash at once": {"command": ["sh", "-c", "echo crash-marker; exit 3"]},
                "crash later": {"command": ["python3", "-c", dying_later]},
                "readiness timeout": {
                    "command": STANDIN_CMD,
                    "health_path": "/never-there",
                    "wait_timeout_s": 2,
                },
            }
            for name, body in cases.items():
                env = ok(c.post("/v1/sandboxes", json={"image": STANDIN, **body}))
                assert env["status"] == "failed", env
                code = "health_timeout" if name == "readiness timeout" else "exited"
                assert env["error"]["code"] == code, env["error"]
                if name == "crash at once":
                    assert "crash-marker" in env["error"]["log_tail"], env["error"]
                failures[name] = failures.get(name, 0) + 1
        assert delete_all(c) == 3 * rounds
    counts = ", ".join(f"{n} {k}" for k, n in failures.items())
    assert_nothing_left(request, server.state_dir, f"leaks: failing starts ({counts})")


def _fork_in_background(
    c: httpx.Client, env_id: str, count: int
) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def fork() -> None:
        try:
            outcome["res"] = c.post(f"/v1/envs/{env_id}/fork", json={"count": count})
        except httpx.HTTPError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=fork)
    thread.start()
    return thread, outcome


def _kill_during(state: Path, proc: subprocess.Popen[bytes], phase: str) -> str:
    """Wait until the fork reaches ``phase``, then SIGKILL the server; what was seen."""
    layers, deadline = state / "layers", time.monotonic() + 60
    while time.monotonic() < deadline:
        if phase == "snapshot" and any(p.name.startswith(".tmp-") for p in layers.iterdir()):
            break
        if phase == "children" and len(list((state / "envs").iterdir())) > 1:
            break
        time.sleep(0.005)
    else:
        raise AssertionError(f"the fork never reached its {phase}")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return phase


def test_kill9_mid_fork_then_restart(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    rounds = scale(1, 5)
    state = tmp_path / "state"
    parents, children = 0, 0
    # /work with many files: the snapshot's copy takes long enough to be interrupted.
    fill = (
        "mkdir -p /work/many && for i in $(seq 1 3000); do echo $i > /work/many/f$i; done; "
        "exec python3 -m http.server 8000 --directory /srv/www"
    )
    try:
        for _round in range(rounds):
            for phase in ("snapshot", "children"):
                with start_server(state, cleanup=False) as srv, api(srv) as c:
                    parent = ok(
                        c.post(
                            "/v1/sandboxes",
                            json={
                                "image": STANDIN,
                                "command": ["sh", "-c", fill],
                                "egress": "allow",
                            },
                        )
                    )
                    parents += 1
                    thread, outcome = _fork_in_background(c, parent["id"], 4)
                    assert srv.proc is not None
                    _kill_during(state, srv.proc, phase)
                    thread.join()
                    assert "error" in outcome, outcome  # the server died before answering
                with start_server(state, cleanup=False) as srv:
                    with api(srv) as c:
                        envs = existing_envs(c)
                        children += len(envs) - 1
                        got = ok(c.get(f"/v1/envs/{parent['id']}"), 200)
                        assert got["status"] == "healthy", got  # not left frozen by the snapshot
                        url = got["endpoints"][0]["url"]
                        answer = httpx.get(f"{url}/health", trust_env=False, timeout=10)
                        assert answer.status_code == 200
                        for env in envs:
                            if env["id"] != parent["id"]:
                                assert env["status"] in ("healthy", "failed"), env
                        delete_all(c)
                    assert not unreferenced_layers(state), unreferenced_layers(state)
                    line = assert_nothing_left(request, state, "after restart", quiet=True)
        orphans = (state / "server.log").read_text().count("left running by a server that died")
    finally:
        clean(state)  # whatever a failed round left behind
    left = line.split(", ", 1)[1]
    report(
        request,
        f"leaks: server killed -9 {2 * rounds} times mid-fork (snapshot and children), "
        f"{parents} parents and {children} children reconciled, {orphans} orphaned copies "
        f"killed, {left}",
    )
