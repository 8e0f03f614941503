"""End to end: envs of other shapes than the echo env under ``denv serve --isolation gvisor``
(issue 45).

Three envs start through DenvProvider on a gvisor server, reset, step three times and fork(4)
by snapshot of /work (the only fork under gvisor: each child boots from the copy):

- ``gunicorn -w 4``: the shapes env (envs/shapes) under ``gunicorn -w 4 -k UvicornWorker``,
  bench/bench_shapes.py's start form, keeping its episode log in /work (``FILE_DIRS``);
- ``node``: the node env (envs/node, ``make image-node``), Node.js from Debian's ``nodejs``,
  no Python in its server;
- ``shell script``: the echo image started by a shell script that sets up (writes a file,
  exports a variable) and then ``exec``s the image's own uvicorn command.

Each child holds what the env keeps in /work as the root had it at the fork, steps on its own
(a sibling's or the root's state does not move), and every container of root and children
runs under the runtime ``denv-runsc``. The node and script envs keep their whole episode in
/work, so each child's state equals the root's. The shapes env keeps its episode (id, step
count, messages) in the worker's memory, which a volume fork does not carry: its children
start a new episode (a step makes it step 1) and what carries is its log under /work. The
node env also forks on the session's runc server. Start and fork(4) times are printed
(``-s``); measured on 2 cores (ptrace platform), start then fork(4): gunicorn -w 4 26-28 s
and 93-106 s, node 1.0-1.3 s and 2.4-2.7 s, shell script 11-12 s and 24-40 s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
from conftest import LocalDenv, docker_engine, start_server
from denv.openenv import DenvProvider, fork_clients
from openenv.core import GenericEnvClient
from provider_helpers import ECHO_IMAGE, TEST_TAG, delete_all, derived_images, message, state_of

from denv import Denv
from denv.server.gvisor import runtime

pytestmark = pytest.mark.e2e

SHAPES_IMAGE = "denv-shapes-env:latest"
NODE_IMAGE = "denv-node-env:latest"
GUNICORN_IMAGE = f"denv-gvisor-gunicorn-w4:{TEST_TAG}"
SCRIPT_IMAGE = f"denv-gvisor-start-script:{TEST_TAG}"
# The shapes env's episode log, in /work so that a snapshot carries it.
SHAPES_LOG = "/work/shapes/episode.log"
# What the start script writes in every container it starts, from the variable it exported.
SCRIPT_MARK = "/etc/denv-start-script"
START_SCRIPT = (
    "#!/bin/sh\\n"
    "set -eu\\n"
    "export DENV_STARTED_BY=start.sh\\n"
    'echo "$DENV_STARTED_BY $(date +%%s)" >' + SCRIPT_MARK + "\\n"
    'exec uvicorn echo_env.app:app --host 0.0.0.0 --port "${PORT:-8000}"\\n'
)
# Dockerfile lines after FROM the shapes image: bench/bench_shapes.py's gunicorn start form.
GUNICORN_LINES = [
    f"ENV FILE_DIRS={Path(SHAPES_LOG).parent}",
    'CMD ["gunicorn", "-w", "4", "-k", "uvicorn.workers.UvicornWorker", "-b", "0.0.0.0:8000",'
    ' "--chdir", "/app", "shapes_env.app:app"]',
]
# Dockerfile lines after FROM the echo image, whose CMD is the script's last line's command.
SCRIPT_LINES = [
    f"RUN printf '{START_SCRIPT}' >/usr/local/bin/start.sh && chmod 755 /usr/local/bin/start.sh",
    'CMD ["/usr/local/bin/start.sh"]',
]
# A gunicorn master and its 4 workers, each booting OpenEnv under gVisor's ptrace platform,
# and then 4 such children at once on a small machine (93 s on 2 cores): more than the
# default 120 s, less than the test's own timeout.
READY_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Shape:
    image: str
    #: What a volume fork carries of the root's state: the part of it kept in /work.
    carried: Callable[[dict[str, Any]], Any]
    #: The step count a child reports after its first step of its own.
    child_steps: int


def echo_episode(state: dict[str, Any]) -> Any:
    return {k: state[k] for k in ("episode_id", "step_count", "last_message")}


def shapes_log(state: dict[str, Any]) -> Any:
    return state["files"][SHAPES_LOG]


SHAPES = {
    # The episode's count and messages are the worker's memory: a child's fresh server starts
    # a new episode (step_count 0); only the log under /work continues.
    "gunicorn -w 4": Shape(GUNICORN_IMAGE, shapes_log, 1),
    "node": Shape(NODE_IMAGE, echo_episode, 4),
    "shell script": Shape(SCRIPT_IMAGE, echo_episode, 4),
}


@pytest.fixture(scope="module")
def gvisor_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    docker_engine(SHAPES_IMAGE, NODE_IMAGE, ECHO_IMAGE)
    runtime.check(docker.from_env().info().get("Runtimes", {}))  # fails naming make gvisor's fix
    with (
        derived_images(SHAPES_IMAGE, {GUNICORN_IMAGE: GUNICORN_LINES}),
        derived_images(ECHO_IMAGE, {SCRIPT_IMAGE: SCRIPT_LINES}),
        start_server(tmp_path_factory.mktemp("denv-gvisor-shapes"), "--isolation", "gvisor") as srv,
    ):
        yield srv


def containers_of(env_ids: list[str]) -> dict[str, list[Any]]:
    engine = docker.from_env()
    return {
        env_id: engine.containers.list(all=True, filters={"label": f"denv.env={env_id}"})
        for env_id in env_ids
    }


def served_with_export(container: Any) -> str:
    """The command lines of the container's processes that have the start script's export."""
    found = container.exec_run(
        [
            "sh",
            "-c",
            "for e in $(grep -l DENV_STARTED_BY=start.sh /proc/[0-9]*/environ); do"
            " tr '\\0' ' ' <${e%environ}cmdline; echo; done",
        ]
    )
    return str(found.output.decode())


@pytest.mark.parametrize("name", list(SHAPES))
def test_each_shape_starts_steps_and_forks_under_gvisor(
    gvisor_server: LocalDenv, name: str
) -> None:
    start_step_fork(gvisor_server, name, runtime.RUNTIME)


def test_the_node_env_forks_on_runc_too(denv_server: LocalDenv) -> None:
    """The node env is no gVisor special: on the session's runc server it forks alike
    (by volume: its server is not uvicorn, so not live)."""
    start_step_fork(denv_server, "node", "runc")


def start_step_fork(server: LocalDenv, name: str, oci_runtime: str) -> None:
    """Start the env of shape `name` on `server`, reset, step 3 times, fork(4), and check
    the children: each holds the root's /work state, steps on its own, and runs (as the root
    does) under `oci_runtime`."""
    shape = SHAPES[name]
    p = DenvProvider(server=server.url, api_key=server.key, timeout_s=READY_TIMEOUT_S)
    began = time.monotonic()
    root = GenericEnvClient.from_docker_image(shape.image, provider=p).sync()
    started_s = time.monotonic() - began
    ids = [p.env_id or ""]
    try:
        with root:
            root.reset()
            for i in range(3):
                root.step(message(f"prefix {i}"))
            at_fork = state_of(root)
            began = time.monotonic()
            children = fork_clients(root, 4)
            forked_s = time.monotonic() - began
            ids += [c.provider.env_id or "" for c in children]
            print(f"{oci_runtime} {name}: start {started_s:.1f} s, fork(4) {forked_s:.1f} s")
            want = shape.carried(at_fork)
            try:
                assert [shape.carried(state_of(c)) for c in children] == [want] * 4, name
                # Each child's step is its own: the siblings not yet stepped and the root
                # stay as they were at the fork.
                for n, child in enumerate(children):
                    obs = child.step(message(f"child {n}")).observation
                    assert state_of(child)["step_count"] == shape.child_steps, (name, obs)
                    for sibling in children[n + 1 :]:
                        assert shape.carried(state_of(sibling)) == want, name
                assert state_of(root)["step_count"] == 3
                assert shape.carried(state_of(root)) == want
                found = containers_of(ids)
                runtimes = {i: [c.attrs["HostConfig"]["Runtime"] for c in found[i]] for i in ids}
                assert runtimes == {i: [oci_runtime] for i in ids}, runtimes
                if name == "shell script":  # the script ran in each container it started
                    for cs in found.values():
                        out = cs[0].exec_run(["cat", SCRIPT_MARK]).output.decode()
                        assert out.startswith("start.sh "), out
                        assert "uvicorn echo_env.app:app" in served_with_export(cs[0])
            finally:
                for child in children:
                    child.close()
    finally:
        delete_all(server, ids)


class Http:
    """OpenEnv's HTTP routes of one env through its ingress endpoint: no session held open
    (each request its own connection, closed), as a client between episodes leaves it."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        with httpx.Client(trust_env=False, timeout=READY_TIMEOUT_S) as http:
            res = http.request(method, self.url + path, json=body)
        assert res.status_code == 200, (path, res.status_code, res.text[:300])
        return res.json()

    def reset(self) -> Any:
        return self._call("POST", "/reset", {})

    def step(self, text: str) -> Any:
        return self._call("POST", "/step", {"action": message(text)})

    def state(self) -> dict[str, Any]:
        found: dict[str, Any] = self._call("GET", "/state")
        return found


