"""No `denv` command echoes a key given on its command line, and each says how to pass one.

`denv serve --api-key KEY` (an option older docs showed) used to fail with argparse's
"unrecognized arguments: --api-key KEY": the key on the terminal and in any log capturing
it. Every subcommand is run here with key-like options it does not have (and with a key
where a number belongs); its output never holds the key, names the option, and for a key
option says where a key goes instead. So is every sub-command (`cluster up|status|down`,
`serve --cluster`). And every option a command has whose name says it takes a secret
(`--api-key`, `--api-key-file`, `--tls-key`, `--store-credentials`, found by walking the
parsers) is given a key next to another mistake, and for `serve` in place of its file: the
key is never in the output. Nothing reaches a server: parsing or the options' checks fail
first.
"""

from __future__ import annotations

import argparse
import secrets
from pathlib import Path

import pytest

from denv.cli import _SUBCOMMANDS, _load, _subparser, build_parser, main
from denv.cli_parser import KEY_ADVICE, CommandParser, is_secret_option, unrecognized_message
from denv.server.serve_cli import run as run_server

KEY = "dak_" + secrets.token_urlsafe(32)
PASSWORD = "correct-horse-battery-staple"

# What each command needs besides the bad option, so that only the bad option is wrong.
VALID: dict[str, list[str]] = {
    "envs": [],
    "run": ["img:1"],
    "snapshot": ["env_x"],
    "versions": [],
    "logs": ["env_x"],
    "rm": ["env_x"],
    "fork": ["env_x"],
    "tree": ["env_x"],
    "open": ["env_x"],
    "diff": ["ver_a", "ver_b"],
    "gc": [],
    "serve": [],
    "stop": [],
    "cluster": ["status"],
    "gvisor": ["check"],
    "conformance": ["denv-echo-env:latest"],
    "export": ["--openenv", "p@latest", "out"],
}

BAD = {
    "key": (["--api-key", KEY], "--api-key", KEY),
    "key=": ([f"--api-key={KEY}"], "--api-key", KEY),
    "token": (["--token", KEY], "--token", KEY),
    "password": (["--password", PASSWORD], "--password", PASSWORD),
}
# Every command with every bad option (`denv export` takes --api-key-file, not --api-key).
CASES = [
    pytest.param(command, *bad, id=f"{command}-{name}")
    for command in sorted(VALID)
    for name, bad in BAD.items()
]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    captured = capsys.readouterr()
    return int(exit_info.value.code or 0), captured.out + captured.err


def test_every_command_is_covered() -> None:
    assert set(VALID) == set(_SUBCOMMANDS)


