"""Shared pieces of the DenvProvider end-to-end tests (tests/e2e/test_provider*.py)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docker
from conftest import LocalDenv
from live_procs import live_pid as live_pid  # where the e2e modules import it from

from denv import Denv

ECHO_IMAGE = "denv-echo-env:latest"
#: The tag of the images a test process builds for itself (``derived_images``): its own, so
#: that two pytest processes of one run (make test's lanes: the source tree and the installed
#: wheel) never remove each other's.
TEST_TAG = f"test-{os.getpid()}"
PROBE_IMAGE = "denv-base-probe:latest"
#: The stdlib app the probe image runs (`python3 -c PROBE_APP`): /health, /files/<name>.
PROBE_APP = (Path(__file__).parent / "probe_app.py").read_text()


def message(text: str) -> dict[str, str]:
    """A plain echo step."""
    return {"message": text}


def state_of(client: Any) -> dict[str, Any]:
    state = client.state()
    return dict(state.model_dump() if hasattr(state, "model_dump") else state)


def assert_gone(server: LocalDenv, env_ids: Iterable[str]) -> None:
    """Each env is deleted on the server and has no container left on the engine."""
    ids = [env_id for env_id in env_ids if env_id]
    assert ids, "no env ids to check"
    with Denv(server.url, server.key) as denv:
        for env_id in ids:
            assert str(denv.get_env(env_id).status) == "deleted", env_id
    for env_id in ids:
        out = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=denv.env={env_id}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert out == [], f"containers of {env_id} left: {out}"


def container_pid_of(env_id: str) -> int:
    """The host pid of the running container of ``env_id`` (its one container)."""
    found = docker.from_env().containers.list(filters={"label": f"denv.env={env_id}"})
    assert len(found) == 1, found
    return int(found[0].attrs["State"]["Pid"])


def live_env_ids(server: LocalDenv, label: tuple[str, str]) -> list[str]:
    """Envs carrying `label` that are not deleted."""
    key, value = label
    with Denv(server.url, server.key) as denv:
        return [
            env.id
            for env in denv.list_envs()
            if str(env.status) != "deleted" and env.labels.get(key) == value
        ]


@contextmanager
def derived_images(
    base: str, forms: dict[str, list[str]], files: dict[str, str] | None = None
) -> Iterator[None]:
    """Build one image per ``forms`` item (its tag: Dockerfile lines after ``FROM base``, in
    a context holding ``files``, each executable), and remove them all on exit. Forms
    with no lines are skipped (the base image itself)."""
    built: list[str] = []
    try:
        for tag, lines in forms.items():
            if not lines:
                continue
            with tempfile.TemporaryDirectory() as ctx:
                for name, text in (files or {}).items():
                    Path(ctx, name).write_text(text)
                    Path(ctx, name).chmod(0o755)
                Path(ctx, "Dockerfile").write_text("\n".join([f"FROM {base}", *lines]))
                subprocess.run(
                    ["docker", "build", "-q", "-t", tag, ctx],
                    check=True,
                    capture_output=True,
                    env={"DOCKER_BUILDKIT": "0", "PATH": "/usr/local/bin:/usr/bin:/bin"},
                )
            built.append(tag)
        yield
    finally:
        if built:
            subprocess.run(["docker", "image", "rm", "-f", *built], capture_output=True)


def delete_all(server: LocalDenv, ids: list[str]) -> None:
    """Delete the envs a test made (ids may hold "" for one that never started); none left."""
    with Denv(server.url, server.key) as d:
        for env_id in ids:
            if env_id:
                d.delete_env(env_id)
    assert_gone(server, ids)
