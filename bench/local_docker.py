"""OpenEnv's LocalDockerProvider as the benchmarks run it: the alternative denv is measured against.

Its container's name and id are its private state, so the benchmarks find its containers
from the outside instead: every start passes ``env_vars=marker(run_id)``, and
``remove(image, run_id)`` deletes whatever carries that run's marker (a stop that timed out,
a start that was interrupted). The variable is the only difference to a user's start.

It names a container after the image's name and the current millisecond, so starts at once
collide ("name already in use"); ``tags(image, run_id, n)`` gives each concurrent start a tag
of its own of the same image (same id: same bytes, nothing pulled).

Not run on its own: bench_start, bench_trainer, bench_shapes and the harness
import it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

from .measure import sh

#: The environment variable every LocalDockerProvider start of a run carries (its run id).
MARKER = "DENV_BENCH_LOCAL"


def marker(run_id: str) -> dict[str, str]:
    """The `env_vars` of a LocalDockerProvider start of run `run_id`."""
    return {MARKER: run_id}


def containers(image: str, run_id: str) -> list[str]:
    """Ids of the containers of `image` (running or not) started with `marker(run_id)`."""
    ids = sh("docker", "ps", "-aq", "--no-trunc", "--filter", f"ancestor={image}").split()
    if not ids:
        return []
    # One may be gone between the two calls: inspect then fails for it alone.
    found = sh("docker", "inspect", "--format", "{{.Id}} {{json .Config.Env}}", *ids, check=False)
    wanted = f"{MARKER}={run_id}"
    out: list[str] = []
    for line in found.splitlines():
        container, _, env = line.partition(" ")
        if wanted in (json.loads(env) or []):
            out.append(container)
    return out


def remove(image: str, run_id: str) -> int:
    """`docker rm -f` the containers `containers(image, run_id)`; how many."""
    ids = containers(image, run_id)
    if ids:
        sh("docker", "rm", "-f", *ids, check=False)
    return len(ids)


def tag_prefix(run_id: str) -> str:
    return f"denv-bench-local-{run_id}-"


@contextmanager
def tags(image: str, run_id: str, n: int) -> Iterator[list[str]]:
    """`n` tags of `image` of run `run_id`, removed on exit (only the tags: the image stays)."""
    names = [f"{tag_prefix(run_id)}{i}:latest" for i in range(n)]
    try:
        for name in names:
            sh("docker", "tag", image, name)
        yield names
    finally:
        remove_tags(run_id)


def remove_tags(run_id: str) -> None:
    """Untag every image tag `tags()` made for run `run_id`."""
    listed = sh(
        *("docker", "images", "--format", "{{.Repository}}:{{.Tag}}"),
        *("--filter", f"reference={tag_prefix(run_id)}*"),
        check=False,
    ).split()
    if listed:
        sh("docker", "image", "rm", *listed, check=False)
