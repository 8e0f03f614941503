"""Where a client finds its denv server, and the local server it can find or start.

The one rule for the server and key (`resolve_server`): the argument first, then
DENV_SERVER / DENV_API_KEY, then the local server of the state directory; otherwise a
`DenvConfigError` that says what to set or start.

The one rule for the state directory (`state_dir`): $DENV_STATE_DIR, else
~/.local/share/denv. The local server (`denv serve`) writes `server.json` (its URL and pid)
and `api_key` there; `read_local_server` reads them and returns the server only when it
answers `/v1/health`; `ensure_local_server` starts `python -m denv.server --port 0` in the
background when none answers, then waits for it; `stop_local_server` stops it.

    from denv import Denv
    from denv.local import ensure_local_server

    server = ensure_local_server()
    with Denv(server.url, server.api_key) as denv:
        print(denv.health())
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

from ..progress import say
from ._config import ENV_API_KEY, ENV_SERVER
from ._errors import cannot_reach
from ._http import proxy_for, tls_verify
from .errors import DenvConfigError, LocalServerError

__all__ = [
    "ENV_API_KEY",
    "ENV_SERVER",
    "ENV_STATE_DIR",
    "LocalServer",
    "ensure_local_server",
    "read_local_server",
    "resolve_server",
    "state_dir",
    "stop_local_server",
]

#: The variable that moves the local server's state directory.
ENV_STATE_DIR = "DENV_STATE_DIR"
#: The local server keeps its database, key and layers here unless $DENV_STATE_DIR says otherwise.
DEFAULT_STATE_DIR = Path("~/.local/share/denv")
#: Seconds `read_local_server` waits for the server's health answer.
HEALTH_TIMEOUT_S = 2.0
START_POLL_S = 0.05

PathArg = str | os.PathLike[str] | None


def state_dir(override: PathArg = None) -> Path:
    """The local server's state directory: `override`, else $DENV_STATE_DIR, else
    ~/.local/share/denv (user-expanded, not resolved)."""
    if override is not None:
        return Path(override).expanduser()
    configured = os.environ.get(ENV_STATE_DIR)
    return Path(configured).expanduser() if configured else DEFAULT_STATE_DIR.expanduser()


@dataclass(frozen=True)
class LocalServer:
    """A running local server: its base URL, the API key it accepts, its state dir and pid."""

    url: str
    api_key: str
    state_dir: Path
    pid: int | None = None

    def __repr__(self) -> str:  # never show the key
        return f"LocalServer(url={self.url!r}, state_dir={str(self.state_dir)!r}, pid={self.pid})"


def read_local_server(state_dir: PathArg = None) -> LocalServer | None:
    """The local server of `state_dir` (default: `state_dir()`) when it is up, else None."""
    root = _root(state_dir)
    try:
        info = json.loads((root / "server.json").read_text())
        key = (root / "api_key").read_text().strip()
        url = str(info["url"]).rstrip("/")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not key:
        return None
    try:
        res = httpx.get(
            f"{url}/v1/health", timeout=HEALTH_TIMEOUT_S, trust_env=False, verify=tls_verify()
        )
        if res.status_code != 200 or res.json().get("status") != "ok":
            return None
    except (httpx.HTTPError, ValueError):
        return None
    pid = info.get("pid")
    return LocalServer(
        url=url, api_key=key, state_dir=root, pid=pid if isinstance(pid, int) else None
    )


def ensure_local_server(state_dir: PathArg = None, timeout_s: float = 60.0) -> LocalServer:
    """The running local server, started in the background (detached) when none answers.

    Raises `LocalServerError` with the end of its output when it does not come up in time.
    """
    root = _root(state_dir)
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
        say(
            "starting the local denv server (first use; state in %s, its log in server.out "
            "there) ...",
            root,
        )
        started = time.monotonic()
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
                say(
                    "the local denv server is up at %s after %.1fs; it keeps running for "
                    "the next script (stop it: denv stop)",
                    found.url,
                    time.monotonic() - started,
                )
                return found
            if proc.poll() is not None:
                break
            time.sleep(START_POLL_S)
    tail = _tail(root / "server.out")
    raise LocalServerError(
        f"the local denv server did not start within {timeout_s:.0f}s "
        f"(exit code {proc.poll()}); its output ends with:\n{tail}\n"
        "Is Docker running (docker info)? Is denv[server] installed?"
    )


def stop_local_server(state_dir: PathArg = None, timeout_s: float = 30.0) -> LocalServer | None:
    """Stop the local server of `state_dir` (SIGTERM, then wait); None when none runs.

    Its envs keep running and are reconciled by the next start; delete them first
    (`Denv.delete_env`) to free their containers.
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
    raise LocalServerError(
        f"the local denv server (pid {found.pid}) did not stop within {timeout_s:.0f}s"
    )


def resolve_server(
    server: str | None = None, api_key: str | None = None, *, start: bool = False
) -> tuple[str, str]:
    """(server URL, API key): the arguments, then DENV_SERVER/DENV_API_KEY, then the local
    server, which is started when `start` is true and none answers.

    The local server's key goes only to the local server's URL. Raises `DenvConfigError`
    when no server or no key is found, and `ConnectionFailed` instead of the latter when the
    server cannot be reached either (the first thing to fix).
    """
    server = server or os.environ.get(ENV_SERVER) or None
    api_key = api_key or os.environ.get(ENV_API_KEY) or None
    if server is None or api_key is None:
        local = ensure_local_server() if start and server is None else read_local_server()
        if local is not None:
            if server is None:
                server = local.url
            if api_key is None and server.rstrip("/") == local.url.rstrip("/"):
                api_key = local.api_key
    if server is None:
        raise DenvConfigError(
            "no denv server is configured and no local one is running: start one with "
            "`denv serve` (needs `pip install 'denv[server]'` and Docker), or set "
            f"{ENV_SERVER} and {ENV_API_KEY}"
        )
    if api_key is None:
        # A server nobody answers at is the first thing to fix: say so, not "no key".
        _check_reachable(server.rstrip("/"))
        raise DenvConfigError(
            f"no API key for the denv server at {server}: set {ENV_API_KEY} or pass "
            f"api_key= (the local server keeps its key in {state_dir() / 'api_key'})"
        )
    return server.rstrip("/"), api_key


def _check_reachable(server: str) -> None:
    """Raise `ConnectionFailed` when no connection to `server` can be made (its health
    needs no key)."""
    url = f"{server}/v1/health"
    try:
        with httpx.Client(
            timeout=HEALTH_TIMEOUT_S, trust_env=False, verify=tls_verify(), proxy=proxy_for(server)
        ) as client:
            client.get(url)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise cannot_reach(server, exc, method="GET", url=url) from exc
    except httpx.HTTPError:
        pass  # it answered, somehow: what is missing is still the key


def _root(override: PathArg) -> Path:
    return state_dir(override)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


def _alive(pid: int) -> bool:
    """True while `pid` runs; an exited child not yet reaped (a zombie) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
