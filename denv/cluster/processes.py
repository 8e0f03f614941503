"""The processes of a local cluster: each a session of its own, recorded in ``cluster.json``.

Every Ray node and ``denv serve`` is started in a session of its own (``spawn``) and recorded
by its session id as soon as it starts, so that another process (``denv cluster down``, a
failed ``up``, a test) can find all of it again and stop it, Ray's workers included (they have
process groups of their own but stay in their node's session): SIGTERM first, SIGKILL after a
grace. SeaweedFS keeps its own record (``seaweed``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

STATE_FILE = "cluster.json"
STOP_GRACE_S = 5.0  # then SIGKILL (a Ray head's `ray start --block` seldom ends on SIGTERM)


class ClusterError(Exception):
    """The local cluster cannot be started or stopped; the message says why and the fix."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def read_state(cluster_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((cluster_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_state(cluster_dir: Path, state: dict[str, Any]) -> None:
    path = cluster_dir / STATE_FILE
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(state, out, indent=2)
    os.replace(tmp, path)


# processes, by session (each Ray node, the server, SeaweedFS is a session of its own)
def session_pids(sid: int) -> list[int]:
    """Every process of session ``sid`` (Ray's workers have process groups of their own but
    stay in their node's session)."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def stop_session(sid: int, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM every process of session ``sid``, SIGKILL what is left after ``grace_s``."""
    stop_sessions([sid], grace_s)


def stop_sessions(sids: list[int], grace_s: float = STOP_GRACE_S) -> None:
    """``stop_session`` of several sessions at once."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        pids = [pid for sid in sids for pid in session_pids(sid)]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(session_pids(sid) for sid in sids):
            _reap()
            time.sleep(0.1)
    _reap()


def _reap() -> None:
    """Collect exited children of this process (nodes it started), so none stays a zombie."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def spawn(cmd: list[str], log_path: Path, env: dict[str, str] | None = None) -> int:
    """Start ``cmd`` in a session of its own, its output appended to ``log_path``; its pid,
    which is the session's id."""
    # The API key and Ray's token reach processes in files, never through the environment.
    inherited = {k: v for k, v in os.environ.items() if k not in ("DENV_API_KEY", "RAY_AUTH_TOKEN")}
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own session: outlives `up`, found again by `down`
            env={**inherited, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})},
        )
    return proc.pid


def tail(path: Path, lines: int = 8) -> str:
    """The last lines of a process's log, for an error saying why it exited."""
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"