@pytest.mark.parametrize("name", ["node", "shell script", "gunicorn -w 4"])
def test_each_shape_forks_by_restoring_its_sandbox_under_gvisor(
    gvisor_server: LocalDenv, name: str
) -> None:
    """With no session open, a fork of kind auto checkpoints the root's sandbox and each
    child resumes from it (``start`` is ``restored``, no boot): it holds the root's state,
    steps on its own and runs under ``denv-runsc``."""
    shape = SHAPES[name]
    ids: list[str] = []
    with Denv(gvisor_server.url, gvisor_server.key) as denv:
        try:
            began = time.monotonic()
            env = denv.create_sandbox(shape.image, wait="healthy", wait_timeout_s=READY_TIMEOUT_S)
            started_s = time.monotonic() - began
            ids.append(env.id)
            root = Http(env.endpoints[0].url)
            root.reset()
            for i in range(3):
                root.step(f"prefix {i}")
            want = shape.carried(root.state())
            began = time.monotonic()
            made = denv.fork(env.id, 4, kind="auto", wait="healthy", wait_timeout_s=READY_TIMEOUT_S)
            forked_s = time.monotonic() - began
            ids += [c.id for c in made.envs]
            print(f"gvisor {name}: start {started_s:.1f} s, fork(4) by restore {forked_s:.1f} s")
            assert [c.start for c in made.envs] == ["restored"] * 4, [c.start for c in made.envs]
            children = [Http(c.endpoints[0].url) for c in made.envs]
            assert [shape.carried(c.state()) for c in children] == [want] * 4, name
            children[0].step("child 0")
            assert shape.carried(children[0].state()) != want, name
            for other in [*children[1:], root]:  # a child's step is its own
                assert shape.carried(other.state()) == want, name
            found = containers_of(ids)
            runtimes = {i: [c.attrs["HostConfig"]["Runtime"] for c in found[i]] for i in ids}
            assert runtimes == {i: [runtime.RUNTIME] for i in ids}, runtimes
        finally:
            for env_id in ids:
                denv.delete_env(env_id)
    delete_all(gvisor_server, ids)
