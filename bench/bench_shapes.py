"""Server shapes real envs have (issue 43): start and fork(4) per shape, beside LocalDocker.

One image per shape, built here FROM the shapes env (envs/shapes: uvicorn[standard], so uvloop
and httptools; `make image-shapes`), as tests/e2e/test_live_shapes.py builds them. For each
shape, rounds alternate, each on the same machine state:

- ``denv``: `GenericEnvClient.from_docker_image(image, provider=DenvProvider())` (no option:
  live auto, zygotes on, as users get it) to its first `reset()` answered, then closed. The
  first round boots; later ones copy the zygote the first left behind where the shape runs
  live.
- ``local``: the same with OpenEnv's `LocalDockerProvider` (its readiness wait given the
  limit denv's has, not its fixed 30 s).
- ``fork4``: a denv root stepped 3 times, `fork_clients(root, 4)`, each child's `state()`
  answered; the children closed outside the timing. The kind of fork is recorded (live, or
  volume for a shape that cannot be copied, with the server's reason).

Results: bench/results/shapes.json (medians in seconds, ratios local/denv). Nothing asserts
on time.

Run: ``python -m bench --only shapes`` (``make bench`` runs every benchmark; ``--quick`` and
``--smoke`` are smaller profiles: bench/__main__.py).
"""

from __future__ import annotations

import logging
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from denv.openenv import DenvProvider, fork_clients
from openenv.core import GenericEnvClient
from openenv.core.containers.runtime import LocalDockerProvider

from denv import Denv

from . import local_docker
from .bench_start import READY_TIMEOUT_S
from .harness import Bench, Server, ratio, remove_leftovers, start_server, stop_process, summarize

log = logging.getLogger("bench.shapes")

BASE = "denv-shapes-env:latest"
APP = "shapes_env.app:app"
# (shape, Dockerfile lines after FROM the shapes image); [] is the image as built.
SHAPES: dict[str, list[str]] = {
    "uvicorn exec (uvloop)": [],
    "python -m uvicorn, shell form ${PORT}": [
        f"CMD python -m uvicorn {APP} --host 0.0.0.0 --port ${{PORT:-8000}}"
    ],
    "single session (max_concurrent_envs=1)": ["ENV MAX_SESSIONS=1"],
    "gunicorn -w 4 -k UvicornWorker": [
        f'CMD ["gunicorn", "-w", "4", "-k", "uvicorn.workers.UvicornWorker", "-b", '
        f'"0.0.0.0:8000", "--chdir", "/app", "{APP}"]'
    ],
    "uvicorn --workers 2": [
        f'CMD ["uvicorn", "{APP}", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]'
    ],
}


