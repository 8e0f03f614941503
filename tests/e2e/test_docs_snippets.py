"""End to end: every ```python block of README.md and docs/*.md runs as written.

Each block is written to a file and run as a script (`__main__`, a process of its own) with
what a reader has after `make demo`: the echo image and a denv server. The server is this
file's (zygotes on, as `denv serve` runs by default), reached through DENV_SERVER and
DENV_API_KEY (which every client the blocks make reads), under one key for every block, as a
reader's scripts share theirs. After a block exits, no env of the key remains, and no
container of the server (an env's or a warm spare's) that was not there before, except the
key's zygote: the server's own, reaped when idle. A block must exit 0; the blocks assert
on what they get back.

The blocks share one runner process (scripts/doc_snippets.py --serve) that imports
`openenv.core` once and forks a child per block: that import alone costs 10-15 s of CPU.

Blocks marked `<!-- not run: why -->` are counted: a new one fails
`test_the_docs_mark_only_these_blocks_not_run` until it is listed there.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import LocalDenv, docker_engine, leftovers, start_server

from denv import Denv
from denv.server.auth import create_api_key

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from doc_snippets import Snippet, all_snippets  # noqa: E402

pytestmark = pytest.mark.e2e

SNIPPETS = all_snippets()
RUN = [s for s in SNIPPETS if s.not_run is None]
#: The blocks that are not run, by where they are: adding one means adding it here.
NOT_RUN = {
    "docs/openenv-provider.md": 2,  # the options' signature; the capture proxy's set-up
    "docs/trainers.md": 1,  # GRPOTrainer's call: examples/trl_grpo.py runs it
}
#: Seconds a block's envs and containers get to go after it exits (a lease's envs are
#: deleted when its client closes it, on a server thread).
GONE_WITHIN_S = 30.0


def test_the_docs_mark_only_these_blocks_not_run() -> None:
    marked: dict[str, int] = {}
    for s in SNIPPETS:
        if s.not_run is not None:
            marked[s.doc] = marked.get(s.doc, 0) + 1
    assert marked == NOT_RUN, [(s.name, s.not_run) for s in SNIPPETS if s.not_run]
    assert len(RUN) >= 15


@pytest.fixture(scope="module")
def runner() -> Iterator[Any]:
    """`runner(path, env, out) -> {"returncode", "seconds"}`: one forked child per block."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "doc_snippets.py"), "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    ready = json.loads(proc.stdout.readline() or "{}")
    assert ready.get("ready"), f"the snippet runner did not start: {ready}"
    assert ready["threads"] == 1, f"the runner has {ready['threads']} threads before forking"

    def run(path: Path, env: dict[str, str], out: Path) -> dict[str, Any]:
        assert proc.stdin is not None and proc.stdout is not None
        request = {"path": str(path), "env": env, "out": str(out), "cwd": str(path.parent)}
        proc.stdin.write(json.dumps({**request, "timeout_s": 300}) + "\n")
        proc.stdin.flush()
        answer: dict[str, Any] = json.loads(proc.stdout.readline() or "{}")
        return answer

    try:
        yield run
    finally:
        proc.stdin.close()
        proc.wait(30)


@pytest.fixture(scope="module")
def docs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalDenv, str]]:
    """A server as a reader runs it (zygotes on, as `denv serve` starts by default) and the
    one API key every block uses, as a reader's scripts do: after the first block boots the
    echo env, later live starts of it copy the key's zygote instead of booting."""
    with start_server(tmp_path_factory.mktemp("denv-docs"), "--zygotes") as server:
        yield server, create_api_key(server.state_dir)


def zygote_containers(server: LocalDenv) -> set[str]:
    """Containers of the server's zygotes (server-held, never an env of a key; reaped when
    idle): not a block's leftovers."""
    with sqlite3.connect(server.state_dir / "denv.db") as db:
        ids = [
            str(r[0])
            for r in db.execute(
                "SELECT id FROM envs WHERE owner LIKE 'zygote:%' AND status != 'deleted'"
            )
        ]
    found: set[str] = set()
    for env_id in ids:
        out = subprocess.run(
            ["docker", "ps", "-aq", "--no-trunc", "--filter", f"label=denv.env={env_id}"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        found |= {c[:12] for c in out.split()}
    return found


@pytest.mark.parametrize("snippet", RUN, ids=[s.name for s in RUN])
def test_block_runs_and_leaves_nothing(
    snippet: Snippet, docs_server: tuple[LocalDenv, str], runner: Any, tmp_path: Path
) -> None:
    docker_engine("denv-echo-env:latest", build="make demo")
    denv_server, key = docs_server
    before = set(leftovers(denv_server.state_dir)["containers"])
    script = tmp_path / "snippet.py"
    script.write_text(snippet.code)
    out = tmp_path / "output.txt"
    env = {"DENV_SERVER": denv_server.url, "DENV_API_KEY": key}

    answer = runner(script, env, out)

    output = out.read_text(errors="replace") if out.exists() else ""
    assert answer.get("returncode") == 0, f"{snippet.name} failed: {answer}\n{output[-4000:]}"
    with Denv(denv_server.url, key, detach=True) as denv:
        deadline = time.monotonic() + GONE_WITHIN_S
        while True:
            envs = [e.id for e in denv.list_envs()]
            containers = set(leftovers(denv_server.state_dir)["containers"]) - before
            containers -= zygote_containers(denv_server)
            if (not envs and not containers) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert envs == [], f"{snippet.name} left envs of its key running: {envs}"
    assert containers == set(), f"{snippet.name} left containers (envs or spares): {containers}"
