"""`denv export` end to end: a real version, a real image build, real OpenEnv clients.

The echo env is deployed as a one-service project (its compose declares the MCP tools),
stepped to a state worth keeping and snapshotted; that version is exported as an OpenEnv
package, built with BuildKit (`docker compose build`, as Harbor builds) and with the legacy
builder (FROM the pinned agent image), and run as a plain OpenEnv image
the way OpenEnv's LocalDockerProvider runs one (`docker run -d` with env vars). The
container runs on the host's network: the test server listens on 127.0.0.1 and the ingress
URLs it hands out start with that address, so that is the one way the container reaches
both without changing the server. Its port comes from PORT.

The Harbor export of the same version is loaded with Harbor's own task loader (in
.cache/harbor-venv, built by `make harbor-venv`) and its two images are built both ways;
test_export_harbor.py runs it with `harbor trial start`. Another image under the FROM tag
fails to build with either builder.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
from denv.openenv.export import export_version
from openenv.core import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient

from denv import Denv, EnvStatus

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ECHO_IMAGE = "denv-echo-env:latest"
TOOLS = ["echo_message", "echo_with_length"]
CA_BUNDLE = Path(os.environ.get("DENV_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt"))
#: The echo image imports OpenEnv cold at boot, which takes a while here.
BOOT_TIMEOUT_S = 240.0
HARBOR_VENV = ROOT / ".cache" / "harbor-venv"


def _compose(project: str) -> str:
    return f"""
name: {project}
x-denv:
  agent: {{service: agent}}
  tools: [{", ".join(TOOLS)}]
services:
  agent:
    image: {ECHO_IMAGE}
    ports: ["8000"]
