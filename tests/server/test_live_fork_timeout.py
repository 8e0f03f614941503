"""A live fork whose launcher does not answer in time fails as a live fork, saying so.

The launcher is a stand-in here (a Unix socket that answers the gate and then never the
fork): what is tested is the node's side of the control protocol, which cannot be made to
stall on demand in a real launcher. Before, the socket's timeout escaped as a bare
TimeoutError, which the API answered as an unexpected 500 (`internal`), and a fork of 32
children on a loaded machine hit it (issue 24's density run).
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from denv.server.docker.live import launcher_ctl, launcher_fork
from denv.server.node.live import LiveError


@pytest.fixture
def silent_launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """A control socket that opens the gate and then answers nothing; the ops it got."""
    path = tmp_path / "ctl.sock"
    monkeypatch.setattr(
        launcher_fork, "ctl_path", lambda pid, name="ctl.sock": str(tmp_path / name)
    )
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    ops: list[str] = []

    def serve() -> None:
        conn, _ = server.accept()
        with conn, conn.makefile("rb") as reader:
            for line in reader:
                op = json.loads(line)["op"]
                ops.append(op)
                if op in ("gate", "ungate"):
                    conn.sendall(json.dumps({"hold": False}).encode() + b"\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield ops
    server.close()


def test_a_fork_the_launcher_never_answers_is_a_live_error_naming_the_wait(
    silent_launcher: list[str],
) -> None:
    me = launcher_ctl.Proc(os.getpid(), launcher_ctl.start_time(os.getpid()) or 0)
    child = launcher_fork.ChildSpec(env_id="env_x", port=20001, work=[], kids="/k")
    with pytest.raises(LiveError) as caught:
        launcher_fork.fork(me, [child], lambda: None, 0, timeout_s=0.1)
    assert caught.value.code == "live_fork_failed"
    # the wait was the base plus one child's share, and the message says what to do
    assert f"within {0.1 + launcher_fork.CHILD_TIMEOUT_S:.0f} s" in caught.value.message
    assert "retry, or fork fewer children" in caught.value.message
    assert silent_launcher[:2] == ["gate", "fork"]
