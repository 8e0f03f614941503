"""`denv export` refuses, with nothing written: bad references, unknown projects and versions,
versions without an agent service, a DIR in use, names that would escape DIR.

Checks on a version's content run `make_plan` on versions as the API returns them (the
server never stores a version without an agent service, so one is written out here); the
lookups that need a server (marked e2e) ask the real local server of tests/conftest.py.
The image inspection seam is replaced where a test is about names, not images.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from denv.openenv.export import ExportError, export_version, main
from denv.openenv.export._files import openenv_files
from denv.openenv.export._plan import ImagePin, declared_tools, make_plan, parse_ref
from denv.openenv.export._write import Progress, write_tree

from denv import Denv

VID = "ver_01JDQ5C8M9W3X7Y2Z4A6B8C0D1"


def _version(**changes: Any) -> dict[str, Any]:
    version: dict[str, Any] = {
        "id": VID,
        "project": "echo",
        "parent_env_id": None,
        "parent_version_id": None,
        "agent_service": "agent",
        "services": [
            {
                "name": "agent",
                "image": "denv-echo-env:latest",
                "image_digest": "sha256:" + "a" * 64,
                "command": None,
                "env": {},
                "ports": [8000],
                "volumes": ["/work"],
                "depends_on": [],
                "health_path": "/health",
            }
        ],
        "layer_depth": 1,
        "warm_fork": False,
        "labels": {},
        "created_at": "2026-01-01T00:00:00Z",
    }
    version.update(changes)
    return version


def _pin(service: str, image: str, image_id: str) -> ImagePin:
    # As make_plan leaves a local agent image: a tag from its id plus its files' digest.
    tag = f"denv-export-base:{image_id.split(':', 1)[-1]}"
    return ImagePin(
        service, image, image_id, tag, "image content", files_digest="sha256:" + "b" * 64
    )


def _siblings(dest: Path) -> list[str]:
    return sorted(p.name for p in dest.parent.iterdir())


@pytest.mark.parametrize(
    "ref",
    ["echo", "echo@", "@latest", "echo@ver_short", "ver_01jdq5c8m9w3x7y2z4a6b8c0d1", ""],
)
def test_malformed_references_are_refused(ref: str) -> None:
    with pytest.raises(ExportError, match=r"PROJECT@|version id|no project"):
        parse_ref(ref)


def test_references_parse() -> None:
    assert parse_ref(VID) == (None, VID)
    assert parse_ref(f"echo@{VID}") == ("echo", VID)
    assert parse_ref("echo@latest") == ("echo", "latest")


def test_a_version_without_an_agent_service_is_refused() -> None:
    with pytest.raises(ExportError, match="has no agent service"):
        make_plan(_version(agent_service="web"), None, inspect=_pin)
    services = _version()["services"]
    services[0]["ports"] = []
    with pytest.raises(ExportError, match="exposes no port"):
        make_plan(_version(services=services), None, inspect=_pin)


@pytest.mark.parametrize("name", ["..", "../etc", "a/b", "a..b", ".hidden", "x" * 64, ""])
def test_service_and_project_names_that_would_escape_dir_are_refused(name: str) -> None:
    services = _version()["services"]
    services.append({**services[0], "name": name, "ports": []})
    with pytest.raises(ExportError, match=r"service .* cannot be exported"):
        make_plan(_version(services=services), None, inspect=_pin)
    with pytest.raises(ExportError, match=r"project .* cannot be exported"):
        make_plan(_version(project=name or "/"), None, inspect=_pin)


def test_tool_names_that_would_escape_dir_are_refused() -> None:
    compose = "x-denv:\n  agent: {service: agent}\n  tools: [ok_tool, ../../evil]\n"
    with pytest.raises(ExportError, match=r"tool '\.\./\.\./evil' cannot be exported"):
        declared_tools(_version(), compose, [])
    with pytest.raises(ExportError, match="tool 'a/b'"):
        declared_tools(_version(), None, ["a/b"])
    assert declared_tools(_version(), compose.replace(", ../../evil", ""), ["extra"]) == [
        "ok_tool",
        "extra",
    ]
    assert declared_tools(_version(), None, []) is None


def test_files_outside_dir_are_never_written(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    for bad in ("../escape.txt", "/etc/passwd", "server/../../x"):
        with pytest.raises(ExportError, match="outside DIR"):
            write_tree(dest, {"ok.txt": (b"ok", 0o644), bad: (b"x", 0o644)}, force=False,
                       progress=Progress(quiet=True))  # fmt: skip
        assert _siblings(dest) == [], "a refused export left files behind"


def test_a_dir_that_exists_and_is_not_empty_needs_force(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "mine.txt").write_text("keep me")
    plan = make_plan(_version(), ["echo_message"], inspect=_pin)
    files = openenv_files(plan, f"echo@{VID}")
    with pytest.raises(ExportError, match="not empty: choose another DIR, or pass --force"):
        write_tree(dest, files, force=False, progress=Progress(quiet=True))
    assert [p.name for p in dest.iterdir()] == ["mine.txt"]
    assert _siblings(dest) == ["out"]

    write_tree(dest, files, force=True, progress=Progress(quiet=True))
    assert not (dest / "mine.txt").exists()
    assert (dest / "openenv.yaml").is_file() and (dest / "server" / "app.py").is_file()
    assert _siblings(dest) == ["out"], "the temporary folders were not removed"


def test_an_empty_dir_or_a_file_as_dir(tmp_path: Path) -> None:
    plan = make_plan(_version(), None, inspect=_pin)
    empty = tmp_path / "empty"
    empty.mkdir()
    write_tree(empty, openenv_files(plan, VID), force=False, progress=Progress(quiet=True))
    assert (empty / "denv-version.json").is_file()
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ExportError, match="is not a folder"):
        write_tree(a_file, {}, force=True, progress=Progress(quiet=True))


def test_a_failure_while_writing_leaves_nothing(tmp_path: Path) -> None:
    class Boom(Exception):
        pass

    class Failing(Progress):
        def step(self, what: str) -> None:
            if "server/" in what:
                raise Boom
            super().step(what)

    plan = make_plan(_version(), None, inspect=_pin)
    dest = tmp_path / "out"
    with pytest.raises(Boom):
        write_tree(dest, openenv_files(plan, VID), force=False, progress=Failing(quiet=True))
    assert _siblings(dest) == []


def test_the_cli_reports_a_bad_dir_before_asking_the_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from denv.openenv.export import add_arguments

    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "x").write_text("x")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    # A server that cannot answer: the DIR check must come first.
    key = tmp_path / "key"
    key.write_text("k")
    server = ["--server", "http://127.0.0.1:9", "--api-key-file", str(key)]
    args = parser.parse_args(["--openenv", f"echo@{VID}", str(dest), *server])
    assert main(args) == 1
    assert "not empty" in capsys.readouterr().err


@pytest.mark.e2e
def test_unknown_projects_and_versions_are_refused(denv_server: Any, tmp_path: Path) -> None:
    dest = tmp_path / "out"
    with Denv(denv_server.url, denv_server.key) as client:
        with pytest.raises(ExportError, match="no project named 'no-such-project'"):
            export_version(client, "no-such-project@latest", dest)
        with pytest.raises(ExportError, match=f"no version {VID}"):
            export_version(client, VID, dest)
        with pytest.raises(ExportError, match=f"no version {VID}"):
            export_version(client, f"echo@{VID}", dest, kind="harbor")
    assert _siblings(dest) == []