"""


class Seeded(NamedTuple):
    version_id: str
    project: str
    compose: str
    state: dict[str, Any]  # the echo episode the version holds


@pytest.fixture(scope="module")
def client(denv_server: Any) -> Iterator[Denv]:
    with Denv(denv_server.url, denv_server.key) as c:
        yield c


@pytest.fixture(scope="module")
def seeded(client: Denv) -> Iterator[Seeded]:
    """A version of the echo project whose episode has two steps ("seeded" last)."""
    if subprocess.run(["docker", "image", "inspect", ECHO_IMAGE], capture_output=True).returncode:
        pytest.fail(f"image {ECHO_IMAGE} is not on the Docker Engine: run `make images`")
    project = f"export-{uuid.uuid4().hex[:8]}"
    compose = _compose(project)
    base = client.deploy(project, compose)
    assert base.tools == TOOLS  # the version keeps x-denv.tools ...
    env = client.envs_from_version(base.id, wait_timeout_s=BOOT_TIMEOUT_S)[0]
    try:
        url = next(e.url for e in env.endpoints if e.service == "agent")
        with GenericEnvClient(base_url=url).sync() as echo:
            echo.reset()
            echo.step({"message": "first"})
            echo.step({"message": "seeded"})
            state = dict(echo.state())
        version = client.snapshot(env.id)
    finally:
        client.delete_env(env.id)
    assert state["step_count"] == 2 and state["last_message"] == "seeded"
    assert client.get_version(version.id).tools == TOOLS  # ... and so do its snapshots
    try:
        yield Seeded(version.id, project, compose, state)
    finally:
        # The exports put this tag on the echo image (FROM names it); only the tag goes.
        subprocess.run(["docker", "image", "rm", _base_tag()], capture_output=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _docker(*args: str, timeout: float = 600) -> str:
    done = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args[:3])} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout.strip()


BUILDERS = ("buildkit", "legacy")


def _compose_v2() -> None:
    done = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
    if done.returncode or " v2." not in done.stdout:
        pytest.fail(
            "Docker Compose v2 is missing (BuildKit builds go through `docker compose build`, "
            "as Harbor's do): install it with `make compose` (make test runs it)"
        )


def _try_build(
    context: Path, dockerfile: Path, tag: str, builder: str
) -> subprocess.CompletedProcess[str]:
    """Build with BuildKit (`docker compose build`, as Harbor does) or the legacy builder.

    Without the cache, so that every build runs the check of its base.
    """
    if CA_BUNDLE.is_file():  # used only if the build must pip install (see the Dockerfile)
        shutil.copy(CA_BUNDLE, context / "denv-ca.crt")
    if builder == "legacy":
        command = [
            "docker",
            "build",
            "--no-cache",
            "--force-rm",
            "-f",
            str(dockerfile),
            "-t",
            tag,
            str(context),
        ]
        env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    else:
        _compose_v2()
        compose = context.parent / f"{context.name}.build-compose.yaml"
        compose.write_text(
            "services:\n  export:\n"
            f"    build: {{context: {json.dumps(str(context))}, "
            f"dockerfile: {json.dumps(str(dockerfile))}}}\n"
            f"    image: {json.dumps(tag)}\n"
        )
        project = f"denv-export-build-{uuid.uuid4().hex[:8]}"
        command = ["docker", "compose", "--progress", "plain", "-p", project, "-f", str(compose)]
        command += ["build", "--no-cache"]
        env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)


def _build(context: Path, dockerfile: Path, tag: str, builder: str) -> None:
    done = _try_build(context, dockerfile, tag, builder)
    assert done.returncode == 0, (
        f"building the export with {builder} failed:\n{done.stdout}\n{done.stderr}"
    )
    assert "base image's files match" in done.stdout + done.stderr, "the base was not checked"


def _base_tag() -> str:
    image_id = _docker("image", "inspect", "-f", "{{.Id}}", ECHO_IMAGE)
    return f"denv-export-base:{image_id.split(':', 1)[1]}"


def _wait_healthy(base_url: str, container: str) -> None:
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base_url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if _docker("inspect", "-f", "{{.State.Running}}", container) != "true":
            break
        time.sleep(0.5)
    logs = subprocess.run(["docker", "logs", container], capture_output=True, text=True)
    pytest.fail(f"the exported server did not become healthy:\n{logs.stdout}\n{logs.stderr}")


def _live_envs(client: Denv, version_id: str) -> list[str]:
    return [e.id for e in client.list_envs(version_id=version_id) if e.status != EnvStatus.DELETED]


def test_openenv_export_runs_as_a_plain_openenv_image(
    client: Denv, seeded: Seeded, denv_server: Any, tmp_path: Path
) -> None:
    url, key = denv_server.url, denv_server.key
    dest = tmp_path / "echo-export"
    began = time.monotonic()
    # No --compose, no --tool: the version's own declaration gives the MCP tools.
    plan = export_version(client, f"{seeded.project}@{seeded.version_id}", dest)
    assert plan.tools == TOOLS
    print(f"export: {time.monotonic() - began:.2f}s", file=sys.stderr)
    image_id = _docker("image", "inspect", "-f", "{{.Id}}", ECHO_IMAGE)
    assert plan.agent.image_id == image_id
    assert plan.agent.kind == "image content" and plan.agent.reference == _base_tag()
    dockerfile = (dest / "server" / "Dockerfile").read_text()
    assert f"FROM {_base_tag()}\n" in dockerfile and plan.agent.files_digest in dockerfile
    assert _docker("image", "inspect", "-f", "{{.Id}}", _base_tag()) == image_id
    for path in dest.rglob("*"):  # credentials are never written into the package
        assert not path.is_file() or key not in path.read_text(errors="replace")

    tag = f"denv-export-e2e:{uuid.uuid4().hex[:8]}"  # BuildKit's image: the one run below
    try:
        for builder in BUILDERS:
            began = time.monotonic()
            built = tag if builder == "buildkit" else f"{tag}-{builder}"
            _build(dest, dest / "server" / "Dockerfile", built, builder)
            print(f"build ({builder}): {time.monotonic() - began:.2f}s", file=sys.stderr)
    except BaseException:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)
        raise
    finally:
        subprocess.run(["docker", "image", "rm", "-f", f"{tag}-legacy"], capture_output=True)
    port = _free_port()
    container = _docker(
        "run", "-d", "--network", "host", "-e", f"PORT={port}",
        "-e", f"DENV_SERVER={url}", "-e", f"DENV_API_KEY={key}", tag,
    )  # fmt: skip
    base_url = f"http://127.0.0.1:{port}"
    try:
        began = time.monotonic()
        _wait_healthy(base_url, container)
        print(f"server up: {time.monotonic() - began:.2f}s", file=sys.stderr)
        _drive(client, seeded, base_url)
        assert _live_envs(client, seeded.version_id) == [], "a closed session left its env"
    finally:
        _docker("rm", "-f", container)
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)
    assert _live_envs(client, seeded.version_id) == []


def _drive(client: Denv, seeded: Seeded, base_url: str) -> None:
    version_state = seeded.state
    with GenericEnvClient(base_url=base_url, message_timeout_s=300).sync() as env:
        began = time.monotonic()
        first = env.reset()
        print(f"reset (cold env): {time.monotonic() - began:.2f}s", file=sys.stderr)
        first_env = first.observation["metadata"]["denv_env_id"]
        assert first.observation["state"] == version_state
        assert dict(env.state()) == version_state

        stepped = env.step({"message": "branch"})
        assert stepped.observation["echoed_message"] == "branch"
        assert stepped.reward == pytest.approx(0.6)
        after = dict(env.state())
        assert after["step_count"] == version_state["step_count"] + 1
        assert after["last_message"] == "branch"

        began = time.monotonic()
        again = env.reset()
        print(f"reset again: {time.monotonic() - began:.2f}s", file=sys.stderr)
        assert again.observation["metadata"]["denv_env_id"] != first_env
        assert dict(env.state()) == version_state  # back to the version's state
        assert client.get_env(first_env).status == EnvStatus.DELETED

        refused = env.step({"type": "call_tool", "tool_name": "not_declared", "arguments": {}})
        assert "not one of the tools" in refused.observation["metadata"]["error"]

    with MCPToolClient(base_url=base_url, message_timeout_s=300).sync() as tools:
        tools.reset()
        assert sorted(t.name for t in tools.list_tools()) == TOOLS
        assert tools.call_tool("echo_with_length", message="abc") == {"message": "abc", "length": 3}


@pytest.mark.parametrize("builder", BUILDERS)
def test_an_export_does_not_build_on_another_image_under_its_tag(
    client: Denv, seeded: Seeded, tmp_path: Path, builder: str
) -> None:
    """The FROM tag can be put on any image: the build's check of the files refuses it."""
    dest = tmp_path / "echo-export"
    plan = export_version(client, seeded.version_id, dest)
    impostor = f"denv-export-e2e-impostor:{uuid.uuid4().hex[:8]}"
    _docker("tag", "denv-base-probe:latest", impostor)  # python3 and sh, like the real base
    dockerfile = dest / "server" / "Dockerfile"
    text = dockerfile.read_text()
    assert f"FROM {plan.agent.reference}\n" in text
    dockerfile.write_text(text.replace(f"FROM {plan.agent.reference}\n", f"FROM {impostor}\n"))
    tag = f"denv-export-e2e:{uuid.uuid4().hex[:8]}"
    try:
        done = _try_build(dest, dockerfile, tag, builder)
    finally:
        subprocess.run(["docker", "image", "rm", "-f", impostor, tag], capture_output=True)
    assert done.returncode != 0, f"the build on another image succeeded:\n{done.stdout}"
    out = done.stdout + done.stderr
    assert "this base is not the image the version was exported from" in out, out[-3000:]
    assert plan.agent.files_digest in out


