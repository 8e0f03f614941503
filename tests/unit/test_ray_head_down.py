"""`denv cluster up` (and a node's restart) waiting for Ray nodes when the head is gone.

Joining a cluster whose head has exited makes `ray.init` retry for minutes; the wait must
fail at once instead, with the head's log. The head here is a real process in a session of
its own, started as `start_ray_node` starts one (`processes.spawn`), that is not Ray: what is
checked is the wait's look at the head, which comes before any call into Ray.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import ray

from denv.cluster.processes import ClusterError, session_pids, spawn
from denv.cluster.ray_nodes import wait_ray_nodes


def a_state(tmp_path: Path, cmd: list[str]) -> dict[str, Any]:
    log = tmp_path / "ray-n0.log"
    sid = spawn(cmd, log)
    with socket.socket() as s:  # a port nobody listens on (bound, then closed)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    node = {"name": "n0", "sid": sid, "log": str(log)}
    return {"dir": str(tmp_path), "address": f"127.0.0.1:{port}", "head": "n0", "nodes": [node]}


def test_a_head_that_exited_fails_the_wait_at_once_with_its_log(tmp_path: Path) -> None:
    state = a_state(tmp_path, ["sh", "-c", "echo 'raylet: the head gave up'; exit 3"])
    deadline = time.monotonic() + 10
    while session_pids(state["nodes"][0]["sid"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(ClusterError) as err:
        wait_ray_nodes(state, ["n0", "n1"], timeout_s=120)
    assert not ray.is_initialized()  # failed before joining: ray.init would retry for minutes
    assert "the Ray head n0 exited" in str(err.value)
    assert "the head gave up" in str(err.value)


def test_a_head_whose_gcs_does_not_answer_is_not_joined(tmp_path: Path) -> None:
    state = a_state(tmp_path, ["sleep", "60"])
    try:
        with pytest.raises(ClusterError, match=r"GCS at 127\.0\.0\.1:[0-9]+ does not answer"):
            wait_ray_nodes(state, ["n0"], timeout_s=2)
        assert not ray.is_initialized()  # never joined: ray.init would retry for minutes
    finally:
        os.killpg(state["nodes"][0]["sid"], signal.SIGKILL)
        os.waitpid(state["nodes"][0]["sid"], 0)
