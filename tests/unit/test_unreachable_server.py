"""A DENV_SERVER nobody listens on: every `denv` command, and the Python client's first call,
say the server cannot be reached and how to start one, whether or not a key is set (before,
a missing key was reported instead). Also: ids the commands check before sending, named by
the argument the user typed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from denv import AsyncDenv, ConnectionFailed, Denv
from denv.cli import main

VER = "ver_01JDQ5C8M9W3X7Y2Z4A6B8C0D1"
ENV = "env_01JDQ5C8M9W3X7Y2Z4A6B8C0D1"

# Every command that talks to a server (serve and cluster run one; conformance reports per
# target, as a table, and imports OpenEnv: its message is checked end to end).
COMMANDS = [
    ["envs"],
    ["versions"],
    ["logs", ENV],
    ["rm", ENV],
    ["rm", "--all"],
    ["rm", "--label", "run=a"],
    ["fork", ENV],
    ["tree", ENV],
    ["diff", VER, VER],
    ["run", "denv-echo-env:latest"],
    ["snapshot", ENV],
    ["stop"],
    ["export", "--openenv", f"p@{VER}", "out"],
]


def unreachable(url: str) -> str:
    return (
        f"cannot reach the denv server at {url} (connection refused): is it running? `denv serve`"
    )


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: " ".join(argv[:2]))
def test_every_command_says_the_server_cannot_be_reached(
    argv: list[str],
    closed_port_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("DENV_SERVER", closed_port_url)  # and no DENV_API_KEY (conftest)
    monkeypatch.chdir(tmp_path)  # where `export` would write
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"denv {argv[0]}: {unreachable(closed_port_url)}" in err
    assert "API key" not in err


def test_with_a_key_the_message_is_the_same(
    closed_port_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DENV_SERVER", closed_port_url)
    monkeypatch.setenv("DENV_API_KEY", "dak_" + "k" * 43)
    assert main(["envs"]) == 1  # after the client's retries of the connection
    assert capsys.readouterr().err.endswith(f"denv envs: {unreachable(closed_port_url)}\n")


def test_the_python_clients_first_call_says_it_too(
    closed_port_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DENV_SERVER", closed_port_url)
    with Denv() as denv, pytest.raises(ConnectionFailed) as info:
        list(denv.list_envs())
    assert str(info.value) == unreachable(closed_port_url)

    async def first_call() -> None:
        async with AsyncDenv() as client:
            await client.health()

    with pytest.raises(ConnectionFailed) as async_info:
        asyncio.run(first_call())
    assert str(async_info.value) == unreachable(closed_port_url)

    keyed = Denv(closed_port_url, "dak_" + "k" * 43, max_retries=0)
    with keyed, pytest.raises(ConnectionFailed) as keyed_info:
        keyed.health()
    assert str(keyed_info.value) == unreachable(closed_port_url)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["diff", VER, "not-a-version"], "denv diff: B 'not-a-version' is not a version id"),
        (["diff", "v1", VER], "denv diff: A 'v1' is not a version id"),
        (["envs", "--version", "v1"], "denv envs: --version 'v1' is not a version id"),
        (["snapshot", "e1"], "denv snapshot: ENV 'e1' is not an env id"),
    ],
)
def test_a_bad_id_is_named_by_its_argument_before_any_call(
    argv: list[str],
    said: str,
    closed_port_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("DENV_SERVER", closed_port_url)  # reached, it would say so instead
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert said in err
    assert "pattern" not in err and "^ver_" not in err
