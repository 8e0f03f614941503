"""End to end: live forks of envs with the shapes real OpenEnv envs have.

The shapes env (envs/shapes, `make image-shapes`) depends on `uvicorn[standard]`, as most of
OpenEnv's envs do, so uvicorn's default loop is uvloop and its HTTP parser httptools. One image
per start form is built FROM it here (metadata layers: seconds): the image's own exec-form CMD,
shell-form `python -m uvicorn ... --port ${PORT:-8000}`, `sh -c "cd /app && uvicorn ...
--loop uvloop"`, a single-session env (`max_concurrent_envs=1`) whose environment takes
longer to build than the provider's WebSocket probe may take, and servers of several workers
(`gunicorn -w 4 -k uvicorn.workers.UvicornWorker`, `uvicorn --workers 2`), whose children
each serve with as many workers (copies of the worker the root's session was on). Each
starts through DenvProvider with no option set, is stepped, forked with defaults, and each
child continues the root's episode. Before the launcher served on asyncio's loop, every
uvloop child died ~12 s after its fork (tests/e2e/test_zygotes.py starts the image again:
copies of its zygote). Before the readiness probe opened no session, the single-session
env's only session was the probe's when the user's first `reset()` came (CAPACITY_REACHED).
Before workers were copied, a multi-worker server forked by booting (fork(4) of
`gunicorn -w 4`: 44 s).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import LocalDenv
from denv.openenv import DenvProvider, fork_clients
from live_procs import live_pids
from openenv.core import GenericEnvClient
from provider_helpers import TEST_TAG, delete_all, derived_images, message, state_of

from denv import Denv

pytestmark = pytest.mark.e2e

SHAPES_IMAGE = "denv-shapes-env:latest"
APP = "shapes_env.app:app"
# Longer than the provider's WebSocket probe may take (WS_PROBE_MAX_S, 10 s): a probe that
# opened a session would still hold the env's only one when the user's reset() comes.
SLOW_INIT_S = 12
# (tag, Dockerfile lines after FROM the shapes image); "exec" is the image itself.
FORMS = {
    "exec": [],
    "shell-python-m": [
        f"CMD python -m uvicorn {APP} --host 0.0.0.0 --port ${{PORT:-8000}} --proxy-headers"
        " --forwarded-allow-ips '*'"
    ],
    "sh-c-loop-uvloop": [
        f'CMD ["sh", "-c", "cd /app && uvicorn {APP} --host 0.0.0.0 --port 8000 --loop uvloop"]'
    ],
    "single-session-slow": [f"ENV MAX_SESSIONS=1 INIT_DELAY_S={SLOW_INIT_S}"],
    "gunicorn-w4": [
        'CMD ["gunicorn", "-w", "4", "-k", "uvicorn.workers.UvicornWorker", "-b", "0.0.0.0:8000",'
        f' "--chdir", "/app", "{APP}"]'
    ],
    "uvicorn-workers-2": [
        f'CMD ["uvicorn", "{APP}", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]'
    ],
}
# Worker processes each live child of a multi-worker shape must run, as its root does.
WORKERS = {"gunicorn-w4": 4, "uvicorn-workers-2": 2}


def image(tag: str) -> str:
    return SHAPES_IMAGE if tag == "exec" else f"denv-live-shape-{tag}:{TEST_TAG}"


@pytest.fixture(scope="module")
def shape_images() -> Iterator[None]:
    with derived_images(SHAPES_IMAGE, {image(t): lines for t, lines in FORMS.items()}):
        yield


def provider(server: LocalDenv) -> DenvProvider:
    return DenvProvider(server=server.url, api_key=server.key)  # no option: the defaults


def episode(client: Any) -> dict[str, Any]:
    """What a child must continue: the episode in memory and its step count."""
    state = state_of(client)
    return {k: state[k] for k in ("episode_id", "step_count", "messages")}


@pytest.mark.parametrize("tag", list(FORMS))
def test_each_shape_runs_live_and_forks(
    denv_server: LocalDenv, shape_images: None, tag: str
) -> None:
    p = provider(denv_server)
    root = GenericEnvClient.from_docker_image(image(tag), provider=p).sync()
    ids = [p.env_id or ""]
    try:
        with root:
            root.reset()  # the single-session env: the user's session, not the probe's
            for i in range(3):
                root.step(message(f"{tag} prefix {i}"))
            children = fork_clients(root, 2)
            ids += [c.provider.env_id or "" for c in children]
            with Denv(denv_server.url, denv_server.key) as d:
                env = d.get_env(ids[0])
                assert env.live, f"{tag}: not live: {env.live_unsupported}"
                assert [str(d.get_env(i).start) for i in ids[1:]] == ["live", "live"]
            want = episode(root)
            assert want["step_count"] == 3
            for child_id in ids[1:]:  # each child serves with as many workers as its root
                assert len(live_pids(child_id)) == WORKERS.get(tag, 1), tag
            for n, child in enumerate(children):
                with child:
                    assert episode(child) == want
                    obs = child.step(message(f"child {n}")).observation
                    assert obs["messages"] == [*want["messages"], f"child {n}"]
                    assert episode(child)["step_count"] == 4
                    # NumPy's OpenBLAS threads: a copy has none of its parent's (it hung)
                    obs = child.step(message("matmul")).observation
                    assert obs["echoed_message"] == "matmul 600"
            assert episode(root) == want  # the children's steps are their own
    finally:
        delete_all(denv_server, ids)


# Every folder an env may keep its work in outside /work (FILE_DIRS of the shapes env).
FILE_DIRS = "/workspace,/tmp/shapes,/root/shapes,/app/shapes"


def lines(client: Any) -> dict[str, list[str]]:
    """Each episode.log's lines, as the env read them back."""
    return dict(state_of(client)["files"])