def _harbor_python() -> Path:
    """The Python of .cache/harbor-venv (Harbor needs Python >= 3.12), built by make."""
    python = HARBOR_VENV / "bin" / "python"
    if (
        not python.exists()
        or subprocess.run(
            [str(python), "-c", "import harbor.models.task.task"], capture_output=True
        ).returncode
    ):
        pytest.fail(f"Harbor is not installed in {HARBOR_VENV}: run `make harbor-venv`")
    return python


LOAD_TASK = """
import json, sys
from harbor.models.task.task import Task
task = Task(sys.argv[1])
assert Task.is_valid_dir(sys.argv[1])
print(json.dumps({
    "name": task.name,
    "instruction": task.instruction,
    "env": task.config.environment.env,
    "agent_user": task.config.agent.user,
    "verifier_mode": task.config.verifier.environment_mode.value,
    "verifier_env": task.config.verifier.env,
    "metadata": task.config.metadata,
    "test": str(task.paths.discovered_test_path),
}))
"""


def test_harbor_export_loads_with_harbors_task_loader(
    client: Denv, seeded: Seeded, denv_server: Any, tmp_path: Path
) -> None:
    import json

    python = _harbor_python()
    dest = tmp_path / "echo-task"
    export_version(client, seeded.version_id, dest, kind="harbor")
    done = subprocess.run(
        [str(python), "-c", LOAD_TASK, str(dest)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"Harbor refused the task:\n{done.stderr}"
    task = json.loads(done.stdout.strip().splitlines()[-1])
    assert task["name"].startswith("denv/")
    assert seeded.version_id in task["instruction"]
    assert task["env"] == {}  # the agent's sandbox gets no denv credentials
    assert task["agent_user"] == "agent" and task["verifier_mode"] == "separate"
    assert task["verifier_env"] == {"DENV_API_KEY": "${DENV_API_KEY}"}
    assert task["metadata"]["denv_version_id"] == seeded.version_id
    assert task["metadata"]["denv_tools"] == TOOLS
    assert task["test"] == str(dest / "tests" / "test.sh")
    assert f"FROM {_base_tag()}\n" in (dest / "environment" / "Dockerfile").read_text()
    assert f"FROM {_base_tag()}\n" in (dest / "tests" / "Dockerfile").read_text()
    tag = f"denv-export-e2e:{uuid.uuid4().hex[:8]}"
    for folder in ("environment", "tests"):  # the agent's image and the verifier's
        for builder in BUILDERS:
            try:
                _build(dest / folder, dest / folder / "Dockerfile", tag, builder)
            finally:
                subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)
    key = denv_server.key
    assert not any(key in p.read_text() for p in dest.rglob("*") if p.is_file())