@pytest.mark.parametrize(("command", "bad", "option", "secret"), CASES)
def test_a_key_option_is_named_and_its_value_not_echoed(
    command: str,
    bad: list[str],
    option: str,
    secret: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, output = run([command, *VALID[command], *bad], capsys)
    assert code == 2
    assert secret not in output and secret[4:] not in output
    assert "error: unrecognized argument" in output
    assert f"{option} and 1 value (not shown" in output
    assert "--api-key-file PATH" in output and "$DENV_API_KEY" in output  # the fix


@pytest.mark.parametrize("command", sorted(VALID))
def test_an_unknown_option_is_named_without_its_value(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, output = run([command, *VALID[command], "--no-such-option", PASSWORD], capsys)
    assert code == 2 and PASSWORD not in output
    assert "unrecognized arguments: --no-such-option and 1 value (not shown" in output
    assert KEY_ADVICE not in output  # not a key option: no advice about keys


def test_a_key_where_a_value_belongs_is_not_echoed(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["serve", "--port", KEY],
        ["fork", "env_x", "--count", KEY],
        [KEY],  # as the command
        ["cluster", KEY],
    ):
        code, output = run(argv, capsys)
        assert code == 2 and KEY not in output, argv
        assert "'***'" in output, (argv, output)


def test_python_m_denv_server_is_held_to_the_same_rule(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        run_server(["serve", "--api-key", KEY])
    output = "".join(capsys.readouterr())
    assert KEY not in output and "--api-key and 1 value" in output and "--api-key-file" in output


def test_a_key_given_as_the_key_file_is_not_echoed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the likely slip when --api-key becomes --api-key-file: the key where its path belongs
    assert main(["serve", "--state-dir", str(tmp_path), "--api-key-file", KEY]) == 2
    output = "".join(capsys.readouterr())
    assert KEY not in output
    assert "--api-key-file (No such file or directory)" in output and "$DENV_API_KEY" in output


def test_the_message_counts_values_and_names_options_once() -> None:
    assert unrecognized_message(["--x", "a", "--x=b", "c"]) == (
        "unrecognized arguments: --x and 3 values (not shown)"
    )
    assert unrecognized_message(["stray"]) == (
        "unrecognized argument: 1 value (not shown: it may be a secret)"
    )
    assert unrecognized_message(["--max-envs-per-key"]) == (
        "unrecognized argument: --max-envs-per-key"
    )


def command_paths() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every command and sub-command of `denv` (`cluster up` ...) with its parser, arguments
    added as `main` adds them; `serve --cluster` is the cluster's serve (`denv.cluster.serve`)."""
    parser = build_parser()
    found: dict[tuple[str, ...], argparse.ArgumentParser] = {}

    def walk(sub: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        found[path] = sub
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, (*path, name))

    for name, (target, _) in _SUBCOMMANDS.items():
        sub = _subparser(parser, name)
        _load(target).add_arguments(sub)  # type: ignore[attr-defined]
        walk(sub, (name,))
    cluster_serve = CommandParser(prog="denv serve", allow_abbrev=False)
    _load("denv.cluster.serve").add_arguments(cluster_serve)  # type: ignore[attr-defined]
    found[("serve", "--cluster")] = cluster_serve
    return found


PATHS = command_paths()
# The options named like a secret that take a value, per command: (command path, option).
SECRET_VALUED = sorted(
    (path, option)
    for path, sub in PATHS.items()
    for action in sub._actions
    if action.nargs != 0
    for option in action.option_strings
    if is_secret_option(option)
)


def test_every_command_and_its_secret_options_are_found() -> None:
    assert {("cluster", "up"), ("cluster", "status"), ("cluster", "down")} <= set(SUB_COMMANDS)
    assert ("serve", "--cluster") in SUB_COMMANDS
    assert {
        (("serve",), "--api-key-file"),
        (("serve",), "--tls-key"),
        (("export",), "--api-key-file"),
    } <= set(SECRET_VALUED), SECRET_VALUED
    # no command takes a key itself as a value: only a file of it
    assert not [(p, o) for p, o in SECRET_VALUED if o == "--api-key"], SECRET_VALUED


# What each sub-command needs besides, so that only the bad option is wrong.
SUB_VALID: dict[tuple[str, ...], list[str]] = {
    ("serve", "--cluster"): ["nodes=1"],
    ("cluster", "tls-ca"): ["--out", "ca"],
    ("cluster", "tls-cert"): ["--ca", "ca", "--out", "node"],
}


def leaf_args(path: tuple[str, ...]) -> list[str]:
    """The command line of a command path, with what it needs besides."""
    if path in SUB_VALID:
        return [*path, *SUB_VALID[path]]
    return [*path, *VALID.get(path[0], [])] if len(path) == 1 else list(path)


# Sub-commands (the commands themselves are checked above): `cluster up` ..., `serve --cluster`.
SUB_COMMANDS = sorted(p for p, sub in PATHS.items() if len(p) > 1 and sub._subparsers is None)


@pytest.mark.parametrize("path", SUB_COMMANDS, ids=lambda p: "-".join(p).replace("--", ""))
@pytest.mark.parametrize("option", ["--api-key", "--auth-token"])
def test_each_sub_command_hides_an_unknown_key_option(
    path: tuple[str, ...], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, output = run([*leaf_args(path), option, KEY], capsys)
    assert code == 2 and KEY not in output and KEY[4:] not in output, output
    assert f"{option} and 1 value (not shown" in output and "--api-key-file PATH" in output


@pytest.mark.parametrize(
    ("path", "option"),
    SECRET_VALUED,
    ids=[f"{'-'.join(p).replace('--', '')}{o}" for p, o in SECRET_VALUED],
)
def test_the_value_of_a_secret_option_is_never_echoed(
    path: tuple[str, ...], option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # with another argument wrong, and (for serve) the value itself wrong: a key where a
    # path belongs
    state = ["--state-dir", str(tmp_path)] if path[0] == "serve" else []
    mistakes = [["--no-such-option"]] + ([["--port", "not-a-port"]] if state else [])
    for extra in mistakes:
        argv = [*leaf_args(path), *state, option, KEY, *extra]
        try:
            code = main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
        output = "".join(capsys.readouterr())
        assert code == 2, (argv, output)
        assert KEY not in output and KEY[4:] not in output, (argv, output)
    if path[0] == "serve":  # the value alone wrong: the command reads it, and says so
        code = main([*leaf_args(path), *state, option, KEY])
        output = "".join(capsys.readouterr())
        assert code == 2 and KEY not in output and option in output, output
