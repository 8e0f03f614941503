"""End to end: the `denv` commands for people against the real local server and Docker.

One env of the probe image is forked through `denv fork`, looked at with `envs`, `versions`,
`tree`, `logs` and `diff` (a file written in /work between two snapshots), and deleted with
`rm`; each command's `--json` is what these checks read, and the tables are checked to name
the same ids.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import LocalDenv, docker_engine
from provider_helpers import PROBE_APP, PROBE_IMAGE

from denv import Denv, Env
from denv.cli import main

pytestmark = pytest.mark.e2e

LABELS = {"test": "cli-live"}


@pytest.fixture
def cli(
    denv_server: LocalDenv, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Iterator[Any]:
    """`cli(*argv)` runs `denv ARGV` in-process against the test server: (status, out, err)."""
    docker_engine(PROBE_IMAGE)
    monkeypatch.setenv("DENV_SERVER", denv_server.url)
    monkeypatch.setenv("DENV_API_KEY", denv_server.key)

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        status = main(list(argv))
        captured = capsys.readouterr()
        return status, captured.out, captured.err

    yield run


@pytest.fixture
def root(denv_server: LocalDenv) -> Iterator[Env]:
    """A probe env; it and every env carrying LABELS are deleted afterwards."""
    with Denv(denv_server.url, denv_server.key) as denv:
        env = denv.create_sandbox(PROBE_IMAGE, command=["python3", "-c", PROBE_APP], labels=LABELS)
        try:
            yield env
        finally:
            for other in denv.list_envs():
                if other.labels.get("test") == LABELS["test"] or other.parent_id == env.id:
                    denv.delete_env(other.id)
            denv.delete_env(env.id)


def _json(result: tuple[int, str, str]) -> Any:
    status, out, err = result
    assert status == 0, err
    return json.loads(out)


def test_fork_envs_tree_logs_rm(cli: Any, root: Env) -> None:
    fork = _json(cli("fork", root.id, "-n", "2", "--json"))
    children = sorted(e["id"] for e in fork["envs"])
    version = fork["version"]["id"]
    assert len(children) == 2 and all(e["status"] == "healthy" for e in fork["envs"])
    assert fork["version"]["parent_env_id"] == root.id

    listed = {e["id"]: e for e in _json(cli("envs", "--json"))}
    assert {root.id, *children} <= set(listed)
    assert all(listed[c]["parent_id"] == root.id for c in children)
    status, table, _ = cli("envs")
    assert status == 0 and all(i in table for i in [root.id, *children])

    by_version = _json(cli("envs", "--version", version, "--json"))
    assert sorted(e["id"] for e in by_version) == children

    versions = {v["id"]: v for v in _json(cli("versions", "--json"))}
    assert versions[version]["parent_env_id"] == root.id
    assert versions[version]["parent_version_id"] == root.version_id

    # the tree from a child: root version -> root env -> fork version -> both children
    tree = _json(cli("tree", children[0], "--json"))
    assert tree["id"] == root.version_id and tree["kind"] == "version"
    (root_node,) = [n for n in tree["children"] if n["id"] == root.id]
    (fork_node,) = [n for n in root_node["children"] if n["id"] == version]
    assert sorted(n["id"] for n in fork_node["children"]) == children
    kids = fork_node["children"]
    assert all(n["status"] == "healthy" and n["start"] in {"warm", "cold"} for n in kids)
    status, drawn, _ = cli("tree", children[0])
    assert status == 0 and all(i in drawn for i in [root.version_id, root.id, version, *children])

    logs = _json(cli("logs", root.id, "--tail", "5", "--json"))
    assert logs["env_id"] == root.id and isinstance(logs["lines"], list)

    # rm: the children go; an unknown id is reported on its own, the others still deleted
    unknown = "env_0000000000000000000000000Z"
    status, out, err = cli("rm", *children, unknown)
    assert status == 1
    assert all(f"deleted {c}" in out for c in children)
    assert unknown in err and "not_found" in err
    live = {e["id"] for e in _json(cli("envs", "--json"))}
    assert root.id in live and not live & set(children)
    everything = {e["id"]: e["status"] for e in _json(cli("envs", "--all", "--json"))}
    assert all(everything[c] == "deleted" for c in children)
    # a deleted leaf leaves the tree unless --all; the one asked about stays
    pruned = json.dumps(_json(cli("tree", children[0], "--json")))
    assert children[0] in pruned and children[1] not in pruned
    assert children[1] in json.dumps(_json(cli("tree", children[0], "--all", "--json")))


def test_diff_lists_the_file_written_between_two_versions(
    cli: Any, root: Env, denv_server: LocalDenv
) -> None:
    before = _json(cli("fork", root.id, "-n", "1", "--json"))
    url = root.endpoints[0].url.rstrip("/")
    written = httpx.put(f"{url}/files/notes.txt", content=b"x" * 1234, trust_env=False)
    assert written.status_code == 201
    after = _json(cli("fork", root.id, "-n", "1", "--json"))
    a, b = before["version"]["id"], after["version"]["id"]

    diff = _json(cli("diff", a, b, "--json"))
    (change,) = [c for c in diff["changes"] if c["path"].endswith("/notes.txt")]
    assert change == {**change, "change": "added", "size": 1234}
    status, table, _ = cli("diff", a, b)
    assert status == 0 and "notes.txt" in table and "1 added" in table

    status, _, err = cli("diff", root.id, b)
    assert status == 2 and "diff compares versions" in err
