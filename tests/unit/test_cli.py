"""The `denv` commands for people, without Docker: their errors, and the branch tree's shape.

The unknown-id case replays the `unknown_env` cassette (recorded from a real server by
`make cassettes`); the tree is built from the records the `fork` cassette replays. The
commands against a live server are in tests/e2e/test_cli_live.py.
"""

from __future__ import annotations

import dataclasses
import datetime
import json

import pytest
from cassette_match import replay as replaying
from facade_scenarios import CASSETTE_KEY, CASSETTE_SERVER, SCENARIOS, UNKNOWN_ENV

from denv import Denv, EnvStatus
from denv._cli_common import age
from denv._cli_tree import build_tree, render
from denv.cli import main


def test_every_command_says_how_to_get_a_server_when_none_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # conftest: no DENV_SERVER, and an empty state dir, so no local server either
    for argv in (["envs"], ["versions"], ["tree", UNKNOWN_ENV], ["rm", UNKNOWN_ENV]):
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert f"denv {argv[0]}: no denv server is configured" in err
        assert "`denv serve`" in err and "DENV_SERVER" in err


def test_an_unreachable_server_is_named(
    closed_port_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DENV_API_KEY", "dak_x")
    assert main(["envs", "--server", closed_port_url]) == 1
    err = capsys.readouterr().err
    assert err.startswith("denv envs: ") and closed_port_url.split("//")[1] in err


def test_an_unknown_id_is_an_error_that_says_where_to_look(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DENV_SERVER", CASSETTE_SERVER)
    monkeypatch.setenv("DENV_API_KEY", CASSETTE_KEY)
    with replaying("unknown_env.yaml"):
        assert main(["tree", UNKNOWN_ENV, "--json"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing a script would parse as an answer
    assert UNKNOWN_ENV in captured.err and "not_found" in captured.err
    assert "denv envs --all" in captured.err


def test_bad_arguments_stop_before_any_call(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tree", "nonsense", "--server", "http://127.0.0.1:9"]) == 2
    assert "neither an env id" in capsys.readouterr().err
    assert main(["diff", "env_x", "ver_y", "--server", "http://127.0.0.1:9"]) == 2
    assert "diff compares versions" in capsys.readouterr().err


def _forked() -> tuple[object, object]:
    with replaying("fork.yaml"), Denv(CASSETTE_SERVER, CASSETTE_KEY, detach=True) as denv:
        env, fork = SCENARIOS["fork"](denv)
    return env, fork


def test_the_tree_of_a_fork_holds_the_parent_its_version_and_every_child() -> None:
    env, fork = _forked()
    children = sorted(fork.envs, key=lambda e: e.id)  # type: ignore[attr-defined]
    chain = [children[0], fork.version, env]  # type: ignore[attr-defined]
    tree = build_tree(chain, [fork.version], [env, *children])  # type: ignore[attr-defined]
    assert tree.ids() == [env.id, fork.version.id, *(c.id for c in children)]  # type: ignore[attr-defined]
    as_json = tree.to_dict()
    assert as_json["kind"] == "env" and as_json["children"][0]["kind"] == "version"
    assert [c["id"] for c in as_json["children"][0]["children"]] == [c.id for c in children]
    json.dumps(as_json)  # plain JSON, for --json


def test_deleted_leaves_are_left_out_unless_asked_but_never_the_one_asked_about() -> None:
    env, fork = _forked()
    first, second = sorted(fork.envs, key=lambda e: e.id)  # type: ignore[attr-defined]
    gone = [dataclasses.replace(c, status=EnvStatus.DELETED) for c in (first, second)]
    chain = [gone[0], fork.version, env]  # type: ignore[attr-defined]
    pruned = build_tree(chain, [fork.version], [env, *gone])  # type: ignore[attr-defined]
    assert gone[0].id in pruned.ids() and gone[1].id not in pruned.ids()
    full = build_tree(chain, [fork.version], [env, *gone], show_deleted=True)  # type: ignore[attr-defined]
    assert gone[1].id in full.ids()
    # the rendered tree marks the id asked about
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(render(pruned, gone[0].id))
    lines = console.export_text().splitlines()
    (marked,) = [line for line in lines if line.rstrip().endswith("<<")]
    assert gone[0].id in marked and "deleted" in marked


def test_age_uses_the_largest_whole_unit() -> None:
    now = datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC)
    ago = [now - datetime.timedelta(seconds=s) for s in (5, 125, 7300, 200000)]
    assert [age(t, now) for t in ago] == ["5s", "2m", "2h", "2d"]
