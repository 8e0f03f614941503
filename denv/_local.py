"""Finding (and starting) the local denv server of a state directory.

``read_local_server()`` reads ``<state_dir>/server.json`` and ``<state_dir>/api_key`` and
returns them only when the server answers ``/v1/health``; ``ensure_local_server()`` starts
``python -m denv.server --port 0`` in the background when none answers, then waits for it.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

HEALTH_TIMEOUT_S = 2.0
START_POLL_S = 0.05


@dataclass(frozen=True)
class LocalServer:
    """A running local server: its base URL and the API key it accepts."""

    url: str
    api_key: str
    state_dir: Path
    pid: int | None = None

    def __repr__(self) -> str:  # never show the key
        return f"LocalServer(url={self.url!r}, state_dir={str(self.state_dir)!r}, pid={self.pid})"


def _state_dir(state_dir: str | os.PathLike[str] | None) -> Path:
    if state_dir is not None:
        return Path(state_dir).expanduser()
    env = os.environ.get("DENV_STATE_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".local" / "share" / "denv"


def read_local_server(state_dir: str | os.PathLike[str] | None = None) -> LocalServer | None:
    """The local server of ``state_dir`` (default ``$DENV_STATE_DIR`` or ~/.local/share/denv)
    when it is up, else None."""
    root = _state_dir(state_dir)
    try:
        info = json.loads((root / "server.json").read_text())
        key = (root / "api_key").read_text().strip()
        url = str(info["url"]).rstrip("/")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not key:
        return None
    try:
        res = httpx.get(f"{url}/v1/health", timeout=HEALTH_TIMEOUT_S, trust_env=False)
        if res.status_code != 200 or res.json().get("status") != "ok":
            return None
    except (httpx.HTTPError, ValueError):
        return None
    pid = info.get("pid")
    return LocalServer(
        url=url, api_key=key, state_dir=root, pid=pid if isinstance(pid, int) else None
    )


def ensure_local_server(
    state_dir: str | os.PathLike[str] | None = None, timeout_s: float = 60.0
) -> LocalServer:
    """The running local server, started in the background (detached) when none answers.

    Raises RuntimeError with the end of ``server.log`` when it does not come up in time.
    """
    root = _state_dir(state_dir)
    found = read_local_server(root)
    if found is not None:
        return found
    root.mkdir(parents=True, exist_ok=True)
    # One starter at a time per state dir; the others find the server it started.
    with open(root / "serve.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = read_local_server(root)
        if found is not None:
            return found
        with open(root / "server.out", "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "denv.server", "--port", "0", "--state-dir", str(root)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = read_local_server(root)
            if found is not None:
                return found
            if proc.poll() is not None:
                break
            time.sleep(START_POLL_S)
    tail = _tail(root / "server.out")
    raise RuntimeError(
        f"the local denv server did not start within {timeout_s:.0f}s "
        f"(exit code {proc.poll()}); its output ends with:\n{tail}\n"
        "Is Docker running (docker info)? Is denv[server] installed?"
    )


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


def stop_local_server(
    state_dir: str | os.PathLike[str] | None = None, timeout_s: float = 30.0
) -> LocalServer | None:
    """Stop the local server of ``state_dir`` (SIGTERM, then wait); None when none runs.

    Its envs keep running and are reconciled by the next start; delete them first
    (``DELETE /v1/envs/{id}``) to free their containers.
    """
    found = read_local_server(state_dir)
    if found is None or found.pid is None:
        return None
    try:
        os.kill(found.pid, signal.SIGTERM)
    except ProcessLookupError:
        return found
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(found.pid):
            return found
        time.sleep(START_POLL_S)
    raise RuntimeError(
        f"the local denv server (pid {found.pid}) did not stop within {timeout_s:.0f}s"
    )


def _alive(pid: int) -> bool:
    """True while ``pid`` runs; an exited child not yet reaped (a zombie) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
