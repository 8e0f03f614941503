"""`denv export --harbor` run by Harbor itself: `harbor lint`, then `harbor trial start` on
Harbor's docker environment (Docker Compose v2, so BuildKit builds the task's images).

The trials reach a denv server of their own, listening on the Docker bridge's gateway
(this machine's address on docker0): the task's `env` service runs on a Compose network
and calls DENV_SERVER and the ingress URLs it hands out from there, as a task would call a
hosted denv. Nothing needs a registry: every image is built from the local echo image.

Three agents play the same exported version: a scripted agent (tests/e2e/harbor_agents.py)
that resets, reads the state and steps (its reward must be what the env gave the steps), a
forging agent that writes fake rewards and a fake record (its reward must be 0), and
Harbor's `nop` (0). The three trials run at once. After them no env of the version is left
alive and no container or image of a trial remains.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from conftest import LocalDenv, start_server
from denv.openenv.export import export_version
from openenv.core import GenericEnvClient

from denv import Denv, EnvStatus

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
HARBOR = ROOT / ".cache" / "harbor-venv" / "bin" / "harbor"
ECHO_IMAGE = "denv-echo-env:latest"
BOOT_TIMEOUT_S = 240.0
#: The echo env rewards a step with a tenth of its message's length.
MESSAGES = ["abcd", "xy"]
TRIAL_TIMEOUT_S = 1200
#: Harbor reports each command to PostHog (us.i.posthog.com) unless this is set, and a test
#: sends nothing off this machine (CI's lookups of that name were these tests' commands).
NO_TELEMETRY = {"HARBOR_TELEMETRY": "0"}


class Seeded(NamedTuple):
    version_id: str
    state: dict[str, Any]


def _docker(*args: str) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args[:3])} failed:\n{done.stderr}")
    return done.stdout.strip()


@pytest.fixture(scope="module")
def harbor() -> Path:
    if not HARBOR.exists():
        pytest.fail(f"{HARBOR} is missing: build it with `make harbor-venv` (make test runs it)")
    done = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
    if done.returncode or " v2." not in done.stdout:
        pytest.fail("Docker Compose v2 is missing (Harbor builds with it): run `make compose`")
    off = subprocess.run(
        [
            str(HARBOR.with_name("python")),
            "-c",
            "import harbor.telemetry as t; print(t._telemetry_disabled())",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **NO_TELEMETRY},
    )
    assert off.stdout.strip() == "True", (
        f"{NO_TELEMETRY} no longer turns Harbor's telemetry off (harbor/telemetry.py "
        f"changed?): {off.stdout}{off.stderr}"
    )
    return HARBOR


def docker_bridge_address() -> str:
    """This machine's address on Docker's default bridge, where containers reach it.

    Read from the bridge interface itself (docker0, or the name Docker gives it): Docker
    20.10 may report no ``Gateway`` in the bridge's IPAM config, only its subnet. Without
    the interface, the gateway Docker reports, else the subnet's first address.
    """
    info = json.loads(_docker("network", "inspect", "bridge"))[0]
    name = info.get("Options", {}).get("com.docker.network.bridge.name", "docker0")
    done = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "dev", name], capture_output=True, text=True
    )
    addresses = [f.split()[3].split("/")[0] for f in done.stdout.splitlines() if " inet " in f]
    if addresses:
        return addresses[0]
    configs = info.get("IPAM", {}).get("Config") or []
    for config in configs:
        if config.get("Gateway"):
            return str(config["Gateway"])
        if config.get("Subnet") and ":" not in config["Subnet"]:
            return str(next(ipaddress.ip_network(config["Subnet"]).hosts()))
    raise AssertionError(
        f"Docker's default bridge ({name}) has no IPv4 address, gateway or subnet "
        f"(ip addr: {done.stderr.strip() or 'no inet'}; IPAM: {configs}): "
        "start dockerd with its default bridge (not --bridge=none)"
    )


@pytest.fixture(scope="module")
def bridge_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    # --insecure: plain HTTP on docker0, an address of this machine that only its
    # containers reach (a hosted denv would be https).
    state = tmp_path_factory.mktemp("denv-harbor")
    with start_server(state, "--host", docker_bridge_address(), "--insecure") as server:
        yield server


@pytest.fixture(scope="module")
def client(bridge_server: LocalDenv) -> Iterator[Denv]:
    with Denv(bridge_server.url, bridge_server.key) as c:
        yield c


@pytest.fixture(scope="module")
def seeded(client: Denv) -> Iterator[Seeded]:
    """A snapshot of the echo env after two steps ("seeded" last)."""
    if subprocess.run(["docker", "image", "inspect", ECHO_IMAGE], capture_output=True).returncode:
        pytest.fail(f"image {ECHO_IMAGE} is not on the Docker Engine: run `make images`")
    project = f"harbor-{uuid.uuid4().hex[:8]}"
    compose = f"""
