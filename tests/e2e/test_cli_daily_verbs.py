"""End to end: the daily verbs of the `denv` CLI against the real local server and Docker.

Two envs are made with `denv run` (one probe with its command, one echo env), one is
snapshotted with `denv snapshot`, one deleted with `denv rm --label`, the other with
`denv rm --all`, and `denv stop` on a server that is not this machine's local one deletes
what is left (nothing) and leaves the server running. Each step is checked through the API
against what the command printed. A key of its own keeps `--all` to this test's envs.

And `DenvProvider(pull=...)`: without it a missing image's error names `pull=True`; with it
the pull is tried (no registry is reachable here) and its failure is the message.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import LocalDenv, docker_engine
from provider_helpers import PROBE_APP, PROBE_IMAGE

from denv import Denv, EnvStatus, InvalidRequest
from denv.cli import main
from denv.server.auth import create_api_key

pytestmark = pytest.mark.e2e

ECHO_IMAGE = "denv-echo-env:latest"
MISSING_IMAGE = "denv-no-such-image:latest"


@pytest.fixture
def own_key(denv_server: LocalDenv) -> Iterator[str]:
    """A key only this test uses; whatever it left is deleted afterwards."""
    key = create_api_key(denv_server.state_dir)
    yield key
    with Denv(denv_server.url, key) as denv:
        for env in list(denv.list_envs()):
            denv.delete_env(env.id)


@pytest.fixture
def cli(
    denv_server: LocalDenv,
    own_key: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> Iterator[Any]:
    """`cli(*argv)` runs `denv ARGV` in-process against the test server: (status, out, err)."""
    docker_engine(PROBE_IMAGE, ECHO_IMAGE)
    monkeypatch.setenv("DENV_SERVER", denv_server.url)
    monkeypatch.setenv("DENV_API_KEY", own_key)

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        status = main(list(argv))
        captured = capsys.readouterr()
        return status, captured.out, captured.err

    yield run


def test_run_snapshot_rm_label_rm_all_stop(cli: Any, denv_server: LocalDenv, own_key: str) -> None:
    api = Denv(denv_server.url, own_key)

    # run: the probe with its own command, labelled; the id and ingress URL are printed
    status, out, err = cli(
        "run", "--label", "verb=a", "--ttl", "10m", PROBE_IMAGE, "--", "python3", "-c", PROBE_APP
    )
    assert status == 0, err
    first, address = out.splitlines()[:2]
    a_id = first.split()[0]
    a = api.get_env(a_id)
    assert first == f"{a_id} healthy ({PROBE_IMAGE})"
    assert a.status is EnvStatus.HEALTHY and a.labels == {"verb": "a"}
    assert a.endpoints[0].url in address and address.startswith("ingress: ")
    assert (a.expires_at - a.created_at).total_seconds() == pytest.approx(600, abs=5)
    health = httpx.get(a.endpoints[0].url.rstrip("/") + "/health", trust_env=False)
    assert health.status_code == 200

    status, out, err = cli("run", "--json", "--label", "verb=b", ECHO_IMAGE)
    assert status == 0, err
    b_id = json.loads(out)["id"]
    assert api.get_env(b_id).labels == {"verb": "b"}

    # snapshot: the version printed is a snapshot of that env, with its label
    status, out, err = cli("snapshot", a_id, "--label", "step=1")
    assert status == 0, err
    version_id = out.split()[0]
    version = api.get_version(version_id)
    assert version.parent_env_id == a_id and version.labels == {"step": "1"}

    # rm --label: only the env with the label goes, and the command says so
    status, out, err = cli("rm", "--label", "verb=b")
    assert status == 0, err
    assert f"deleted {b_id}" in out and "deleted 1 env with verb=b" in out
    assert api.get_env(b_id).status is EnvStatus.DELETED
    assert api.get_env(a_id).status is EnvStatus.HEALTHY

    # rm --all: every env of this key goes
    status, out, err = cli("rm", "--all")
    assert status == 0, err
    assert f"deleted {a_id}" in out and "deleted 1 env of this key" in out
    assert list(api.list_envs()) == []
    assert api.get_env(a_id).status is EnvStatus.DELETED

    # stop on a server that is not this machine's local one: deletes this key's envs (none
    # left), and the server keeps running
    status, out, err = cli("stop")
    assert status == 0, err
    assert "deleted 0 envs of this key" in out and "the server keeps running" in out
    assert api.health().status == "ok"
    api.close()


def test_provider_pull_option_and_its_advice(denv_server: LocalDenv) -> None:
    from denv.openenv import DenvProvider

    docker_engine()
    server, key = denv_server.url, denv_server.key
    with pytest.raises(InvalidRequest) as not_pulled:
        DenvProvider(server, key).start_container(MISSING_IMAGE)
    assert not_pulled.value.code == "image_not_found"
    assert "or pass DenvProvider(pull=True)" in str(not_pulled.value)

    with pytest.raises(InvalidRequest) as pulled:
        DenvProvider(server, key, pull=True).start_container(MISSING_IMAGE)
    message = str(pulled.value)
    assert pulled.value.code == "image_not_found"
    assert f"image '{MISSING_IMAGE}'" in message and "pulling it failed" in message
    assert "pull=True" not in message and "pull: true" not in message

    # The server's own message (what `denv run --pull` and API clients see) gives the same
    # advice: after a failed pull it does not offer a pull.
    with Denv(server, key) as api, pytest.raises(InvalidRequest) as raw:
        api.create_sandbox(MISSING_IMAGE, pull=True)
    assert "pulling it failed" in raw.value.message and "pull: true" not in raw.value.message
    assert "check its name and the registry's credentials" in raw.value.message