def _tag(shape: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", shape.lower()).strip("-")
    return f"denv-bench-shape-{slug}:bench"


def _build(shape: str, lines: list[str]) -> str:
    if not lines:
        return BASE
    with tempfile.TemporaryDirectory() as ctx:
        Path(ctx, "Dockerfile").write_text("\n".join([f"FROM {BASE}", *lines]))
        subprocess.run(
            ["docker", "build", "-q", "-t", _tag(shape), ctx],
            check=True,
            capture_output=True,
            env={"DOCKER_BUILDKIT": "0", "PATH": "/usr/local/bin:/usr/bin:/bin"},
        )
    return _tag(shape)


def _provider(server: Server) -> DenvProvider:
    return DenvProvider(
        server=server.url, api_key=server.api_key, ttl_s=3600, timeout_s=READY_TIMEOUT_S
    )


def _denv_start(server: Server, image: str) -> tuple[float, str]:
    provider = _provider(server)
    t0 = time.perf_counter()
    client: Any = GenericEnvClient.from_docker_image(image, provider=provider).sync()
    client.reset()
    elapsed = time.perf_counter() - t0
    start = str(provider.start)
    client.close()
    return elapsed, start


def _local_start(image: str, run_id: str) -> float:
    """What `from_docker_image(image)` does with LocalDockerProvider (start, readiness, a
    client, its `reset()`), with denv's readiness limit instead of its fixed 30 s: a
    multi-worker shape on a busy machine takes longer."""
    provider = LocalDockerProvider()
    client: Any = None
    t0 = time.perf_counter()
    try:
        url = provider.start_container(image, env_vars=local_docker.marker(run_id))
        provider.wait_for_ready(url, timeout_s=READY_TIMEOUT_S)
        client = GenericEnvClient(base_url=url, provider=provider).sync()
        client.reset()
        return time.perf_counter() - t0
    finally:
        # Its close is `docker stop` with a 10 s limit, which a server holding a WebSocket
        # may outlast (TimeoutExpired): the container is removed either way.
        try:
            if client is not None:
                client.close()
        except Exception as exc:
            log.info("LocalDockerProvider's close failed (%s); removing its container", exc)
        local_docker.remove(image, run_id)


def _fork4(server: Server, image: str) -> dict[str, Any]:
    provider = _provider(server)
    with GenericEnvClient.from_docker_image(image, provider=provider).sync() as root:
        root.reset()
        for i in range(3):
            root.step({"message": f"prefix {i}"})
        t0 = time.perf_counter()
        children = fork_clients(root, 4)
        try:
            for child in children:
                child.state()
            elapsed = time.perf_counter() - t0
            kinds = sorted({str(c.provider.start) for c in children})
        finally:
            for child in children:
                child.close()
        with Denv(server.url, server.api_key) as d:
            env = d.get_env(provider.env_id or "")
        return {"s": elapsed, "kinds": kinds, "live": bool(env.live), "why": env.live_unsupported}


def run(b: Bench) -> dict[str, dict[str, Any]]:
    rounds = int(b.profile.shapes_rounds)
    first = int(b.profile.shapes_first)
    shapes = list(SHAPES.items())[:first] if first else list(SHAPES.items())
    state = Path(f"{b.server.state_dir}-shapes")
    server = start_server(state, ("--zygotes",))
    images: dict[str, str] = {}
    rows: dict[str, dict[str, Any]] = {}
    try:
        for shape, lines in shapes:
            images[shape] = _build(shape, lines)
        for shape, image in images.items():
            denv_s: list[float] = []
            local_s: list[float] = []
            fork_s: list[float] = []
            starts: list[str] = []
            last: dict[str, Any] = {}
            for i in range(rounds):
                b.settle(max_s=60)
                parts = ["denv", "local", "fork4"]
                for part in parts[i % 3 :] + parts[: i % 3]:
                    if part == "denv":
                        elapsed, start = _denv_start(server, image)
                        denv_s.append(elapsed)
                        starts.append(start)
                    elif part == "local":
                        local_s.append(_local_start(image, b.run_id))
                    else:
                        last = _fork4(server, image)
                        fork_s.append(last["s"])
            denv_med = summarize(denv_s)["median"]
            local_med = summarize(local_s)["median"]
            rows[shape] = {
                "image": image,
                "live": last.get("live"),
                "live_unsupported": last.get("why"),
                "fork4_kinds": last.get("kinds"),
                "denv_start": summarize(denv_s),
                "denv_starts": starts,
                "local_start": summarize(local_s),
                "fork4": summarize(fork_s),
                "local_over_denv_start_median": ratio(local_med, denv_med),
            }
            log.info(
                "%s: start denv %.2f s (%s), local %.2f s; fork(4) %.2f s (%s)",
                shape,
                denv_med,
                ",".join(starts),
                local_med,
                summarize(fork_s)["median"],
                ",".join(last.get("kinds") or []),
            )
    finally:
        stop_process(server.proc)
        remove_leftovers(state)
        built = [i for i in images.values() if i != BASE]
        if built:
            subprocess.run(["docker", "image", "rm", "-f", *built], capture_output=True)
    return {
        "shapes": {
            "what": "start to first reset() answered (denv with defaults, zygotes on; "
            "OpenEnv's LocalDockerProvider), and fork(4) of a stepped root to 4 state() "
            "answers, seconds",
            "rounds": rounds,
            "shapes": rows,
        }
    }
