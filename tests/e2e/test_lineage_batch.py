"""End to end (issue 15, items 3 and 4): warm starts of an image, batch creates, lineage, diff.

On the real server and engine, with the stdlib probe app (GET/PUT /files/<name> on /work).
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import LocalDenv
from provider_helpers import PROBE_APP, PROBE_IMAGE

from denv import (
    AsyncDenv,
    Denv,
    Env,
    EnvStatus,
    FileChangeKind,
    InvalidRequest,
    NotFound,
    Version,
)

pytestmark = pytest.mark.e2e

PROBE = ["python3", "-c", PROBE_APP]


@pytest.fixture
def denv(denv_server: LocalDenv) -> Iterator[Denv]:
    with Denv(denv_server.url, denv_server.key) as client:
        yield client


def url(env: Env) -> str:
    return str(env.endpoints[0].url).rstrip("/")


def put(env: Env, name: str, body: str) -> None:
    r = httpx.put(f"{url(env)}/files/{name}", content=body, trust_env=False, timeout=30)
    assert r.status_code == 201, r.text


def get(env: Env, name: str) -> str:
    r = httpx.get(f"{url(env)}/files/{name}", trust_env=False, timeout=30)
    assert r.status_code == 200, r.text
    return r.text


def in_env(env: Env, *cmd: str) -> None:
    cid = subprocess.run(
        ["docker", "ps", "-q", "--filter", f"label=denv.env={env.id}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[0]
    subprocess.run(["docker", "exec", cid, *cmd], check=True)


def wait_spares(denv: Denv, env_id: str, n: int) -> None:
    deadline = time.monotonic() + 300
    while (pool := denv.warm_pool(env_id)).ready < n:
        assert str(pool.state) != "stalled", pool
        assert time.monotonic() < deadline, f"spares not ready in 300 s: {pool}"
        time.sleep(0.25)


def test_a_create_of_the_same_image_takes_a_ready_spare(denv: Denv) -> None:
    first = denv.create_sandbox(PROBE_IMAGE, command=PROBE, warm=2, warm_fork=True)
    made = [first.id]
    try:
        assert first.start == "cold"
        wait_spares(denv, first.id, 2)
        warm = denv.create_sandbox(PROBE_IMAGE, command=PROBE, warm_fork=True)
        made.append(warm.id)
        assert (warm.start, warm.status) == ("warm", EnvStatus.HEALTHY)
        # The spare got a volume of its own, seeded from the image like a cold start's.
        put(warm, "mine.txt", "only here")
        assert get(warm, "mine.txt") == "only here"
        assert httpx.get(f"{url(first)}/files/mine.txt", trust_env=False).status_code == 404
        # Another configuration (other command) or no warm_fork declared: cold.
        other = denv.create_sandbox(PROBE_IMAGE, command=[*PROBE, "8000"], warm_fork=True)
        made.append(other.id)
        undeclared = denv.create_sandbox(PROBE_IMAGE, command=PROBE)
        made.append(undeclared.id)
        assert (other.start, undeclared.start) == ("cold", "cold")
    finally:
        for env_id in made:
            denv.delete_env(env_id)


def test_a_batch_reports_each_env_on_its_own(denv: Denv) -> None:
    # Each env decides by its own hostname (its container id): odd ones exit, even ones serve.
    script = (
        "import socket, sys; h = socket.gethostname(); print('host', h, flush=True); "
        "open('/work/host', 'w').write(h); sys.exit(3) if int(h[-1], 16) % 2 else None; "
        "exec(sys.argv.pop(1))"
    )
    envs = denv.create_sandboxes(
        PROBE_IMAGE, 6, command=["python3", "-c", script, PROBE_APP], wait_timeout_s=120
    )
    try:
        assert len({e.id for e in envs}) == 6
        for env in envs:
            if env.status is EnvStatus.FAILED:
                assert env.error is not None and str(env.error.code) == "exited"
                (line,) = [x for x in env.error.log_tail if x.startswith("host ")]
                assert int(line.split()[1][-1], 16) % 2 == 1
            else:
                assert env.status is EnvStatus.HEALTHY, env
                assert int(get(env, "host")[-1], 16) % 2 == 0
    finally:
        for env in envs:
            denv.delete_env(env.id)


def test_a_batch_above_the_request_limit_is_refused_whole(denv: Denv) -> None:
    before = {e.id for e in denv.list_envs()}
    with pytest.raises(InvalidRequest, match="count 33 is above the limit of 32"):
        denv.create_sandboxes(PROBE_IMAGE, 33, command=PROBE)
    assert {e.id for e in denv.list_envs()} == before


def test_lineage_and_diff(denv: Denv, denv_server: LocalDenv) -> None:
    root = denv.create_sandbox(PROBE_IMAGE, command=PROBE)
    put(root, "a.txt", "one")
    put(root, "b.txt", "two")
    fork = denv.fork(root.id)
    (child,) = fork.envs
    put(child, "a.txt", "changed")
    put(child, "c.txt", "new")
    in_env(child, "rm", "/work/b.txt")
    later = denv.snapshot(child.id)
    try:
        v1 = fork.version
        assert (v1.parent_env_id, v1.parent_version_id) == (root.id, root.version_id)
        assert (later.parent_env_id, later.parent_version_id) == (child.id, v1.id)

        chain = denv.lineage(child.id)
        assert [x.id for x in chain] == [child.id, v1.id, root.id, root.version_id]
        assert [type(x) for x in chain] == [Env, Version, Env, Version]
        assert chain[-1].parent_env_id is None  # the root: the sandbox's implicit version
        assert [x.id for x in denv.lineage(later.id)] == [later.id, *[x.id for x in chain]]

        diff = denv.diff(v1.id, later.id)
        got = [(c.path, c.change, c.size, c.service) for c in diff.changes]
        assert got == [
            ("/work/a.txt", FileChangeKind.MODIFIED, len("changed"), "agent"),
            ("/work/b.txt", FileChangeKind.DELETED, len("two"), "agent"),
            ("/work/c.txt", FileChangeKind.ADDED, len("new"), "agent"),
        ]
        assert not diff.truncated
        back = denv.diff(later.id, v1.id)
        assert [str(c.change) for c in back.changes] == ["modified", "added", "deleted"]
        assert denv.diff(v1.id, v1.id).changes == []

        async def same_through_asyncdenv() -> tuple[list[Any], Any]:
            async with AsyncDenv(denv_server.url, denv_server.key) as adenv:
                return await adenv.lineage(child.id), await adenv.diff(v1.id, later.id)

        async_chain, async_diff = asyncio.run(same_through_asyncdenv())
        assert [x.id for x in async_chain] == [x.id for x in chain]
        assert async_diff == diff

        with pytest.raises(NotFound):
            denv.diff(v1.id, "ver_00000000000000000000000000")
        with pytest.raises(NotFound):
            denv.lineage("env_00000000000000000000000000")
        with pytest.raises(ValueError, match=r"env id .* or a version id"):
            denv.lineage("nonsense")
    finally:
        for env_id in (child.id, root.id):
            denv.delete_env(env_id)
        denv.delete_version(later.id)
        denv.delete_version(fork.version.id)
