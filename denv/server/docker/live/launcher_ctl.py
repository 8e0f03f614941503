"""A live env's launcher, the node's side: its container's settings, and what is asked of it.

An env created with ``live: true`` runs the image's own command under denv's launcher
(``launcher/launcher.py``, mounted read-only at ``/.denv/bin``). The launcher serves the app
and a control socket; a fork copies the server process at a quiescent point into children
that run in the same container, each in user, mount and pid namespaces of its own (see
docs/live-forks.md for what separates them). This module is what the node does from the
host, as root (a fork itself: ``launcher_fork``):

- the launcher's container settings (:func:`container_settings`);
- find the server process of a booted env (:func:`root_process`), and have it make one
  throw-away copy of itself that must serve (:func:`trial`);
- which process a fork is made from (:func:`forker`), the modules a server imported, and
  their preload (:func:`modules`, :func:`preload`);
- whether a live process still runs, and kill it (:func:`alive`, :func:`kill`).

Every process is named by its host pid and its start time (``/proc/PID/stat`` field 22), so
a reused pid is never taken for a live env.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from denv.server.node.live import LiveError

log = logging.getLogger(__name__)

LAUNCHER_DIR = Path(__file__).parent / "launcher"
BIN = "/.denv/bin"
CTL_DIR = "/.denv/ctl"
WORK_DIR = "/.denv/work"
CTL_TIMEOUT_S = 10.0
# pid 1: the launcher under the image's Python (any will do: it needs the standard library);
# the image's own command follows as arguments and runs unchanged. Without a Python the
# container exits at once with NO_PYTHON_EXIT (its command never ran, with or without the
# capability the launcher would have dropped), which the boot reports as live_unsupported.
NO_PYTHON_EXIT = 197
NO_PYTHON = (
    "the image has no python3 or python on its PATH: a live env serves a Python ASGI app "
    "with uvicorn (create this env without live)"
)
_SH = rf"""
py=$(command -v python3 || command -v python) || {{
  echo "denv-live: {NO_PYTHON}" >&2; exit {NO_PYTHON_EXIT}; }}
exec "$py" /.denv/bin/launcher.py "$@"
"""


# A live env's defaults, under what its create sets: Gradio (OpenEnv's web
# interface) otherwise starts analytics threads when it loads, and a server running threads
# of its own cannot be forked (fork_unsafe).
DEFAULT_ENV = {"GRADIO_ANALYTICS_ENABLED": "False"}


def launcher_command(argv: list[str]) -> list[str]:
    """The agent's whole command (it replaces the image's entrypoint too: ``argv`` is the
    image's Entrypoint and Cmd, or the env's own command)."""
    return ["/bin/sh", "-c", _SH, "denv-live", *argv]


def container_settings(live_dir: Path) -> dict[str, Any]:
    """What the agent's container needs for live forks (merged into its create call)."""
    return {
        "binds": [(str(LAUNCHER_DIR), BIN, "ro"), (str(live_dir), WORK_DIR, "rslave")],
        "tmpfs": {CTL_DIR: "size=64k,mode=700"},
        # Only so that Docker's default seccomp profile lets unshare(2) through: the
        # launcher's pid 1 removes it from every set before the server starts.
        "cap_add": ["SYS_ADMIN"],
    }


@dataclass(frozen=True)
class Proc:
    pid: int
    start: int  # /proc/PID/stat starttime: the pid is this process, not a later one
    ctl: str = "ctl.sock"  # its control socket (a further worker of a server: its own)


def start_time(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return int(raw[raw.rindex(b")") + 2 :].split()[19])


def alive(proc: Proc) -> bool:
    return start_time(proc.pid) == proc.start


def kill(proc: Proc) -> None:
    """SIGKILL a live process (pid 1 of its pid namespace: its descendants go with it)."""
    if alive(proc):
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)


def ctl_path(pid: int, name: str = "ctl.sock") -> str:
    return f"/proc/{pid}/root{CTL_DIR}/{name}"


