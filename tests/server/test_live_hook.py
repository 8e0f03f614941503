"""The live launcher's start-up hook, on the host with real uvicorn and gunicorn: however an
image starts its server (the start forms of OpenEnv's Dockerfiles), the process in which
uvicorn serves takes the launcher on, and the forms that cannot be copied say why.

Each row runs the form as a real process tree with the hook's environment (what the
container's pid 1 gives the image's command: PYTHONPATH and DENV_LIVE_HOOK), a control
directory of its own instead of the container's /.denv/ctl, and a tiny ASGI app. No Docker:
the forks themselves are tested on the engine (tests/e2e/test_live_start_forms.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from denv.server.docker.live.launcher_ctl import LAUNCHER_DIR

APP = """
async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})
"""
BIN = str(Path(sys.executable).parent)  # uvicorn and gunicorn of the test venv
UVICORN = "uvicorn app:app --host 127.0.0.1 --port {port}"
GUNICORN = "gunicorn -k uvicorn.workers.UvicornWorker -b 127.0.0.1:{port} --chdir {dir} app:app"

# (id, shell command or argv, what the hook must make of it). The shapes are those of
# OpenEnv's own Dockerfiles (envs/*/server/Dockerfile in huggingface/OpenEnv).
SERVED = [
    ("sh -c cd && uvicorn", f"cd {{dir}} && {UVICORN}"),
    ("sh -c cd && exec uvicorn", f"cd {{dir}} && exec {UVICORN}"),
    (
        "python -m uvicorn, ${PORT:-8000}",
        "exec python -m uvicorn app:app --app-dir {dir} --host 127.0.0.1 --port ${PORT:-8000}"
        " --proxy-headers --forwarded-allow-ips '*'",
    ),
    ("a start script ending in uvicorn", "{dir}/start.sh"),
    ("gunicorn with one UvicornWorker", f"cd {{dir}} && {GUNICORN} -w 1"),
    ("--workers ${WORKERS} with WORKERS=1", f"cd {{dir}} && {UVICORN} --workers $WORKERS"),
    # uvicorn[standard] (this venv has uvloop and httptools, so every form above runs on
    # them by default): the hook serves on asyncio's loop, whatever --loop asked.
    ("--loop uvloop --http httptools", f"cd {{dir}} && {UVICORN} --loop uvloop --http httptools"),
]
# An app that installs uvloop's policy itself, served with --loop none (the policy's loop).
UVLOOP_POLICY_APP = (
    "import asyncio, uvloop\nasyncio.set_event_loop_policy(uvloop.EventLoopPolicy())\n"
)
# Servers of several workers: every worker takes the launcher on, the first on ctl.sock, the
# others each on ctl.<pid>.sock (a fork is made from the worker whose session was last active).
WORKERS = [
    ("uvicorn --workers 3", f"cd {{dir}} && {UVICORN} --workers 3", 3),
    ("gunicorn -w 3", f"cd {{dir}} && {GUNICORN} -w 3", 3),
]
REFUSED = [
    ("uvicorn --reload", f"cd {{dir}} && {UVICORN} --reload", "--reload"),
    (
        "uvloop installed by the app",
        f"cd {{dir}} && {UVICORN.replace('app:app', 'policy_app:app')} --loop none",
        "the server's event loop is uvloop.Loop, not asyncio's selector loop",
    ),
]


class Run:
    def __init__(self, form: str, port: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="dl-", dir="/tmp"))  # short: a unix socket
        self.ctl = self.dir / "ctl"
        self.ctl.mkdir(mode=0o700)
        (self.dir / "app.py").write_text(APP)
        (self.dir / "policy_app.py").write_text(UVLOOP_POLICY_APP + APP)
        start = self.dir / "start.sh"
        uvicorn = UVICORN.replace("{port}", str(port))
        start.write_text(f"#!/bin/sh\nset -e\necho starting\ncd {self.dir}\n{uvicorn}\n")
        start.chmod(0o755)
        self.port = port
        env = {
            **os.environ,
            "PATH": f"{BIN}:{os.environ['PATH']}",
            "PYTHONPATH": str(LAUNCHER_DIR),
            "DENV_LIVE_HOOK": "1",
            "DENV_LIVE_CTL_DIR": str(self.ctl),
            "PORT": str(port),
            "WORKERS": "1",
        }
        command = form.replace("{dir}", str(self.dir)).replace("{port}", str(port))
        self.proc = subprocess.Popen(
            ["sh", "-c", command],
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def wait_for(self, name: str, timeout_s: float = 20.0) -> Path:
        path = self.ctl / name
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            if self.proc.poll() is not None:
                raise AssertionError(f"the server ended: {self.stderr()}")
            assert time.monotonic() < deadline, f"no {name} after {timeout_s} s: {self.stderr()}"
            time.sleep(0.05)
        return path

    def get(self) -> bytes:
        deadline = time.monotonic() + 20.0
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/", timeout=5) as r:
                    body: bytes = r.read()
                    return body
            except OSError:
                assert time.monotonic() < deadline, self.stderr()
                time.sleep(0.05)

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        assert self.proc.stderr is not None
        return self.proc.stderr.read().decode(errors="replace")[-2000:]

    def close(self) -> None:
        with_group = self.proc.poll() is None
        if with_group:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def run() -> Iterator[type[Run]]:
    runs: list[Run] = []

    class Tracked(Run):
        def __init__(self, form: str) -> None:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            super().__init__(form, port)
            runs.append(self)

    yield Tracked
    for r in runs:
        r.close()


def descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").iterdir():
            kids = {int(k) for k in (task / "children").read_text().split()}
            todo.extend(kids - found)
            found |= kids
    return found


@pytest.mark.parametrize(("form_id", "form"), SERVED, ids=[f[0] for f in SERVED])
def test_the_process_where_uvicorn_serves_takes_the_launcher_on(
    run: type[Run], form_id: str, form: str
) -> None:
    r = run(form)
    sock_path = r.wait_for("ctl.sock")
    assert r.get() == b"ok"  # served through the gate, on the image's own port
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(sock_path))
        cred = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        peer = struct.unpack("3i", cred)[0]
        s.sendall(b'{"op": "hello"}\n')
        hello = json.loads(s.makefile().readline())
    assert hello["pid"] == peer
    assert peer == r.proc.pid or peer in descendants(r.proc.pid)
    assert (r.ctl / "server").read_text() == str(peer)
    assert not (r.ctl / "refused").exists()
    assert hello["unknown_threads"] == []  # a fork would be allowed
    assert hello["loop"] == "_UnixSelectorEventLoop"  # asyncio's, which a fork can copy


@pytest.mark.parametrize(("form_id", "form", "words"), REFUSED, ids=[f[0] for f in REFUSED])
def test_servers_that_cannot_be_copied_serve_unchanged_and_say_why(
    run: type[Run], form_id: str, form: str, words: str
) -> None:
    r = run(form)
    why = r.wait_for("refused").read_text()
    assert words in why, why
    assert r.get() == b"ok"  # the env still serves: only live forks are off
    assert not (r.ctl / "ctl.sock").exists()


@pytest.mark.parametrize(("form_id", "form", "n"), WORKERS, ids=[f[0] for f in WORKERS])
def test_every_worker_of_a_multi_worker_server_takes_the_launcher_on(
    run: type[Run], form_id: str, form: str, n: int
) -> None:
    r = run(form)
    r.wait_for("ctl.sock")
    deadline = time.monotonic() + 30
    while len(socks := sorted(r.ctl.glob("ctl*.sock"))) < n:
        assert time.monotonic() < deadline, f"{socks}: {r.stderr()}"
        time.sleep(0.05)
    assert r.get() == b"ok"
    assert not (r.ctl / "refused").exists()
    peers = set()
    for path in socks:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(path))
            cred = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            peers.add(struct.unpack("3i", cred)[0])
            s.sendall(b'{"op": "hello"}\n')
            hello = json.loads(s.makefile().readline())
        assert hello["workers"] == n and hello["last_active"] == 0.0  # no session yet
        assert hello["unknown_threads"] == []  # uvicorn's health-check thread is known
        assert path.name == "ctl.sock" or path.name == f"ctl.{hello['pid']}.sock"
    assert len(peers) == n and peers <= descendants(r.proc.pid)


def test_a_server_that_is_not_uvicorn_is_left_alone(run: type[Run]) -> None:
    r = run("cd {dir} && exec python -m http.server --bind 127.0.0.1 {port}")
    r.get()
    time.sleep(0.5)
    assert sorted(p.name for p in r.ctl.iterdir()) == []


def test_the_images_own_sitecustomize_still_runs(run: type[Run]) -> None:
    own = Path(tempfile.mkdtemp(prefix="dl-own-", dir="/tmp"))
    try:
        marker = own / "ran"
        (own / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
        r = run(f"PYTHONPATH=$PYTHONPATH:{own} exec python -c 'import sys'")
        r.proc.wait(20)
        assert marker.exists()
    finally:
        shutil.rmtree(own)
