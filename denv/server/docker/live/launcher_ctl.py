"""Live forks, the node's side: a running server process copied, memory included.

An env created with ``live: true`` runs the image's own command under denv's launcher
(``launcher/launcher.py``, mounted read-only at ``/.denv/bin``). The launcher serves the app
and a control socket; a fork copies the server process at a quiescent point into children
that run in the same container, each in user, mount and pid namespaces of its own (see
docs/live-forks.md for what separates them). This module is what the node does from the
host, as root:

- the launcher's container settings (:func:`container_settings`);
- find the server process of a booted env (:func:`root_process`), and have it make one
  throw-away copy of itself that must serve (:func:`trial`);
- gate, fork, and plumb each child: its uid/gid maps (which the child cannot write itself),
  then ``setup``, after which it serves (:func:`fork`);
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
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
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
# A fork's wait grows by this much per child: the parent clones them one after another and
# each sets up on CPU the machine shares, so fork(32) on a loaded machine outlasts 10 s.
CHILD_TIMEOUT_S = 0.5
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
def _connect(path: str, timeout_s: float = CTL_TIMEOUT_S) -> Iterator[socket.socket]:
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


def _peer_pid(sock: socket.socket) -> int:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, _, _ = struct.unpack("3i", raw)
    return int(pid)


def _ask(sock: socket.socket, req: dict[str, Any], reader: Any) -> dict[str, Any]:
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
            with _connect(f"{root}/ctl.sock") as sock:
                pid = _peer_pid(sock)
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


# Called for each child before its set-up: (env, host pid) -> the child's network, or None.
Placed = Callable[[str, int], "dict[str, Any] | None"]


@dataclass(frozen=True)
class ChildSpec:
    env_id: str
    port: int
    work: list[tuple[str, str]]  # (slot inside the container, the volume's path)
    kids: str  # where its own children's slots appear: bound on /.denv/work in the child
    reseed: bool = True  # fresh entropy for random and NumPy's global generator
    net: bool = False  # a network namespace of its own (the node connects it: ``placed``)
    # its root filesystem's overlay inside the container, which it makes its root; "": it
    # keeps its container's (``live_root``)
    root: str = ""


def fork(
    parent: Proc,
    children: list[ChildSpec],
    snapshot: Any,
    depth: int,
    placed: Placed | None = None,
    timeout_s: float = CTL_TIMEOUT_S,
    merge: bool = False,
) -> tuple[list[Proc | LiveError], dict[str, float]]:
    """Gate ``parent``, fork the children, call ``snapshot()`` (the node captures /work and
    mounts each child's slot) while the parent clones them, reopen the gate, plumb each
    child as it shows up: a Proc, or the LiveError of that child. ``placed(env, pid)`` runs
    for each child before it is set up (before it runs env code again); what it returns
    (its network, for a child with a namespace of its own) goes into the child's ``setup``.

    The parent's gate stays closed from the gate to the end of ``snapshot()`` (so /work is
    captured as the children see it); a launcher without ``hold`` (started by an older
    denv) is asked in the old order: snapshot, then fork. Each wait is ``timeout_s`` plus
    ``CHILD_TIMEOUT_S`` per child; one that runs out is a ``LiveError`` saying so.
    ``merge``: the parent marks its memory for same-page merging first (``--merge-pages``).
    """
    timeout_s += CHILD_TIMEOUT_S * len(children)
    try:
        return _fork(parent, children, snapshot, depth, placed, timeout_s, merge)
    except TimeoutError as exc:  # a socket's read or the answer's wait: not an internal error
        raise LiveError(
            "live_fork_failed",
            f"the env's launcher did not answer within {timeout_s:.0f} s ({exc or 'timed out'}): "
            "the machine may be short of CPU; retry, or fork fewer children at once",
        ) from exc


def _fork(
    parent: Proc,
    children: list[ChildSpec],
    snapshot: Any,
    depth: int,
    placed: Placed | None,
    timeout_s: float,
    merge: bool,
) -> tuple[list[Proc | LiveError], dict[str, float]]:
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    if not alive(parent):
        raise LiveError("env_not_running", "the env's server process has ended")
    specs = [
        {
            "env": c.env_id,
            "port": c.port,
            "work": c.work,
            "kids": c.kids,
            "reseed": c.reseed,
            "net": c.net,
            **({"root": c.root} if c.root else {}),
        }
        for c in children
    ]
    with (
        _connect(ctl_path(parent.pid, parent.ctl), timeout_s) as sock,
        ThreadPoolExecutor(max(1, min(len(children), 8)) + 1, "denv-live-plumb") as pool,
    ):
        reader = sock.makefile("rb")
        out = _ask(sock, {"op": "gate", "timeout_s": timeout_s}, reader)
        if "error" in out:
            raise LiveError(str(out["error"]), str(out.get("message", "")))
        t1 = time.perf_counter()
        timings["gate_ms"] = (t1 - t0) * 1e3
        held = bool(out.get("hold"))
        captured = threading.Event()

        def forked() -> dict[str, str]:
            """The fork's answer (children never forked, and why); with hold, the gate is
            reopened here once the snapshot is done."""
            answer = _read(reader, "fork")
            timings["fork_ms"] = (time.perf_counter() - t1) * 1e3
            if held:
                captured.wait()
                _ask(sock, {"op": "ungate"}, reader)
            if "error" in answer:
                raise LiveError("live_fork_failed", str(answer.get("message", answer["error"])))
            return dict(answer.get("failed") or {})

        if not held:
            _snapshot_or_ungate(snapshot, sock, reader)
        ask = {"op": "fork", "children": specs, "hold": held, **({"merge": True} if merge else {})}
        sock.sendall(json.dumps(ask).encode() + b"\n")
        answer = pool.submit(forked)
        if held:
            try:
                snapshot()
            except BaseException:
                captured.set()  # the answer's thread reopens the gate
                _discard(parent, children, answer, timeout_s)
                raise
            captured.set()
        t2 = time.perf_counter()
        timings["snapshot_ms"] = (t2 - t1) * 1e3
        results = _plumb_all(parent, children, answer, pool, depth, placed, timeout_s)
        timings["plumb_ms"] = (time.perf_counter() - t2) * 1e3
    return results, timings


def _snapshot_or_ungate(snapshot: Any, sock: socket.socket, reader: Any) -> None:
    try:
        snapshot()
    except BaseException:
        _ask(sock, {"op": "ungate"}, reader)
        raise


def _read(reader: Any, what: str) -> dict[str, Any]:
    line = reader.readline()
    if not line:
        raise LiveError("live_fork_failed", f"the env's launcher closed the connection on {what}")
    out: dict[str, Any] = json.loads(line)
    return out


def _plumb_all(
    parent: Proc,
    children: list[ChildSpec],
    answer: Future[dict[str, str]],
    pool: ThreadPoolExecutor,
    depth: int,
    placed: Placed | None,
    timeout_s: float,
) -> list[Proc | LiveError]:
    """Set each child up as soon as its bootstrap socket shows up (the parent may still be
    cloning the others); the fork's answer names those that were never forked."""
    pending = {c.env_id: c for c in children}
    found: dict[str, Future[Proc | LiveError]] = {}
    not_forked: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        if answer.done() and not not_forked and answer.exception() is None:
            not_forked = answer.result()
            for env_id in not_forked:
                pending.pop(env_id, None)
        for env_id in list(pending):
            path = ctl_path(parent.pid, f"{env_id}.sock")
            if os.path.exists(path):
                del pending[env_id]
                found[env_id] = pool.submit(_plumb, parent, env_id, path, depth, placed, timeout_s)
        if answer.done() and answer.exception() is not None:
            break
        if pending:
            time.sleep(0.0005)
    error = answer.exception(timeout=timeout_s)
    results: list[Proc | LiveError] = []
    for c in children:
        if c.env_id in found:
            results.append(found[c.env_id].result())
        elif c.env_id in not_forked:
            why = not_forked[c.env_id]
            results.append(LiveError("live_fork_failed", f"the fork failed: {why}"))
        else:
            results.append(LiveError("live_fork_failed", "the child did not come up"))
    if error is not None:  # the fork failed as a whole: end whatever was set up meanwhile
        for r in results:
            if isinstance(r, Proc):
                kill(r)
        raise error
    return results


