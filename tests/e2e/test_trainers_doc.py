"""End to end: the snippets of docs/trainers.md marked `<!-- tested -->` run as they are.

Each runs in its own interpreter against the session's server (DENV_SERVER/DENV_API_KEY),
must exit 0 (the snippets assert on what they get back), and must leave no env running.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import LocalDenv, docker_engine

from denv import Denv

pytestmark = pytest.mark.e2e

DOC = Path(__file__).resolve().parents[2] / "docs" / "trainers.md"
TESTED = re.compile(r"<!-- tested -->\n```python\n(.*?)\n```", re.DOTALL)
SNIPPETS = TESTED.findall(DOC.read_text())


def test_the_doc_marks_its_asyncio_and_verifiers_snippets() -> None:
    assert len(SNIPPETS) == 2


@pytest.mark.parametrize("snippet", SNIPPETS, ids=["skyrl-asyncio", "verifiers-style"])
def test_snippet_runs_and_cleans_up(denv_server: LocalDenv, snippet: str) -> None:
    docker_engine("denv-echo-env:latest")
    with Denv(denv_server.url, denv_server.key) as denv:
        before = {e.id for e in denv.list_envs()}
        run = subprocess.run(
            [sys.executable, "-c", snippet],
            env={**os.environ, "DENV_SERVER": denv_server.url, "DENV_API_KEY": denv_server.key},
            capture_output=True,
            text=True,
            timeout=540,
        )
        assert run.returncode == 0, run.stderr[-4000:]
        left = {e.id for e in denv.list_envs()} - before
    assert left == set(), f"the snippet left envs running: {left}"
