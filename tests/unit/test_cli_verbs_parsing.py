"""`denv run`, `denv snapshot`, `denv rm --all/--label` and `denv stop` on a remote server,
without a server: the commands' client is a stand-in recording what they ask it, so these
check how arguments become calls and what is printed. The same verbs against a real server
are in tests/e2e/test_cli_daily_verbs.py.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from typing import Any

import pytest

import denv._cli_common
import denv._stop_cli
from denv.cli import main
from denv.types import (
    Egress,
    Endpoint,
    EndpointVia,
    Env,
    EnvError,
    EnvErrorCode,
    EnvStatus,
    StartMode,
    Version,
)

SERVER = "http://denv.test:7711"
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
ENV_A = "env_01JDQ5C8M9W3X7Y2Z4A6B8C0DA"
ENV_B = "env_01JDQ5C8M9W3X7Y2Z4A6B8C0DB"
ENV_C = "env_01JDQ5C8M9W3X7Y2Z4A6B8C0DC"
VER = "ver_01JDQ5C8M9W3X7Y2Z4A6B8C0D1"
INGRESS = f"{SERVER}/ingress/tok123/"


def make_env(env_id: str, labels: dict[str, str] | None = None, **kw: Any) -> Env:
    fields: dict[str, Any] = {
        "id": env_id,
        "status": EnvStatus.HEALTHY,
        "version_id": VER,
        "parent_id": None,
        "project": None,
        "agent_service": "agent",
        "egress": Egress.DENY,
        "labels": labels or {},
        "services": [],
        "endpoints": [Endpoint("agent", 8000, INGRESS, EndpointVia.INGRESS)],
        "start": StartMode.COLD,
        "created_at": NOW,
        "expires_at": NOW,
        "error": None,
    }
    return Env(**{**fields, **kw})


class FakeDenv:
    """What the commands call on `Denv`, recorded; `envs` is what the server holds."""

    envs: list[Env]
    calls: list[tuple[str, Any, dict[str, Any]]]
    created: Env

    detached: list[bool]

    def __init__(self, server: str | None = None, *, detach: bool = False) -> None:
        self.server = SERVER
        FakeDenv.detached.append(detach)

    def __enter__(self) -> FakeDenv:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def create_sandbox(self, image: str, **kw: Any) -> Env:
        self.calls.append(("create_sandbox", image, kw))
        return self.created

    def snapshot(self, env_id: str, **kw: Any) -> Version:
        self.calls.append(("snapshot", env_id, kw))
        return Version(
            id=VER,
            project=None,
            parent_env_id=env_id,
            parent_version_id=None,
            agent_service="agent",
            services=[],
            layer_depth=1,
            warm_fork=False,
            labels=dict(kw.get("labels") or {}),
            created_at=NOW,
        )

    def list_envs(self, **kw: Any) -> Iterator[Env]:
        self.calls.append(("list_envs", None, kw))
        return iter(list(self.envs))

    def delete_env(self, env_id: str) -> None:
        self.calls.append(("delete_env", env_id, {}))
        type(self).envs = [e for e in self.envs if e.id != env_id]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> type[FakeDenv]:
    FakeDenv.envs = []
    FakeDenv.calls = []
    FakeDenv.detached = []
    FakeDenv.created = make_env(ENV_A)
    monkeypatch.setattr(denv._cli_common, "Denv", FakeDenv)
    monkeypatch.setattr(denv._stop_cli, "Denv", FakeDenv)
    return FakeDenv


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(list(argv))
    out = capsys.readouterr()
    return status, out.out, out.err


# -- denv run


def test_run_turns_its_options_into_one_create(
    fake: type[FakeDenv], capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(
        capsys,
        "run",
        "--live",
        "--label",
        "run=a1",
        "--label",
        "team=rl",
        "--egress",
        "pypi.org:443,10.0.0.0/8",
        "--ttl",
        "10m",
        "--wait",
        "running",
        "-p",
        "8000",
        "-e",
        "LOG_LEVEL=debug",
        "--pull",
        "denv-base-probe:latest",
        "--",
        "python3",
        "-c",
        "print(1)",
    )
    assert status == 0, err
    ((name, image, kw),) = fake.calls
    assert (name, image) == ("create_sandbox", "denv-base-probe:latest")
    assert kw["labels"] == {"run": "a1", "team": "rl"}
    assert kw["egress"] == {"allow": ["pypi.org:443", "10.0.0.0/8"]}
    assert kw["ttl_s"] == 600 and kw["wait"] == "running" and kw["live"] is True
    assert kw["command"] == ["python3", "-c", "print(1)"]
    assert kw["ports"] == [8000] and kw["env"] == {"LOG_LEVEL": "debug"} and kw["pull"] is True
    assert fake.detached == [True]  # what `denv run` makes outlives the command (no lease)
    # The id and where to reach it, on the lines a person reads first.
    assert out.splitlines()[0].startswith(f"{ENV_A} healthy")
    assert INGRESS in out.splitlines()[1]


def test_run_defaults_are_the_servers(
    fake: type[FakeDenv], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "run", "denv-echo-env:latest")[0] == 0
    ((_, _, kw),) = fake.calls
    assert kw["egress"] == "deny" and kw["wait"] == "healthy" and kw["live"] is False
    assert kw["labels"] is None and kw["ttl_s"] is None and kw["command"] is None
    assert kw["pull"] is False


def test_run_quiet_and_json_are_for_scripts(
    fake: type[FakeDenv], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "run", "-q", "img:1")[1] == f"{ENV_A}\n"
    status, out, _ = run(capsys, "run", "--json", "img:1")
    assert status == 0
    printed = json.loads(out)
    assert printed["id"] == ENV_A and printed["endpoints"][0]["url"] == INGRESS


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--label", "novalue"], "'novalue' is not KEY=VALUE"),
        (["--ttl", "soon"], "'soon' is not a duration"),
        (["--ttl", "0"], "'0' is not a duration"),
        (["--wait", "forever"], "invalid choice: 'forever'"),
        (["-e", "NOEQUALS"], "'NOEQUALS' is not NAME=VALUE"),
    ],
)
def test_run_names_a_bad_option_before_any_call(
    fake: type[FakeDenv], capsys: pytest.CaptureFixture[str], argv: list[str], named: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["run", *argv, "img:1"])
    assert info.value.code == 2
    assert named in capsys.readouterr().err
    assert fake.calls == []


def test_run_reports_a_failed_start_with_its_log_tail(
    fake: type[FakeDenv], capsys: pytest.CaptureFixture[str]
) -> None:
    error = EnvError(EnvErrorCode.START_FAILED, "the agent exited (code 1)", ["Traceback", "boom"])
    fake.created = make_env(ENV_A, status=EnvStatus.FAILED, error=error, endpoints=[])
    status, _, err = run(capsys, "run", "img:1")
    assert status == 1
    assert f"denv run: {ENV_A} failed: the agent exited (code 1)" in err
    assert "  | boom" in err and f"denv logs {ENV_A}" in err and f"denv rm {ENV_A}" in err


# -- denv snapshot


def test_snapshot_prints_the_version_and_passes_labels(
    fake: type[FakeDenv], capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run(capsys, "snapshot", ENV_A, "--label", "step=10")
    assert status == 0 and out.startswith(VER)
    assert fake.calls == [("snapshot", ENV_A, {"labels": {"step": "10"}})]
    assert run(capsys, "snapshot", "-q", ENV_A)[1] == f"{VER}\n"
    assert json.loads(run(capsys, "snapshot", "--json", ENV_A)[1])["id"] == VER


def test_snapshot_of_something_not_an_env_says_so(
    fake: type[FakeDenv], capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = run(capsys, "snapshot", VER)
    assert status == 2 and fake.calls == []
    assert f"ENV '{VER}' is not an env id" in err and "denv envs" in err


# -- denv rm --all / --label


def test_rm_all_deletes_every_env_of_the_key_and_counts(
    fake: type[FakeDenv], capsys: pytest.CaptureFixture[str]
) -> None:
    fake.envs = [make_env(ENV_A), make_env(ENV_B, {"run": "x"})]
    status, out, _ = run(capsys, "rm", "--all")
    assert status == 0
    assert [c[1] for c in fake.calls if c[0] == "delete_env"] == [ENV_A, ENV_B]
    assert f"deleted {ENV_A}" in out and f"deleted {ENV_B}" in out
    assert f"deleted 2 envs of this key on {SERVER}" in out
    assert fake.envs == []
    status, out, _ = run(capsys, "rm", "--all")
    assert status == 0 and "nothing to delete" in out


def test_rm_label_deletes_only_the_envs_with_every_label(
    fake: type[FakeDenv], capsys: pytest.CaptureFixture[str]
) -> None:
    fake.envs = [
        make_env(ENV_A, {"run": "x", "team": "rl"}),
        make_env(ENV_B, {"run": "x"}),
        make_env(ENV_C, {"run": "y", "team": "rl"}),
    ]
    status, out, _ = run(capsys, "rm", "--label", "run=x", "--label", "team=rl")
    assert status == 0
    assert [c[1] for c in fake.calls if c[0] == "delete_env"] == [ENV_A]
    assert f"deleted 1 env with run=x,team=rl on {SERVER}" in out
    status, out, _ = run(capsys, "rm", "--label", "run=x", "--json")
    assert json.loads(out) == [{"id": ENV_B, "status": "deleted"}]
    assert [e.id for e in fake.envs] == [ENV_C]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        ([], "name the envs to delete, or pass --all or --label"),
        ([ENV_A, "--all"], "not both"),
        (["--all", "--label", "a=b"], "pass one"),
    ],
)
def test_rm_refuses_an_unclear_selection(
    fake: type[FakeDenv], capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    fake.envs = [make_env(ENV_A)]
    status, _, err = run(capsys, "rm", *argv)
    assert status == 2 and said in err
    assert fake.calls == []


# -- denv stop


def test_stop_with_a_remote_server_deletes_the_keys_envs(
    fake: type[FakeDenv], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DENV_SERVER", SERVER)
    stopped: list[object] = []
    monkeypatch.setattr(denv._stop_cli, "stop_local_server", stopped.append)
    fake.envs = [make_env(ENV_A), make_env(ENV_B)]
    status, out, _ = run(capsys, "stop")
    assert status == 0 and stopped == []
    assert fake.envs == []
    assert f"deleted 2 envs of this key on the denv server at {SERVER}" in out
    assert "the server keeps running" in out


def test_stop_with_a_state_dir_stops_the_local_server_whatever_denv_server_says(
    fake: type[FakeDenv], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DENV_SERVER", SERVER)
    stopped: list[object] = []
    monkeypatch.setattr(
        denv._stop_cli, "stop_local_server", lambda state_dir: stopped.append(state_dir)
    )
    fake.envs = [make_env(ENV_A)]
    status, out, _ = run(capsys, "stop", "--state-dir", "/tmp/denv-nowhere")
    assert status == 0 and stopped == ["/tmp/denv-nowhere"]
    assert "no local denv server is running" in out
    assert fake.calls == [] and len(fake.envs) == 1
