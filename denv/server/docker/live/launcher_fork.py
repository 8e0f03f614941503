"""A live fork, the node's exchange with the launcher: gate the parent, fork, plumb each child.

The parent (a live server, under its container's launcher) is gated at a quiescent point and
clones its children, each in user, mount and pid namespaces of its own; meanwhile the node
captures the parent's volumes and mounts each child's (``snapshot``). Each child is then
plumbed as it shows up: its uid/gid maps (which the child cannot write itself), its cgroups
and network (``placed``), then ``setup``, after which it serves (:func:`fork`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from denv.server.docker.live.launcher_ctl import (
    CTL_TIMEOUT_S,
    Proc,
    alive,
    ask,
    connect,
    ctl_path,
    kill,
    peer_pid,
    start_time,
)
from denv.server.node.live import LiveError

# A fork's wait grows by this much per child: the parent clones them one after another and
# each sets up on CPU the machine shares, so fork(32) on a loaded machine outlasts 10 s.
CHILD_TIMEOUT_S = 0.5


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
    # keeps its container's (``rootfs``)
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
    specs = [_wire(c) for c in children]
    with (
        connect(ctl_path(parent.pid, parent.ctl), timeout_s) as sock,
        ThreadPoolExecutor(max(1, min(len(children), 8)) + 1, "denv-live-plumb") as pool,
    ):
        reader = sock.makefile("rb")
        out = ask(sock, {"op": "gate", "timeout_s": timeout_s}, reader)
        if "error" in out:
            raise LiveError(str(out["error"]), str(out.get("message", "")))
        t1 = time.perf_counter()
        timings["gate_ms"] = (t1 - t0) * 1e3
        held = bool(out.get("hold"))
        captured = threading.Event()
        if not held:
            _snapshot_or_ungate(snapshot, sock, reader)
        req = {"op": "fork", "children": specs, "hold": held, **({"merge": True} if merge else {})}
        sock.sendall(json.dumps(req).encode() + b"\n")
        answer = pool.submit(_forked, sock, reader, held, captured, timings, t1)
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


def _wire(c: ChildSpec) -> dict[str, Any]:
    """What the launcher's fork is told of a child."""
    return {
        "env": c.env_id,
        "port": c.port,
        "work": c.work,
        "kids": c.kids,
        "reseed": c.reseed,
        "net": c.net,
        **({"root": c.root} if c.root else {}),
    }


def _forked(
    sock: socket.socket,
    reader: Any,
    held: bool,
    captured: threading.Event,
    timings: dict[str, float],
    t1: float,
) -> dict[str, str]:
    """The fork's answer (children never forked, and why); with hold, the gate is reopened
    here once the snapshot is done (``captured``)."""
    answer = _read(reader, "fork")
    timings["fork_ms"] = (time.perf_counter() - t1) * 1e3
    if held:
        captured.wait()
        ask(sock, {"op": "ungate"}, reader)
    if "error" in answer:
        raise LiveError("live_fork_failed", str(answer.get("message", answer["error"])))
    return dict(answer.get("failed") or {})


def _snapshot_or_ungate(snapshot: Any, sock: socket.socket, reader: Any) -> None:
    try:
        snapshot()
    except BaseException:
        ask(sock, {"op": "ungate"}, reader)
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
                    with contextlib.suppress(OSError), connect(path, 1.0):
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
        with connect(path, timeout_s) as sock:
            pid = peer_pid(sock)
            st = start_time(pid)
            if st is None:
                return LiveError("live_fork_failed", "the child ended before its set-up")
            write_id_maps(pid, parent.pid if depth > 0 else None)
            net = placed(env_id, pid) if placed is not None else None
            req: dict[str, Any] = {"op": "setup", **({"net": net} if net else {})}
            out = ask(sock, req, sock.makefile("rb"))
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