name: {project}
x-denv:
  agent: {{service: agent}}
services:
  agent:
    image: {ECHO_IMAGE}
    ports: ["8000"]
"""
    base = client.deploy(project, compose)
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
    image_id = _docker("image", "inspect", "-f", "{{.Id}}", ECHO_IMAGE)
    try:
        yield Seeded(version.id, state)
    finally:  # the export's tag on the echo image (FROM names it); only the tag goes
        subprocess.run(
            ["docker", "image", "rm", f"denv-export-base:{image_id.split(':', 1)[1]}"],
            capture_output=True,
        )


@pytest.fixture(scope="module")
def task(client: Denv, seeded: Seeded, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("harbor-task") / "echo-task"
    export_version(client, seeded.version_id, dest, kind="harbor")
    return dest


def _lint(harbor: Path, task: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(harbor), "lint", *args, str(task)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **NO_TELEMETRY},
    )


def test_the_task_passes_harbor_lint(harbor: Path, task: Path) -> None:
    done = _lint(harbor, task)
    assert done.returncode == 0, f"harbor lint failed:\n{done.stdout}\n{done.stderr}"
    # Beyond the defaults, only the pin of a local image (no registry digest) is flagged.
    every = _lint(harbor, task, "--select", "ALL", "--json")
    rules = {finding["rule"] for finding in json.loads(every.stdout)}
    assert rules <= {"unpinned-image"}, every.stdout


def _trial_resources(name: str) -> set[str]:
    """Containers, networks and images of trials: Harbor names its compose projects (and so
    their containers, networks and the `env` image) after the trial, and the task's own
    images hb__<hash>."""
    key = name.lower()
    containers = _docker("ps", "-a", "--format", "{{.Names}}").splitlines()
    networks = _docker("network", "ls", "--format", "{{.Name}}").splitlines()
    images = _docker("images", "--format", "{{.Repository}}").splitlines()
    return {n for n in containers + networks + images if key in n.lower()} | {
        i for i in images if i.startswith("hb__")
    }


class Trial(NamedTuple):
    name: str
    agent: str
    process: subprocess.Popen[str]
    began: float


def _start_trial(
    harbor: Path, task: Path, server: LocalDenv, agent: str, trials: Path, **env: str
) -> Trial:
    """`harbor trial start` of `agent` on a copy of the task, in the background.

    Each trial gets a copy with a marker file of its own in environment/: Harbor tags the
    task's image by the content of that folder (hb__<hash>) and removes it when the trial
    ends, so trials that run at once must not share it.
    """
    name = f"denv-{agent.rsplit(':', 1)[-1].lower()}-{uuid.uuid4().hex[:6]}"
    own = trials / "tasks" / name / task.name
    shutil.copytree(task, own)
    (own / "environment" / ".trial").write_text(name + "\n")
    command = [str(harbor), "trial", "start", "-p", str(own), "-a", agent, "-e", "docker"]
    command += ["--trials-dir", str(trials), "--trial-name", name, "--delete"]
    # Output to files, not pipes: a trial blocked on a full pipe would stall the others.
    log = trials / "logs" / name
    log.mkdir(parents=True)
    with (log / "stdout").open("w") as out, (log / "stderr").open("w") as err:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=err,
            text=True,
            env={
                **os.environ,
                "DENV_SERVER": server.url,
                "DENV_API_KEY": server.key,
                "PYTHONPATH": str(Path(__file__).parent),
                **NO_TELEMETRY,
                **env,
            },
        )
    return Trial(name, agent, process, time.monotonic())


def _finish_trial(trial: Trial, trials: Path, before: set[str]) -> dict[str, Any]:
    try:
        trial.process.wait(timeout=TRIAL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        trial.process.kill()
        trial.process.wait()
    took = time.monotonic() - trial.began
    log = trials / "logs" / trial.name
    stdout, stderr = ((log / f).read_text(errors="replace") for f in ("stdout", "stderr"))
    print(f"trial {trial.name} ({trial.agent}): {took:.1f}s", file=sys.stderr)
    results = trials / trial.name / "result.json"
    assert results.exists(), f"no trial result:\n{stdout[-4000:]}\n{stderr[-4000:]}"
    result: dict[str, Any] = json.loads(results.read_text())
    result["_dir"] = str(trials / trial.name)
    result["_left"] = sorted(_trial_resources(trial.name) - before)
    return result


@pytest.fixture(scope="module")
def trials(
    harbor: Path,
    task: Path,
    bridge_server: LocalDenv,
    seeded: Seeded,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, dict[str, Any]]:
    """The three agents' trials, run at once (each waits mostly on builds, boots and its
    env's server; one after another they took ~150 s here, most of the file's time).
    What each left is read once every trial has ended."""
    folder = tmp_path_factory.mktemp("harbor-trials")
    agents = {
        "episode": ("harbor_agents:EpisodeAgent", {"DENV_TEST_MESSAGES": json.dumps(MESSAGES)}),
        "forging": ("harbor_agents:ForgingAgent", {"DENV_TEST_VERSION": seeded.version_id}),
        "nop": ("nop", {}),
    }
    before = _trial_resources("hb__")
    started: dict[str, Trial] = {}
    try:
        for key, (agent, env) in agents.items():
            started[key] = _start_trial(harbor, task, bridge_server, agent, folder, **env)
    except BaseException:
        for trial in started.values():
            trial.process.kill()
            trial.process.wait()
        raise
    done: dict[str, dict[str, Any]] = {}
    errors: dict[str, AssertionError] = {}
    for key, trial in started.items():  # every trial is waited for, even when one failed
        try:
            done[key] = _finish_trial(trial, folder, before)
        except AssertionError as e:
            errors[key] = e
    if errors:
        raise AssertionError("; ".join(f"{k}: {e}" for k, e in errors.items()))
    return done


def _reward(result: dict[str, Any]) -> float:
    exception = result.get("exception_info")
    assert exception is None, f"the trial failed: {json.dumps(exception)[:3000]}"
    verifier = result.get("verifier_result") or {}
    rewards = verifier.get("rewards") or {}
    assert "reward" in rewards, f"no reward in {json.dumps(verifier)[:2000]}"
    return float(rewards["reward"])


def _verifier_log(result: dict[str, Any]) -> str:
    logs = Path(result["_dir"]) / "verifier"
    return "\n".join(p.read_text(errors="replace") for p in logs.rglob("*.txt") if p.is_file())


def _live_envs(client: Denv, version_id: str) -> list[str]:
    return [e.id for e in client.list_envs(version_id=version_id) if e.status != EnvStatus.DELETED]


def test_an_episode_scores_the_rewards_of_its_steps(
    trials: dict[str, dict[str, Any]], client: Denv, seeded: Seeded
) -> None:
    result = trials["episode"]
    played = json.loads((Path(result["_dir"]) / "agent" / "episode.json").read_text())
    assert played["rc"] == 0, f"{played}, in {result['_dir']}"
    episode = json.loads(played["stdout"].strip().splitlines()[-1])
    assert episode["uid"] != 0, "the agent ran as root"
    assert episode["state"] == seeded.state  # the reset gave the version's exact state
    assert episode["rewards"] == pytest.approx([len(m) / 10 for m in MESSAGES])
    assert _reward(result) == pytest.approx(sum(len(m) / 10 for m in MESSAGES))
    assert result["_left"] == [], f"the trial left {result['_left']}"
    assert _live_envs(client, seeded.version_id) == []


def test_a_forging_agent_scores_0(
    trials: dict[str, dict[str, Any]], client: Denv, seeded: Seeded
) -> None:
    result = trials["forging"]
    forged = json.loads((Path(result["_dir"]) / "agent" / "forge.json").read_text())
    assert forged["stdout"].splitlines()[0] != "0", "the agent ran as root"
    assert "forged" in forged["stdout"], forged
    assert _reward(result) == 0.0
    # The verifier scored the env service's own sealed record (no step), not the forgery.
    assert "0 events (0 steps), verified" in _verifier_log(result)
    assert result["_left"] == [], f"the trial left {result['_left']}"
    assert _live_envs(client, seeded.version_id) == []


def test_harbors_nop_agent_scores_0(
    trials: dict[str, dict[str, Any]], client: Denv, seeded: Seeded
) -> None:
    result = trials["nop"]
    assert _reward(result) == 0.0
    assert result["_left"] == [], f"the trial left {result['_left']}"
    assert _live_envs(client, seeded.version_id) == []