def _discard(
    parent: Proc, children: list[ChildSpec], answer: Future[dict[str, str]], timeout_s: float
) -> None:
    """End the children of a fork whose snapshot failed: each waits for its set-up on its
    bootstrap socket, and a connection closed without one ends it."""
    with contextlib.suppress(Exception):
        not_forked = answer.result(timeout=timeout_s)
        deadline = time.monotonic() + min(timeout_s, 2.0)
        left = [c.env_id for c in children if c.env_id not in not_forked]
        while left and time.monotonic() < deadline:
            for env_id in list(left):
                path = ctl_path(parent.pid, f"{env_id}.sock")
                if os.path.exists(path):
                    left.remove(env_id)
                    with contextlib.suppress(OSError), _connect(path, 1.0):
                        pass
            time.sleep(0.001)


def _plumb(
    parent: Proc,
    env_id: str,
    path: str,
    depth: int,
    placed: Placed | None,
    timeout_s: float,
) -> Proc | LiveError:
    try:
        with _connect(path, timeout_s) as sock:
            pid = _peer_pid(sock)
            st = start_time(pid)
            if st is None:
                return LiveError("live_fork_failed", "the child ended before its set-up")
            write_id_maps(pid, parent.pid if depth > 0 else None)
            net = placed(env_id, pid) if placed is not None else None
            req: dict[str, Any] = {"op": "setup", **({"net": net} if net else {})}
            out = _ask(sock, req, sock.makefile("rb"))
            if "error" in out:
                return LiveError("live_fork_failed", str(out.get("message")))
            return Proc(pid, st)
    except (OSError, ValueError) as exc:
        return LiveError("live_fork_failed", f"setting up the child failed: {exc}")


