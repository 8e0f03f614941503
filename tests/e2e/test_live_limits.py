"""End to end: each live env holds an env's limits of its own (memory, pids), as a container.

A server of its own with small limits (--env-memory 256 --env-pids 64) runs a tiny ASGI app
live (an image FROM the echo image: /alloc/MB keeps MB of written memory, /threads/N starts
up to N threads and says how many started). One child that allocates past its memory is
killed alone, and its record says it ran out of memory; a sibling that starts threads until
its pids limit stops it leaves the parent able to start its own; the others keep serving.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx
import pytest
from conftest import Clients, LocalDenv, start_server
from provider_helpers import ECHO_IMAGE

pytestmark = pytest.mark.e2e

IMAGE = "denv-live-limits:test"
APP = """
import threading, time

HELD = []


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    path = scope["path"].strip("/").split("/")
    body = b"ok"
    if path[0] == "alloc":
        HELD.append(bytearray(b"\\x01") * (int(path[1]) << 20))  # written: resident
    elif path[0] == "threads":
        started = 0
        for _ in range(int(path[1])):
            try:
                threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
            except RuntimeError:
                break
            started += 1
        body = str(started).encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})
"""


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    with tempfile.TemporaryDirectory() as ctx:
        Path(ctx, "limits_app.py").write_text(APP)
        Path(ctx, "Dockerfile").write_text(
            f"FROM {ECHO_IMAGE}\nCOPY limits_app.py /app/limits_app.py\n"
            'CMD ["uvicorn", "limits_app:app", "--host", "0.0.0.0", "--port", "8000"]\n'
        )
        subprocess.run(["docker", "build", "-q", "-t", IMAGE, ctx], check=True, capture_output=True)
    try:
        state = tmp_path_factory.mktemp("limits-state")
        with start_server(state, "--env-memory", "256", "--env-pids", "64") as server:
            yield server
    finally:
        subprocess.run(["docker", "image", "rm", "-f", IMAGE], capture_output=True)


def memory_limit_mib(group: str) -> int:
    cid = docker.from_env().containers.list(filters={"label": f"denv.env={group}"})[0].id
    # in Docker's default parent or in the group of the env's API key (cgroups.key_parent)
    raw = next(Path("/sys/fs/cgroup/memory").glob(f"*/{cid}/memory.limit_in_bytes")).read_text()
    return int(raw) >> 20


def get(url: str, path: str) -> httpx.Response:
    return httpx.get(f"{url.rstrip('/')}/{path}", timeout=30)


def test_one_child_out_of_memory_or_pids_fails_alone(limited: LocalDenv, clients: Clients) -> None:
    d = clients(limited)
    parent = d.create_sandbox(IMAGE, live=True)
    ids = [parent.id]
    try:
        kids = d.fork(parent.id, 2, kind="live").envs
        ids += [k.id for k in kids]
        url = {e.id: e.endpoints[0].url for e in [parent, *kids]}
        # The container may hold what 3 envs' containers could, beside its own processes.
        assert memory_limit_mib(parent.id) == 4 * 256
        hog, other = kids[0].id, kids[1].id

        # Past 256 MiB: killed mid-request (the ingress answers 502, or drops it).
        with contextlib.suppress(httpx.HTTPError):
            assert get(url[hog], "alloc/400").status_code == 502
        deadline = time.monotonic() + 30
        while (rec := d.get_env(hog)).status != "failed":
            assert time.monotonic() < deadline, rec.status
            time.sleep(0.2)
        assert rec.error is not None and "out of memory (its limit 256 MiB)" in rec.error.message
        assert get(url[other], "alloc/100").status_code == 200  # its own 256 MiB
        assert get(url[parent.id], "health").status_code == 200

        capped = int(get(url[other], "threads/200").text)
        assert 0 < capped < 64  # its pids limit stopped it
        assert int(get(url[parent.id], "threads/20").text) == 20  # the parent's are its own
        assert d.get_env(other).status == "healthy" and d.get_env(parent.id).status == "healthy"
        d.delete_env(hog)  # its share goes with it
        assert memory_limit_mib(parent.id) == 3 * 256
    finally:
        for env_id in ids:
            d.delete_env(env_id)
