"""A live container's pid 1 is asked of the engine once while it runs (each delete of a
live env finds its container's cgroups from it), and asked again once that process is
gone: a restarted container's new pid, a removed container's 0. A real container."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from denv.server.docker.engine import Engine
from denv.server.docker.node import DockerNode
from denv.server.volumes.overlay import Volumes

pytestmark = pytest.mark.e2e

IMAGE = "denv-python-base:3.11"


def docker(*args: str) -> str:
    return subprocess.run(["docker", *args], check=True, capture_output=True, text=True).stdout


def engine_pid(cid: str) -> int:
    return int(docker("inspect", "-f", "{{.State.Pid}}", cid).strip())


def test_a_containers_pid_is_asked_once_while_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = DockerNode(Engine("pidtest"), Volumes(tmp_path))
    asked: list[str] = []
    real = node.engine.inspect

    def counted(cid: str) -> dict[str, Any] | None:
        asked.append(cid)
        return real(cid)

    monkeypatch.setattr(node.engine, "inspect", counted)
    try:
        cid = docker("run", "-d", "--rm", IMAGE, "sleep", "120").strip()
        try:
            first = node.live.container_pid(cid)
            assert first == engine_pid(cid)
            assert node.live.container_pid(cid) == first
            assert asked == [cid]  # the second answer came from what the node remembered

            docker("restart", "-t", "0", cid)  # pid 1 ends; the container runs again
            again = node.live.container_pid(cid)
            assert again == engine_pid(cid) != first
            assert asked == [cid, cid]
        finally:
            docker("rm", "-f", cid)
        assert node.live.container_pid(cid) == 0  # gone: the engine is asked, and says so
        assert cid not in node.live._pids
    finally:
        node.stop()