def plus(files: dict[str, list[str]], line: str) -> dict[str, list[str]]:
    return {path: [*got, line] for path, got in files.items()}


def test_children_fork_files_outside_work(denv_server: LocalDenv) -> None:
    """Each live child starts with the root's files as of the fork (written under
    /workspace, /tmp, /root and /app before it), and from then on the root, each child and a
    grandchild see only their own writes: files fork exactly like memory."""
    p = provider(denv_server)
    root = GenericEnvClient.from_docker_image(
        SHAPES_IMAGE, provider=p, env_vars={"FILE_DIRS": FILE_DIRS}
    ).sync()
    ids = [p.env_id or ""]
    try:
        with root:
            root.reset()
            for i in range(2):
                root.step(message(f"prefix {i}"))
            at_fork = lines(root)
            assert sorted(at_fork) == sorted(f"{d}/episode.log" for d in FILE_DIRS.split(","))
            assert all(got == ["prefix 0", "prefix 1"] for got in at_fork.values())
            children = fork_clients(root, 2)
            ids += [c.provider.env_id or "" for c in children]
            with Denv(denv_server.url, denv_server.key) as d:
                assert [str(d.get_env(i).start) for i in ids[1:]] == ["live", "live"]
            for child in children:
                assert lines(child) == at_fork
            # Each writes its own line after the fork; nobody sees anyone else's.
            root.step(message("root"))
            for n, child in enumerate(children):
                child.step(message(f"child {n}"))
            assert lines(root) == plus(at_fork, "root")
            for n, child in enumerate(children):
                assert lines(child) == plus(at_fork, f"child {n}")
                assert episode(child)["messages"] == ["prefix 0", "prefix 1", f"child {n}"]
            # A grandchild: the child's files as of its fork, then its own.
            child_at_fork = lines(children[0])
            (grand,) = fork_clients(children[0], 1)
            ids.append(grand.provider.env_id or "")
            with grand:
                assert lines(grand) == child_at_fork
                grand.step(message("grandchild"))
                children[0].step(message("child 0 again"))
                assert lines(grand) == plus(child_at_fork, "grandchild")
                assert lines(children[0]) == plus(child_at_fork, "child 0 again")
                assert lines(children[1]) == plus(at_fork, "child 1")
                assert lines(root) == plus(at_fork, "root")
            for child in children:
                child.close()
    finally:
        delete_all(denv_server, ids)
    # Nothing of their root filesystems is left mounted on the host.
    envs = str(denv_server.state_dir / "envs")
    with open("/proc/self/mountinfo") as f:
        left = [line.split()[4] for line in f if any(f"{envs}/{i}" in line for i in ids)]
    assert left == []


def test_each_fork_gives_the_files_as_of_that_fork(denv_server: LocalDenv) -> None:
    """A root forked again: its children get its files as of their own fork, the same copy
    while the root wrote nothing in between, a new one once it has (the node keeps the
    last copy of a parent's changes while they stay the same)."""
    p = provider(denv_server)
    root = GenericEnvClient.from_docker_image(SHAPES_IMAGE, provider=p).sync()
    ids = [p.env_id or ""]
    try:
        with root:
            root.reset()
            root.step(message("one"))
            time.sleep(0.3)  # settled: the next forks may share one copy of the root's files
            first = lines(root)
            for n in range(2):
                (child,) = fork_clients(root, 1)
                ids.append(child.provider.env_id or "")
                with child:
                    assert lines(child) == first
                    child.step(message(f"child {n}"))
                    assert lines(child) == plus(first, f"child {n}")
            assert lines(root) == first
            root.step(message("two"))
            (child,) = fork_clients(root, 1)
            ids.append(child.provider.env_id or "")
            with child:
                assert lines(child) == plus(first, "two")
            # The children's copies went with them: only the root's last one is kept, for
            # its next fork.
            copies = denv_server.state_dir / "envs" / ids[0] / "rootfs"
            deadline = time.monotonic() + 10
            while len(list(copies.glob("c-*"))) > 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(list(copies.glob("c-*"))) == 1
    finally:
        delete_all(denv_server, ids)