def write_id_maps(pid: int, forker: int | None) -> None:
    """``0 0 1`` for the child's uid and gid maps: root in its namespace is its forker's root.

    Only a process in the parent user namespace with CAP_SETFCAP there may map uid 0, so a
    child of a live child (whose forker is in a user namespace of its own) is mapped from
    inside the forker's namespace (``nsenter``).
    """
    if forker is None:
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write("0 0 1\n")
        return
    script = f"echo '0 0 1' > /proc/{pid}/uid_map && echo '0 0 1' > /proc/{pid}/gid_map"
    proc = subprocess.run(
        ["nsenter", f"--user=/proc/{forker}/ns/user", "--", "/bin/sh", "-c", script],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise OSError(f"writing the uid/gid maps of {pid} failed: {proc.stderr.strip()}")


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
    with _connect(path, CTL_TIMEOUT_S) as sock:
        out = _ask(sock, {"op": "activity"}, sock.makefile("rb"))
        return _peer_pid(sock), float(out.get("last_active") or 0.0)


def hello(proc: Proc) -> dict[str, Any]:
    with _connect(ctl_path(proc.pid)) as sock:
        return _ask(sock, {"op": "hello"}, sock.makefile("rb"))


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
    with _connect(ctl_path(proc.pid), TRIAL_TIMEOUT_S + CTL_TIMEOUT_S) as sock:
        out = _ask(sock, {"op": "trial", "timeout_s": TRIAL_TIMEOUT_S}, sock.makefile("rb"))
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
    with _connect(ctl_path(proc.pid), timeout_s) as sock:
        req = {"op": "preload", "modules": names, "warm": True}
        return _ask(sock, req, sock.makefile("rb"))
