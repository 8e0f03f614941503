"""The calls each facade cassette holds, shared by the recorder and the replay tests.

scripts/record_cassettes.py runs every scenario against a real local server (with its own
API key, so lists see only that scenario's envs) and saves what went over the wire as
tests/cassettes/<name>.yaml; test_facade_cassettes.py runs the same function against the
replayed cassette and checks what it returns. Running the very same code is what makes the
replayed requests line up with the recorded ones. Every scenario deletes what it creates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from denv import Denv, DenvError, Env

# What the recorder writes in place of the server's URL and of every API key.
CASSETTE_SERVER = "http://127.0.0.1:7711"
CASSETTE_KEY = "dak_CASSETTE_KEY"

IMAGE = "denv-echo-env:latest"
MISSING_IMAGE = "denv-no-such-image:latest"
# Well-formed ids that no server made; shaped like the cassettes' placeholders so the
# scrubber leaves them as they are and the replayed paths match.
UNKNOWN_ENV = "env_0000000000000000000000000Z"
BAD_KEY = "dak_" + "x" * 43
WAIT_TIMEOUT_S = 120.0
PROJECT = "echo-cassette"
COMPOSE = """\
services:
  agent:
    image: denv-echo-env:latest
    ports: ["8000"]
x-denv:
  agent:
    service: agent
    health_path: /health
"""

Scenario = Callable[[Denv], Any]
SCENARIOS: dict[str, Scenario] = {}


def scenario(fn: Scenario) -> Scenario:
    SCENARIOS[fn.__name__] = fn
    return fn


def error_of(call: Callable[[], object]) -> DenvError:
    """The DenvError `call` raises (the scenario records the error response)."""
    try:
        call()
    except DenvError as exc:
        return exc
    raise AssertionError("expected a DenvError")


def _sandbox(denv: Denv, **kw: Any) -> Env:
    return denv.create_sandbox(IMAGE, wait_timeout_s=WAIT_TIMEOUT_S, **kw)


@scenario
def health(denv: Denv) -> Any:
    return denv.health()


@scenario
def create_sandbox(denv: Denv) -> Env:
    env = _sandbox(denv, labels={"scenario": "create_sandbox"}, env={"GREETING": "hi"})
    denv.delete_env(env.id)
    return env


@scenario
def get_env(denv: Denv) -> tuple[Env, Env]:
    env = _sandbox(denv)
    got = denv.get_env(env.id)
    denv.delete_env(env.id)
    return env, got


@scenario
def list_envs(denv: Denv) -> tuple[list[Env], list[Env], list[Env]]:
    denv._page_size = 1  # one env a page, so following next_cursor is on the record
    created = [_sandbox(denv, wait="none"), _sandbox(denv, wait="none")]
    listed = list(denv.list_envs())
    by_version = list(denv.list_envs(version_id=created[0].version_id))
    for env in created:
        denv.delete_env(env.id)
    return created, listed, by_version


@scenario
def wait_env(denv: Denv) -> tuple[Env, Env]:
    env = _sandbox(denv, wait="none")
    waited = denv.wait_env(env.id, until="healthy", timeout_s=WAIT_TIMEOUT_S)
    denv.delete_env(env.id)
    return env, waited


@scenario
def logs(denv: Denv) -> list[str]:
    env = _sandbox(denv)
    lines = denv.logs(env.id, tail=3)
    denv.delete_env(env.id)
    return lines


@scenario
def snapshot(denv: Denv) -> tuple[Env, Any]:
    env = _sandbox(denv)
    version = denv.snapshot(env.id, labels={"step": "1"})
    denv.delete_env(env.id)
    denv.delete_version(version.id)
    return env, version


@scenario
def fork(denv: Denv) -> tuple[Env, Any]:
    env = _sandbox(denv)
    forked = denv.fork(env.id, count=2, wait_timeout_s=WAIT_TIMEOUT_S)
    for child in forked.envs:
        denv.delete_env(child.id)
    denv.delete_env(env.id)
    return env, forked


@scenario
def envs_from_version(denv: Denv) -> tuple[Any, list[Env]]:
    env = _sandbox(denv)
    version = denv.snapshot(env.id)
    denv.delete_env(env.id)
    envs = denv.envs_from_version(version.id, count=1, wait_timeout_s=WAIT_TIMEOUT_S)
    for child in envs:
        denv.delete_env(child.id)
    return version, envs


@scenario
def create_sandboxes(denv: Denv) -> list[Env]:
    envs = denv.create_sandboxes(IMAGE, 2, wait_timeout_s=WAIT_TIMEOUT_S)
    for env in envs:
        denv.delete_env(env.id)
    return envs


@scenario
def lineage_and_diff(denv: Denv) -> tuple[Env, Any, Any, list[Any], Any]:
    env = _sandbox(denv)
    forked = denv.fork(env.id, wait_timeout_s=WAIT_TIMEOUT_S)
    (child,) = forked.envs
    later = denv.snapshot(child.id)
    chain = denv.lineage(child.id)
    diff = denv.diff(forked.version.id, later.id)
    denv.delete_env(child.id)
    denv.delete_env(env.id)
    denv.delete_version(later.id)
    denv.delete_version(forked.version.id)
    return env, forked, later, chain, diff


@scenario
def get_version(denv: Denv) -> tuple[Any, Any]:
    env = _sandbox(denv)
    version = denv.snapshot(env.id)
    got = denv.get_version(version.id)
    denv.delete_env(env.id)
    return version, got


@scenario
def list_versions(denv: Denv) -> tuple[list[Any], list[Any]]:
    denv._page_size = 1
    env = _sandbox(denv)
    made = [denv.snapshot(env.id), denv.snapshot(env.id)]
    listed = list(denv.list_versions())
    denv.delete_env(env.id)
    return made, listed


@scenario
def delete_version_in_use(denv: Denv) -> tuple[DenvError, Any]:
    env = _sandbox(denv)
    version = denv.snapshot(env.id)
    (child,) = denv.envs_from_version(version.id, wait="running")
    in_use = error_of(lambda: denv.delete_version(version.id))
    denv.delete_env(child.id)
    denv.delete_env(env.id)
    return in_use, denv.delete_version(version.id)


@scenario
def deploy_and_list_projects(denv: Denv) -> tuple[Any, list[Any]]:
    version = denv.deploy(PROJECT, COMPOSE, labels={"source": "cassette"})
    return version, list(denv.list_projects())


@scenario
def delete_env_twice(denv: Denv) -> tuple[Env, Env]:
    env = _sandbox(denv, wait="none")
    denv.delete_env(env.id)
    denv.delete_env(env.id)  # idempotent: succeeds again
    return env, denv.get_env(env.id)


@scenario
def unknown_env(denv: Denv) -> DenvError:
    return error_of(lambda: denv.get_env(UNKNOWN_ENV))


@scenario
def bad_key(denv: Denv) -> DenvError:
    with Denv(denv.server, BAD_KEY, max_retries=denv.max_retries) as other:
        return error_of(lambda: other.get_env(UNKNOWN_ENV))


@scenario
def image_not_found(denv: Denv) -> DenvError:
    return error_of(lambda: denv.create_sandbox(MISSING_IMAGE))


@scenario
def count_above_limit(denv: Denv) -> DenvError:
    env = _sandbox(denv, wait="none")
    error = error_of(lambda: denv.fork(env.id, count=33))
    denv.delete_env(env.id)
    return error