@contextmanager
def connect(path: str, timeout_s: float = CTL_TIMEOUT_S) -> Iterator[socket.socket]:
    """Connect to a launcher's socket; refused at first while its owner is between bind()
    and listen(), so retried until ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        try:
            sock.connect(path)
            break
        except ConnectionRefusedError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.001)
        except BaseException:
            sock.close()
            raise
    try:
        yield sock
    finally:
        sock.close()


def peer_pid(sock: socket.socket) -> int:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, _, _ = struct.unpack("3i", raw)
    return int(pid)


def ask(sock: socket.socket, req: dict[str, Any], reader: Any) -> dict[str, Any]:
    sock.sendall(json.dumps(req).encode() + b"\n")
    line = reader.readline()
    if not line:
        raise LiveError("live_fork_failed", f"the env's launcher closed the connection on {req}")
    out: dict[str, Any] = json.loads(line)
    return out


# The server's control socket is made before uvicorn binds its port (the launcher takes over
# at the first `Server.serve`), so once the env has answered its health check it is there, or
# the server is not uvicorn under the launcher: a short grace, not a wait for a boot.
ROOT_WAIT_S = 1.0


def root_process(container_pid: int, deadline_s: float = ROOT_WAIT_S) -> Proc:
    """The process in which the env's uvicorn serves under the launcher (any descendant of
    the container's pid 1: a shell, a start script or gunicorn may sit between), by the
    peer credentials of its control socket. 409 ``live_unsupported`` when no process took
    the launcher on, with the server's own reason when it gave one (``refused``)."""
    root = f"/proc/{container_pid}/root{CTL_DIR}"
    end = time.monotonic() + deadline_s
    while True:
        try:
            why = Path(f"{root}/refused").read_text().strip()
        except FileNotFoundError:
            why = ""
        except OSError as exc:
            raise LiveError("live_fork_failed", f"the env's container ended ({exc})") from exc
        if why:
            raise LiveError("live_unsupported", f"its server cannot be copied: {why}")
        if os.path.exists(f"{root}/ctl.sock"):
            with connect(f"{root}/ctl.sock") as sock:
                pid = peer_pid(sock)
            st = start_time(pid)
            if st is not None:
                return Proc(pid, st)
        if time.monotonic() > end:
            raise LiveError(
                "live_unsupported",
                "no Python process of its container serves an ASGI app with uvicorn (the "
                "server is another program, or its Python runs with -I or -E, which ignore "
                "PYTHONPATH)",
            )
        time.sleep(0.02)


def forker(proc: Proc) -> Proc:
    """The process a fork of the live server ``proc`` is made from: ``proc`` itself, or for
    a server of several workers (gunicorn ``-w N``, ``uvicorn --workers N``: each worker
    has a control socket of its own) the worker whose OpenEnv session was active last, the
    session a fork continues."""
    root = f"/proc/{proc.pid}/root{CTL_DIR}"
    try:
        others = sorted(n for n in os.listdir(root) if WORKER_SOCKET.fullmatch(n))
    except OSError:
        return proc
    if not others:
        return proc
    best, latest = proc, _activity(ctl_path(proc.pid))[1]
    for name in others:
        try:
            pid, active = _activity(f"{root}/{name}")
        except (OSError, LiveError, ValueError):
            continue  # a worker that ended (gunicorn starts another)
        start = start_time(pid)
        if start is not None and active > latest:
            best, latest = Proc(pid, start, name), active
    return best


# A further worker's control socket: ctl.<its pid>.sock.
WORKER_SOCKET = re.compile(r"ctl\.\d+\.sock")


def _activity(path: str) -> tuple[int, float]:
    """(host pid, when its last OpenEnv session was active) of the launcher at ``path``."""
    with connect(path, CTL_TIMEOUT_S) as sock:
        out = ask(sock, {"op": "activity"}, sock.makefile("rb"))
        return peer_pid(sock), float(out.get("last_active") or 0.0)


def hello(proc: Proc) -> dict[str, Any]:
    with connect(ctl_path(proc.pid)) as sock:
        return ask(sock, {"op": "hello"}, sock.makefile("rb"))


# How long the trial copy of a server that just booted may take to serve: the launcher's bound,
# and the socket's with a margin for a busy machine.
TRIAL_TIMEOUT_S = 10.0


def trial(proc: Proc) -> float | None:
    """Have a booted live server make one throw-away copy of itself that serves one request
    (the launcher's ``trial``): the ms it took, or None when no trial was made (a launcher
    that predates trials; a server busy or running threads of its own, whose forks are
    refused one by one as before). 409 ``live_unsupported`` when the copy could not serve,
    with why: such a server runs without live forks (``live: auto``) instead of failing
    every fork and every copy of its zygote."""
    with connect(ctl_path(proc.pid), TRIAL_TIMEOUT_S + CTL_TIMEOUT_S) as sock:
        out = ask(sock, {"op": "trial", "timeout_s": TRIAL_TIMEOUT_S}, sock.makefile("rb"))
    if out.get("error") == "trial_failed":
        raise LiveError(
            "live_unsupported",
            f"a copy of its server could not serve ({out.get('message')}): the server holds "
            "state a live fork cannot copy",
        )
    if "error" in out:
        log.info("no trial copy of live server %d: %s", proc.pid, out.get("message"))
        return None
    ms = float(out.get("ms", 0.0))
    log.info("the trial copy of live server %d served in %.0f ms", proc.pid, ms)
    return ms


def modules(proc: Proc) -> list[str]:
    """The modules a live server process has imported (its launcher's ``hello``)."""
    return [str(m) for m in hello(proc).get("modules") or []]


def preload(proc: Proc, names: list[str], timeout_s: float = 60.0) -> dict[str, Any]:
    """Have a live server process import ``names`` and serve one session-less warm-up
    request in-process (see the launcher's ``preload``)."""
    with connect(ctl_path(proc.pid), timeout_s) as sock:
        req = {"op": "preload", "modules": names, "warm": True}
        return ask(sock, req, sock.makefile("rb"))
