"""denv's live forks, inside an env's container: the server process and its children.

denv mounts this directory read-only at ``/.denv/bin`` in a container created with
``live: true``. pid 1 is ``launcher.py`` (the supervisor), which runs the image's own command
unchanged with this directory first on ``PYTHONPATH``. Every Python process the command
starts then runs ``sitecustomize.py``, which imports this module only when it is needed:
when uvicorn, a thread pool or OpenEnv's HTTP server is imported. Nothing of denv is imported
here (the image has only its own packages); the standard library is enough, and uvicorn and
openenv are patched where the image has them. This module is the one of the project over 400
lines: it runs from a read-only mount under the image's own Python, where every module it
imports is one more name on the image's import path.

Where uvicorn starts serving (``uvicorn.Server.serve``, however the image started it: the
``uvicorn`` script, ``python -m uvicorn``, a shell or a start script running either, gunicorn's
``UvicornWorker``), :func:`take_over` wraps the loaded app in the ASGI gate, backs the heap
with huge pages and opens the control socket, then serves as uvicorn would; in a server of
several workers (gunicorn ``-w N``, ``uvicorn --workers N``) every worker does, each with a
control socket of its own. A server that cannot be copied (``--reload``, a unix socket,
another event loop) is served unchanged and says why in ``/.denv/ctl/refused``; the node
reads it.

Process tree in the container::

    pid 1   supervisor: drops CAP_SYS_ADMIN for good, runs the image's command, reaps every
            orphan, exits with the command's status once nothing is left
    ...     the image's command (a shell, a start script, gunicorn's arbiter), unchanged
    server  the process in which uvicorn serves the app, plus a control socket
            (/.denv/ctl/ctl.sock)
    child   one per live fork: a copy of the server process (memory, sessions), in user,
            mount and pid namespaces of its own, serving the same app on its own port (or,
            with ``denv serve --live-netns on``, in a network namespace of its own too, on
            the env's port at its own address)

Why the container is created with CAP_SYS_ADMIN: only so that Docker's default seccomp
profile lets ``unshare`` through. pid 1 removes the capability from its bounding set before
anything else runs, so neither the server nor anything it starts can ever hold it; what a
child can do in its own user namespace is bounded by the kernel's rules for unprivileged
user namespaces, and a child drops even those capabilities before env code runs again.

Control protocol: one JSON object per line on a unix socket, answered by one line.

``{"op": "hello"}``
    ``{"pid": ..., "env": id, "threads": [...], "unknown_threads": [...], "frozen": n,
    "huge_kib": n, "modules": [...], "warm": {...} | null, "sessions": n, "loop": name}``
    (objects kept out of collections; memory in huge pages; the names in ``sys.modules``;
    the outcome of a zygote's warm-up; OpenEnv sessions open; the event loop's class)
``{"op": "preload", "modules": [name, ...], "warm": bool}``
    import each named module not imported yet (a zygote, before its first copy), and with
    ``warm`` serve one session-less request in-process (OpenEnv's ``GET /metadata``), answer
    ``{"ok": true, "imported": n, "failed": n, "ms": ..., "warm": {...},
    "unknown_threads": [...]}``
``{"op": "gate", "timeout_s": s}``
    close admission (new HTTP requests and each new WebSocket message wait), wait until no
    request and no worker job is in flight, answer ``{"ok": true, "wait_ms": ..., "hold":
    true}``; or
    ``{"error": "fork_unsafe" | "busy", "message": ...}`` (the gate reopens). The gate stays
    closed until ``fork``/``ungate`` on the same connection, or the connection ends.
``{"op": "fork", "children": [{"env": id, "port": p, "work": [[slot, path]], "kids": dir,
"reseed": bool, "net": bool, "root": dir}], "hold": bool}``
    fork once per child at the gated point, reopen the gate (unless ``hold``: then it stays
    closed until ``ungate``, so the node can capture /work meanwhile), answer ``{"ok": true,
    "failed": {env: why}}``. Each child binds ``/.denv/ctl/<env>.sock`` at once and waits
    there for the node's ``setup`` (a connection closed without one ends it).
``{"op": "trial", "timeout_s": s}``
    make one throw-away copy of the server process, as a fork's child is made, which
    repairs what it copied, serves the app on a loopback port of its own and answers one
    request; answer ``{"ok": true, "ms": ...}`` or ``{"error": "trial_failed" | "busy" |
    "fork_unsafe", "message": ...}`` (the node asks once, when the env first serves)
``{"op": "setup", "net": {"if": name, "addr": "ip/len", "gw": ip}}`` (on a child's bootstrap
socket, after the node wrote its uid/gid maps; ``net`` for a child cloned with ``"net":
true``, once the node gave its network namespace its end of a veth pair)
    make ``root`` (the node's overlay of the parent's files, if the fork gave one) its root
    filesystem, bind each work slot onto its path, hide the other slots and the parent's
    control socket, bring up ``lo`` and the pair's end with the address and a default route
    (``net``), drop every capability, serve on the child's port and control socket, answer
    ``{"ok": true}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import importlib
import importlib.util
import json
import os
import selectors
import signal
import socket
import struct
import sys
import threading
import time
import traceback
import weakref
from asyncio import selector_events
from concurrent.futures import ThreadPoolExecutor
from typing import Any

# Where the control socket lives (a tmpfs the node reaches through /proc/PID/root); tests
# of the start-up hook on the host name a directory of their own.
CTL_DIR = os.environ.get("DENV_LIVE_CTL_DIR", "/.denv/ctl")
WORK_DIR = "/.denv/work"
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_BIND = 4096
MS_REC = 16384
MS_MOVE = 8192
MS_PRIVATE = 1 << 18
MS_NOSUID = 2
MS_NODEV = 4
PR_CAPBSET_DROP = 24
MADV_COLLAPSE = 25  # Linux 6.1: back a range with transparent huge pages, synchronously
HUGE = 1 << 21
CAP_SYS_ADMIN = 21
LAST_CAP = 63

libc = ctypes.CDLL(None, use_errno=True)
# DENV_LIVE_TRACE=1 in the env: each live child logs its CPU, page faults since its clone and
# private memory at each stage of its start (bench/live_fork_probe/p7_child_cpu.py reads them).
TRACE = bool(os.environ.get("DENV_LIVE_TRACE"))


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _log(msg: str) -> None:
    print(f"denv-live[{os.getpid()}]: {msg}", file=sys.stderr, flush=True)


def _trace(stages: list[tuple[str, float, int, int]], stage: str) -> None:
    """Note this child's CPU (ms) and minor faults since its clone (a new process starts at 0),
    and its private memory (KiB: the pages only it maps, its copies of the parent's included)."""
    if TRACE:
        import resource

        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        with open("/proc/self/smaps_rollup") as f:
            private = sum(int(line.split()[1]) for line in f if line.startswith("Private_"))
        stages.append((stage, round(time.process_time() * 1e3, 3), faults, private))


def _trace_log(stages: list[tuple[str, float, int, int]]) -> None:
    if TRACE:
        _log("child stages " + json.dumps(stages))


def drop_caps(keep: set[int] | None = None) -> None:
    """Remove capabilities from the bounding set and from every set of this process."""
    keep = keep or set()
    for cap in range(LAST_CAP + 1):
        if cap not in keep:
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the kernel's last cap
    hdr = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()
    _check(libc.capget(hdr, data), "capget")
    for cap in range(LAST_CAP + 1):
        if cap in keep:
            continue
        word, bit = divmod(cap, 32)
        for field in range(3):  # effective, permitted, inheritable
            data[word * 3 + field] &= ~(1 << bit) & 0xFFFFFFFF
    _check(libc.capset(hdr, data), "capset")


def current_caps() -> set[int]:
    """The capabilities this process is permitted."""
    hdr = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(libc.capget(hdr, data), "capget")
    caps = set()
    for cap in range(LAST_CAP + 1):
        word, bit = divmod(cap, 32)
        if data[word * 3 + 1] & (1 << bit):  # permitted
            caps.add(cap)
    return caps


def _private_writable() -> list[tuple[int, int, str]]:
    """This process's private writable mappings: (start, end, name), the name "" for an
    anonymous one, ``[heap]``, ``[stack]`` or the mapped file's path."""
    with open("/proc/self/maps") as maps:
        lines = maps.read().splitlines()
    out = []
    for line in lines:
        fields = line.split()
        if fields[1].startswith("rw") and fields[1][3] == "p":
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            out.append((lo, hi, fields[5] if len(fields) > 5 else ""))
    return out


def _madvise() -> Any:
    madvise = libc.madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return madvise


def collapse_memory() -> tuple[int, int]:
    """Back this process's anonymous memory with 2 MiB pages where the kernel can.

    fork() copies one page-table entry per 4 KiB page of a private writable mapping, which
    is most of a live fork's cost for a ~150 MB Python server; a huge page is one entry. A
    child's first write to a shared huge page still copies only 4 KiB (the kernel splits
    the mapping in the writer), so children stay as small. Errors (an older kernel, a range
    that cannot be collapsed) leave the memory as it was: (bytes collapsed, ranges failed).
    """
    madvise = _madvise()
    done = failed = 0
    for lo, hi, path in _private_writable():
        if path not in ("", "[heap]"):
            continue
        start, end = (lo + HUGE - 1) & ~(HUGE - 1), hi & ~(HUGE - 1)
        if end > start:
            if madvise(start, end - start, MADV_COLLAPSE) == 0:
                done += end - start
            else:
                failed += 1
    return done, failed


MADV_MERGEABLE = 12


def mergeable_memory() -> tuple[int, int]:
    """Mark this process's private writable memory for the kernel's same-page merging (KSM;
    ``denv serve --merge-pages``): (bytes marked, ranges refused). Children inherit the
    mark, so the pages a child copies on its first writes (refcounts moved and put back,
    mostly) are merged again with the parent's and the siblings' while they hold the same
    bytes. Each fork marks what is new since the last one (new arenas)."""
    madvise = _madvise()
    done = failed = 0
    for lo, hi, path in _private_writable():
        if path.startswith("[") and path != "[heap]":
            continue
        if madvise(lo, hi - lo, MADV_MERGEABLE) == 0:
            done += hi - lo
        else:
            failed += 1
    return done, failed


def _anon_huge_kib() -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


# --- what a fork must know: jobs in flight, executors, OpenEnv servers -----------------------


class Jobs:
    """Sync jobs in flight in any ThreadPoolExecutor (OpenEnv runs each step in one)."""

    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.changed: asyncio.Event | None = None

    def inc(self) -> None:
        with self.lock:
            self.n += 1

    def dec(self, _fut: Any) -> None:
        with self.lock:
            self.n -= 1
        loop, changed = self.loop, self.changed
        if loop is not None and changed is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closing
                loop.call_soon_threadsafe(changed.set)


JOBS = Jobs()
EXECUTORS: weakref.WeakSet[ThreadPoolExecutor] = weakref.WeakSet()
OPENENV_SERVERS: weakref.WeakSet[Any] = weakref.WeakSet()
_submit = ThreadPoolExecutor.submit
_executor_init = ThreadPoolExecutor.__init__


def _counted_submit(self: ThreadPoolExecutor, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
    JOBS.inc()
    try:
        fut = _submit(self, fn, *args, **kwargs)
    except BaseException:
        JOBS.dec(None)
        raise
    fut.add_done_callback(JOBS.dec)
    return fut


def _tracked_init(self: ThreadPoolExecutor, *args: Any, **kwargs: Any) -> None:
    _executor_init(self, *args, **kwargs)
    EXECUTORS.add(self)


def patch_executors(_module: Any = None) -> None:
    """Count executor jobs and track executors (from the import of concurrent.futures.thread,
    before the app makes any)."""
    if getattr(ThreadPoolExecutor, "_denv_patched", False):
        return
    ThreadPoolExecutor.submit = _counted_submit  # type: ignore[method-assign,assignment]
    ThreadPoolExecutor.__init__ = _tracked_init  # type: ignore[method-assign]
    ThreadPoolExecutor._denv_patched = True  # type: ignore[attr-defined]


def patch_openenv(http_server: Any) -> None:
    """Track OpenEnv's HTTP servers (their sessions are what a child continues), from the
    import of ``openenv.core.env_server.http_server``, before the app makes one."""
    cls: Any = http_server.HTTPEnvServer
    if getattr(cls, "_denv_patched", False):
        return
    init = cls.__init__
    create = cls._create_session

    def tracked_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        OPENENV_SERVERS.add(self)

    async def adopting_create(self: Any) -> Any:
        """A child's first new session takes over the session it was forked with."""
        adopt = getattr(self, "_denv_adopt", None)
        if not adopt:
            return await create(self)
        env = adopt.pop(0)
        factory = self._env_factory
        self._env_factory = lambda: env
        try:
            return await create(self)
        finally:
            self._env_factory = factory

    cls.__init__ = tracked_init
    cls._create_session = adopting_create
    cls._denv_patched = True


def adopt_sessions() -> int:
    """In a child: forget the parent's sessions (their sockets are the parent's) and hand the
    most recently active one's Environment to the child's first new session."""
    n = 0
    for server in list(OPENENV_SERVERS):
        sessions = getattr(server, "_sessions", {})
        info = getattr(server, "_session_info", {})
        live = [(sid, env) for sid, env in sessions.items() if env is not None]
        live.sort(key=lambda x: getattr(info.get(x[0]), "last_activity_at", 0.0), reverse=True)
        for attr in ("_sessions", "_session_executors", "_session_stacks", "_session_info"):
            with contextlib.suppress(AttributeError):
                getattr(server, attr).clear()
        for attr in ("_session_websocket_attachments", "_session_pending_closes"):
            with contextlib.suppress(AttributeError):
                getattr(server, attr).clear()
        server._denv_adopt = [env for _, env in live[:1]]
        n += len(server._denv_adopt)
    return n


def known_threads() -> set[int]:
    """Threads a fork may leave behind: idle pool workers (ThreadPoolExecutor, anyio)."""
    idents = {threading.main_thread().ident or 0}
    for ex in list(EXECUTORS):
        idents.update(t.ident or 0 for t in list(getattr(ex, "_threads", ())))
    for t in threading.enumerate():
        if type(t).__name__ == "WorkerThread" and type(t).__module__.startswith("anyio"):
            idents.add(t.ident or 0)
        if _is_pong(t):
            idents.add(t.ident or 0)
    return idents


def _is_pong(t: threading.Thread) -> bool:
    """uvicorn --workers' health-check thread in each worker: it only waits on its pipe to
    the supervisor and answers, holding no lock a copy could inherit mid-use (a copy has no
    such thread, and no supervisor asks it)."""
    target = getattr(t, "_target", None)
    return (
        getattr(target, "__qualname__", "") == "Process.always_pong"
        and getattr(target, "__module__", "") == "uvicorn.supervisors.multiprocess"
    )


def last_active() -> float:
    """When an OpenEnv session of this process was last active (0: none): the worker a
    fork of a multi-worker server is made from is the one whose session was active last."""
    times = [0.0]
    for server in list(OPENENV_SERVERS):
        for info in list(getattr(server, "_session_info", {}).values()):
            times.append(float(getattr(info, "last_activity_at", 0.0) or 0.0))
    return max(times)


def unknown_threads() -> list[str]:
    known = known_threads()
    return [t.name for t in threading.enumerate() if (t.ident or 0) not in known]


def reset_thread_pools(loop: asyncio.AbstractEventLoop) -> None:
    """After fork(): pools believe the parent's idle workers still exist; forget them."""
    for ex in list(EXECUTORS):
        ex._threads.clear()  # type: ignore[attr-defined]
        ex._idle_semaphore = threading.Semaphore(0)
        ex._shutdown_lock = threading.Lock()
    # Only where the parent loaded anyio's asyncio backend: else it has no anyio worker to
    # forget, and importing it here cost each child ~20 ms of CPU (a zygote's copies).
    anyio_asyncio = sys.modules.get("anyio._backends._asyncio")
    if anyio_asyncio is not None:
        with contextlib.suppress(Exception):
            from collections import deque

            anyio_asyncio._threadpool_idle_workers.set(deque())
            anyio_asyncio._threadpool_workers.set(set())
    loop._default_executor = None  # type: ignore[attr-defined]
    JOBS.n = 0
    JOBS.lock = threading.Lock()


def drop_copy(transport: Any) -> None:
    """Close the child's copy of a parent's connection (the parent keeps its own) without
    a byte written, and without its protocol's ``connection_lost``: that would run the app's
    clean-up of the parent's session in the child (a WebSocket handler's end, OpenEnv's
    session close), for nothing, writing to pages the child shares with the parent (each a
    copy). The handler's task is left waiting for good, untouched."""
    transport.set_protocol(asyncio.Protocol())
    transport.abort()


def own_selector_and_self_pipe(loop: Any) -> None:
    """The child shares the parent's epoll instance and the loop's self-pipe (inherited file
    descriptions): give it its own, re-registering what it keeps."""
    old = loop._selector
    new = selectors.DefaultSelector()
    ssock = loop._ssock.fileno()
    for key in list(old.get_map().values()):
        if key.fd != ssock:
            new.register(key.fileobj, key.events, key.data)
    loop._selector = new
    old.close()
    loop._close_self_pipe()
    loop._make_self_pipe()


# --- the ASGI gate ----------------------------------------------------------------------------


class Gate:
    """ASGI wrapper: counts HTTP requests in flight; a closed gate holds new requests and each
    new WebSocket message (not whole sessions: a long session would never be quiescent)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.inflight = 0
        self.idle: asyncio.Event | None = None
        self.open: asyncio.Event | None = None

    def bind(self) -> None:
        """Events of the running loop (made again in a child: they hold loop futures)."""
        self.inflight = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.open = asyncio.Event()
        self.open.set()
        JOBS.changed = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            await self.inner(scope, self._gated(receive), send)
            return
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        assert self.open is not None and self.idle is not None
        await self.open.wait()
        self.inflight += 1
        self.idle.clear()
        try:
            await self.inner(scope, receive, send)
        finally:
            self.inflight -= 1
            if self.inflight == 0:
                self.idle.set()

    def _gated(self, receive: Any) -> Any:
        """A session's ``receive``, held while the gate is closed. In a copy of this process
        (a live child, a trial) the session is the parent's: its next message, one the
        parent's socket had already delivered before the copy, must never run there. It
        would step the Environment the child hands to its own first session, and run in a
        worker thread the child starts before it takes its own root (setns(2) refuses a
        process of several threads: the child failed to start)."""
        mine = os.getpid()

        async def gated() -> Any:
            message = await receive()
            assert self.open is not None
            await self.open.wait()
            if os.getpid() != mine:
                await asyncio.get_running_loop().create_future()  # never done
            return message

        return gated

    async def quiescent(self) -> None:
        """Until no HTTP request is in flight and no job runs in a worker thread."""
        assert self.idle is not None and JOBS.changed is not None
        while self.inflight or JOBS.n:
            JOBS.changed.clear()
            if self.inflight:
                await self.idle.wait()
            elif JOBS.n:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(JOBS.changed.wait(), 0.05)


# --- the live process: server, control socket, forks -----------------------------------------


class Live:
    def __init__(
        self, config: Any, gate: Gate, env_id: str, ctl: str = "ctl.sock", workers: int = 1
    ) -> None:
        self.config = config
        self.gate = gate
        self.env_id = env_id
        self.ctl_name = ctl  # this process's control socket in CTL_DIR
        self.workers = workers  # worker processes of the server (a child runs as many)
        self.server: Any = None
        self.ctl: asyncio.AbstractServer | None = None
        self.forked: list[int] = []  # pids of live children still to reap
        self.reaping = False
        self.serving: asyncio.Task[None] | None = None
        self.setting_up: asyncio.Task[None] | None = None
        self.trying: asyncio.Task[None] | None = None  # a trial copy's serve and request
        self.stages: list[tuple[str, float, int, int]] = []  # a child's start (DENV_LIVE_TRACE)
        self.warmed: dict[str, Any] | None = None  # the warm-up's outcome (a zygote's)

    # serving
    async def serve(self, server: Any, serve: Any, sockets: Any) -> None:
        """The server process: uvicorn's own ``serve`` of ``server``, with the control socket."""
        JOBS.loop = asyncio.get_running_loop()
        self.gate.bind()
        self.server = server
        self.ctl = await self._listen_ctl(os.path.join(CTL_DIR, self.ctl_name))
        await serve(server, sockets)

    async def _listen_ctl(self, path: str) -> asyncio.AbstractServer:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        srv = await asyncio.start_unix_server(self._handle, path, limit=CTL_LINE_LIMIT)
        os.chmod(path, 0o600)
        return srv

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        gated = False
        assert self.gate.open is not None
        try:
            while line := await reader.readline():
                req = json.loads(line)
                op = req.get("op")
                if op == "hello":
                    out: dict[str, Any] = {
                        "pid": os.getpid(),
                        "env": self.env_id,
                        "threads": [t.name for t in threading.enumerate()],
                        "unknown_threads": unknown_threads(),
                        "frozen": gc.get_freeze_count(),
                        "huge_kib": _anon_huge_kib(),
                        "modules": sorted(sys.modules),
                        "warm": self.warmed,
                        "sessions": sum(len(getattr(x, "_sessions", {})) for x in OPENENV_SERVERS),
                        "loop": type(asyncio.get_running_loop()).__qualname__,
                        "workers": self.workers,
                        "last_active": last_active(),
                    }
                elif op == "activity":
                    out = {"pid": os.getpid(), "last_active": last_active()}
                elif op == "preload":
                    out = preload(req.get("modules") or [])
                    if req.get("warm"):
                        out["warm"] = self.warmed = await self._warm()
                        out["unknown_threads"] = unknown_threads()
                elif op == "gate":
                    self.gate.open.clear()
                    gated = True
                    out = await self._gate(float(req.get("timeout_s", 10.0)))
                    if "error" in out:
                        self.gate.open.set()
                        gated = False
                elif op == "fork":
                    if not gated:
                        out = {"error": "not_gated", "message": "send gate first"}
                    else:
                        try:
                            forked = self._fork(req["children"], writer, bool(req.get("merge")))
                        except Exception as exc:  # answered, never a dropped connection
                            forked = {"error": "fork_failed", "message": f"{exc!r}"}
                        if forked is None:  # this is a new child: the connection is not ours
                            gated = False
                            return
                        out = forked
                        if not req.get("hold") or "error" in out:
                            self.gate.open.set()
                            gated = False
                elif op == "trial":
                    tried = await self._trial(float(req.get("timeout_s", TRIAL_TIMEOUT_S)), writer)
                    if tried is None:  # the trial's copy: the connection is not ours
                        return
                    out = tried
                elif op == "ungate":
                    self.gate.open.set()
                    gated = False
                    out = {"ok": True}
                else:
                    out = {"error": "bad_request", "message": f"unknown op {op!r}"}
                writer.write(json.dumps(out).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, json.JSONDecodeError):
            pass
        finally:
            if gated:
                self.gate.open.set()
            writer.close()

    async def _warm(self) -> dict[str, Any]:
        """Serve one session-less request in this process (a zygote, before its first copy):
        OpenEnv's ``GET /metadata``, which builds one ``Environment`` and closes it, as any
        HTTP client of the env may have it do. What the first construction of an
        environment costs once per process (lazy imports, source read for tool schemas,
        pydantic's first schemas, anyio's worker pool) is then done here, once, and not in
        each copy's first session (~70 ms of a copy's first ``reset()`` on the echo env). No
        session is opened and nothing is written to /work. Only for an OpenEnv server."""
        if not OPENENV_SERVERS or self.server is None:
            return {"skipped": "not an OpenEnv server"}
        t0 = time.perf_counter()
        done = asyncio.Event()
        status = 0

        async def receive() -> dict[str, Any]:
            if not done.is_set() and not getattr(receive, "sent", False):
                receive.sent = True  # type: ignore[attr-defined]
                return {"type": "http.request", "body": b"", "more_body": False}
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                done.set()

        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "server": ("127.0.0.1", int(self.config.port or 0)),
            "client": ("127.0.0.1", 0),
            "scheme": "http",
            "method": "GET",
            "root_path": "",
            "path": WARM_PATH,
            "raw_path": WARM_PATH.encode(),
            "query_string": b"",
            "headers": [(b"host", b"localhost"), (b"user-agent", b"denv-zygote-warm")],
        }
        state = getattr(getattr(self.server, "lifespan", None), "state", None)
        if isinstance(state, dict):
            scope["state"] = state.copy()
        try:
            await asyncio.wait_for(self.gate(scope, receive, send), WARM_TIMEOUT_S)
        except Exception as exc:  # the app's own error: the zygote stays as it is
            return {"path": WARM_PATH, "error": f"{type(exc).__name__}: {exc}"}
        finally:
            done.set()
        return {"path": WARM_PATH, "status": status, "ms": (time.perf_counter() - t0) * 1e3}

    async def _gate(self, timeout_s: float) -> dict[str, Any]:
        t0 = time.perf_counter()
        try:
            await asyncio.wait_for(self.gate.quiescent(), timeout_s)
        except TimeoutError:
            return {
                "error": "busy",
                "message": f"a step was still running after {timeout_s:g} s",
            }
        # A thread of the server's own that is about to end (a step's short-lived pool, a
        # worker between its start and its pool's books) would make a fork unsafe for a
        # moment only: wait for it, the gate closed, before refusing.
        deadline = time.perf_counter() + STRANGERS_WAIT_S
        while (strangers := unknown_threads()) and time.perf_counter() < deadline:
            await asyncio.sleep(0.01)
        if strangers:
            return {
                "error": "fork_unsafe",
                "message": "the server runs threads of its own ("
                + ", ".join(sorted(strangers)[:8])
                + "): a fork would copy their locks mid-use",
            }
        # hold: this launcher keeps the gate closed after a fork asked to (see ``fork``).
        return {"ok": True, "wait_ms": (time.perf_counter() - t0) * 1e3, "hold": True}

    async def _trial(self, timeout_s: float, writer: asyncio.StreamWriter) -> dict[str, Any] | None:
        """Make one throw-away copy of this process, as a live fork's child is made, and have
        it repair what it copied and serve the app on a loopback port of its own, then
        answer one request: ``{"ok": true, "ms": ...}``, or why the copy could not serve
        (``trial_failed``). The node asks once the env first serves, so that a server whose
        copies cannot serve (state of the image's own, out of the repair's reach) runs
        without live forks from its start instead of failing its first fork. None in the
        copy."""
        assert self.gate.open is not None
        t0 = time.perf_counter()
        self.gate.open.clear()
        try:
            gated = await self._gate(timeout_s)
            if "error" in gated:
                return gated
            r, w = os.pipe()
            stop_blas_threads()
            pid = clone_process()
            if pid == 0:
                os.close(r)
                self._trial_child(w, writer)
                return None
            os.close(w)
        finally:
            self.gate.open.set()
        self.forked.append(pid)
        if not self.reaping:
            self.reaping = True
            asyncio.get_running_loop().call_later(REAP_EVERY_S, self._reap)
        try:
            said = await asyncio.wait_for(_read_line(r), timeout_s)
        except TimeoutError:
            said = f"it did not serve within {timeout_s:g} s"
        finally:
            os.close(r)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if said != "ok":
            return {"error": "trial_failed", "message": said or "it ended without a word"}
        return {"ok": True, "ms": (time.perf_counter() - t0) * 1e3}

    def _repair(self) -> asyncio.AbstractEventLoop:
        """In a new copy of this process (a fork's child, a trial, a child's further
        worker), on the server's loop thread: the loop running again with an epoll instance
        and self-pipe of its own, the parent's listeners and connections dropped (the
        copy's descriptors only), pools that forget the parent's workers."""
        loop = JOBS.loop
        assert loop is not None
        asyncio.events._set_running_loop(loop)  # the at-fork hook cleared it
        own_selector_and_self_pipe(loop)
        if self.server is not None:
            # The parent's server object stays in the copy (its serve() coroutine goes on);
            # its main loop must stop waking: a copy serves with a server of its own.
            self.server.denv_retired = True
            for srv in self.server.servers:
                srv.close()
            for conn in list(self.server.server_state.connections):
                drop_copy(conn.transport)
        reset_thread_pools(loop)
        return loop

    def _trial_child(self, w: int, writer: asyncio.StreamWriter) -> None:
        """In the trial's copy, on the server's loop thread: repair as a live child does,
        then serve and answer one request of its own (``_trial_serve``)."""
        try:
            loop = self._repair()
            if self.ctl is not None:  # the parent's control socket stays the parent's
                for listener in getattr(self.ctl, "sockets", ()):
                    loop.remove_reader(listener.fileno())
            drop_copy(writer.transport)
            self.gate.bind()
        except BaseException as exc:
            _say(w, f"repairing the copy failed: {type(exc).__name__}: {exc}")
            os._exit(1)
        # Held: the loop keeps only a weak reference to a task (one collected mid-way closes
        # its coroutine: GeneratorExit, a trial failed for nothing).
        self.trying = loop.create_task(self._trial_serve(w))

    async def _trial_serve(self, w: int) -> None:
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sock.listen(8)
            port = sock.getsockname()[1]
            await self._start_serving(sock, ctl=False)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            status = await reader.readline()
            if not status.startswith(b"HTTP/1."):
                raise RuntimeError(f"its answer began {status[:40]!r}")
            _say(w, "ok")
        except BaseException as exc:
            _say(w, f"{type(exc).__name__}: {exc}")
        os._exit(0)

    def _fork(
        self, children: list[dict[str, Any]], writer: asyncio.StreamWriter, merge: bool = False
    ) -> dict[str, Any] | None:
        """The parent's answer; None in a new child, which then leaves the handler."""
        # The parent's objects stay out of collections in every child (frozen there for
        # good): a child's collections would otherwise write to every object's header and
        # copy the whole heap page by page. The parent unfreezes its own after the fork.
        gc.freeze()
        t0 = time.perf_counter()
        if merge:
            mergeable_memory()
        # CPython's at-fork hook reseeds ``random`` in every child: a child that keeps the
        # parent's random state gets this copy back.
        kept = random_state() if not all(c.get("reseed", True) for c in children) else None
        stop_blas_threads()
        failed: dict[str, str] = {}
        mine: dict[str, Any] | None = None
        try:
            for spec in children:
                try:
                    pid = clone_into_namespaces(bool(spec.get("net")))
                except OSError as exc:  # e.g. the container's pids limit: this child only
                    failed[spec["env"]] = str(exc)
                    continue
                if pid == 0:
                    mine = spec
                    break
                self.forked.append(pid)
        finally:
            if mine is None:
                gc.unfreeze()
        if mine is not None:
            self.stages = []
            _trace(self.stages, "cloned")
            try:
                reseed_or_keep(bool(mine.get("reseed", True)), kept)
                self._child(mine, writer)
            except BaseException:
                traceback.print_exc()
                os._exit(1)
            return None  # the child's loop goes on running (it is the server's loop)
        if not self.reaping:
            self.reaping = True
            asyncio.get_running_loop().call_later(REAP_EVERY_S, self._reap)
        return {"ok": True, "fork_ms": (time.perf_counter() - t0) * 1e3, "failed": failed}

    def _reap(self) -> None:
        """Collect the children of this process that ended (only those: env code's own
        subprocesses are waited for by env code)."""
        left = []
        for pid in self.forked:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            if done == 0:
                left.append(pid)
        self.forked = left
        self.reaping = bool(left)
        if left:
            asyncio.get_running_loop().call_later(REAP_EVERY_S, self._reap)

    def _child(self, spec: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        """pid 1 of its own pid namespace, on the server's event-loop thread, mid-callback."""
        loop = self._repair()
        if self.ctl is not None:
            self.ctl.close()
        writer.transport.abort()
        adopt_sessions()
        self.gate.bind()
        self.env_id = spec["env"]
        self.ctl_name = "ctl.sock"  # the child's first worker (a copy of any worker)
        self.forked, self.reaping = [], False
        path = os.path.join(CTL_DIR, f"{self.env_id}.sock")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        boot = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        boot.bind(path)
        os.chmod(path, 0o600)
        boot.listen(1)
        boot.setblocking(False)
        _trace(self.stages, "repaired")

        async def setup() -> None:
            try:
                # The node sets a child up at once; one it never reaches ends by itself.
                conn, _ = await asyncio.wait_for(loop.sock_accept(boot), SETUP_WAIT_S)
                with conn:
                    line = b""
                    while not line.endswith(b"\n"):
                        chunk = await loop.sock_recv(conn, 65536)
                        if not chunk:
                            os._exit(1)
                        line += chunk
                    req = json.loads(line)
                    if req.get("op") != "setup":
                        os._exit(1)
                    _trace(self.stages, "asked")
                    try:
                        sock = self._become(spec, boot, path, req.get("net"))
                        _trace(self.stages, "became")
                        if self._fan_out():  # a further worker of this child: serve only
                            await self._start_serving(sock)
                            return
                        await self._start_serving(sock)
                        _trace(self.stages, "serving")
                        _trace_log(self.stages)
                        out: dict[str, Any] = {"ok": True, "pid": os.getpid()}
                    except Exception as exc:
                        out = {"error": "setup_failed", "message": f"{type(exc).__name__}: {exc}"}
                    await loop.sock_sendall(conn, json.dumps(out).encode() + b"\n")
                    if "error" in out:
                        os._exit(1)
            except BaseException:
                traceback.print_exc()
                os._exit(1)

        self.setting_up = loop.create_task(setup())

    def _fan_out(self) -> bool:
        """In a new child of a multi-worker server, once set up: fork the server's other
        workers (``self.workers - 1`` copies of this process, in its namespaces, on its
        listening socket, each with a control socket of its own), so the child serves with
        as many workers as its parent. True in such a copy. They are copies of the worker
        the fork was made from: each one's first new session continues that worker's
        session, whichever worker the client's connection reaches."""
        loop = JOBS.loop
        assert loop is not None
        if self.workers > 1:
            stop_blas_threads()
        for _ in range(self.workers - 1):
            pid = clone_process()
            if pid == 0:
                self._repair()
                self.forked, self.reaping = [], False
                self.ctl_name = f"ctl.{os.getpid()}.sock"
                return True
            self.forked.append(pid)
        if self.forked and not self.reaping:
            self.reaping = True
            loop.call_later(REAP_EVERY_S, self._reap)
        return False

    def _become(
        self, spec: dict[str, Any], boot: socket.socket, path: str, net: dict[str, Any] | None
    ) -> socket.socket:
        """The node wrote our uid/gid maps (and, with ``net``, gave our network namespace
        its end of a pair): take our root filesystem and /work, hide the rest, set our
        network up, drop every cap."""
        if net:
            configure_netns(str(net["if"]), str(net["addr"]), str(net["gw"]))
        if spec.get("root"):
            own_root(str(spec["root"]), [(a, b) for a, b in spec["work"]], str(spec["kids"]))
        else:
            for slot, target in spec["work"]:
                _mount(slot, target, None, MS_BIND | MS_REC, None)
            # Hide the other children's slots: our /.denv/work is where our own children's
            # slots appear (the node mounts them there; they propagate into this namespace).
            _mount(spec["kids"], WORK_DIR, None, MS_BIND, None)
        boot.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        _mount("tmpfs", CTL_DIR, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=700")
        if net and net.get("dns"):
            own_resolver(str(net["dns"]))
        drop_caps()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", int(spec["port"])))
        sock.listen(2048)
        return sock

    async def _start_serving(self, sock: socket.socket, ctl: bool = True) -> None:
        import uvicorn

        if ctl:
            self.ctl = await self._listen_ctl(os.path.join(CTL_DIR, self.ctl_name))
        from uvicorn.lifespan.off import LifespanOff

        # The app's startup ran in the parent: its state is ours. A gunicorn worker's
        # heartbeat is the parent's to send (a child's would hide the parent's death).
        self.config.lifespan_class = LifespanOff
        self.config.callback_notify = None
        self.server = uvicorn.Server(self.config)
        quiet_ticks(self.server)
        self.serving = asyncio.get_running_loop().create_task(self._serve_child(sock))
        deadline = time.monotonic() + 10.0
        while not self.server.started:  # answer the node once the app is served
            if self.serving.done() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start serving the app in the child")
            await asyncio.sleep(0.0005)

    async def _serve_child(self, sock: socket.socket) -> None:
        assert self.server is not None
        try:
            await self.server.serve(sockets=[sock])
        finally:
            os._exit(0)


def _say(fd: int, text: str) -> None:
    """A trial child's verdict: one line on the pipe to its parent."""
    with contextlib.suppress(OSError):
        os.write(fd, text.replace("\n", " ").encode()[:4000] + b"\n")


async def _read_line(fd: int) -> str:
    """One line from a pipe, without blocking the loop (EOF: what came before it)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    buf = bytearray()

    def readable() -> None:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return
        buf.extend(chunk)
        if (not chunk or b"\n" in buf) and not done.done():
            done.set_result(None)

    os.set_blocking(fd, False)
    loop.add_reader(fd, readable)
    try:
        await done
    finally:
        loop.remove_reader(fd)
    return bytes(buf).split(b"\n", 1)[0].decode(errors="replace")


def preload(names: list[Any]) -> dict[str, Any]:
    """Import the named modules this process has not (a zygote: what another server of its
    configuration imported once it served, so that no copy imports them in its first
    session). A module that fails to import is skipped; a thread one starts is reported
    (the server is then no longer fork-safe)."""
    t0 = time.perf_counter()
    imported, failed = 0, 0
    for name in sorted({str(n) for n in names[:MAX_PRELOAD]}):
        if name in sys.modules or not all(p.isidentifier() for p in name.split(".")):
            continue
        try:
            importlib.import_module(name)
            imported += 1
        except Exception:
            failed += 1
    return {
        "ok": True,
        "imported": imported,
        "failed": failed,
        "ms": (time.perf_counter() - t0) * 1e3,
        "unknown_threads": unknown_threads(),
    }


def random_state() -> Any:
    """The state of Python's global ``random`` (None when the server never imported it)."""
    rnd = sys.modules.get("random")
    return rnd.getstate() if rnd is not None else None


def reseed_or_keep(reseed: bool, kept: Any) -> None:
    """In a new child: fresh entropy for the global generators, or the parent's state.

    ``reseed``: Python's ``random`` (which CPython's at-fork hook has reseeded already) and
    NumPy's legacy global ``RandomState`` (``np.random.*``) draw from ``os.urandom``, as in a
    newly started server. Else ``random`` gets the parent's state back (``kept``) and NumPy's
    stays as copied: the child draws what the parent would have drawn next. Generators the
    env holds itself (``random.Random(seed)``, ``np.random.default_rng(seed)``) are copied
    either way; ``uuid4`` and ``secrets`` read ``os.urandom`` on each call.
    """
    rnd = sys.modules.get("random")
    if not reseed:
        if rnd is not None and kept is not None:
            rnd.setstate(kept)
        return
    if rnd is not None:
        rnd.seed()
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        with contextlib.suppress(Exception):  # a NumPy without the legacy global generator
            np_random.seed()


SYS_CLONE = {"x86_64": 56, "aarch64": 220}.get(os.uname().machine, 56)
SETUP_WAIT_S = 60.0
REAP_EVERY_S = 0.5
MAX_PRELOAD = 20000  # module names a preload takes
# A zygote's warm-up request (``Live._warm``): OpenEnv's session-less GET.
WARM_PATH = "/metadata"
WARM_TIMEOUT_S = 30.0
CTL_LINE_LIMIT = 1 << 22  # bytes of one control request (a preload's names)
# How long a fork waits for threads of the server's own to end before it is refused.
STRANGERS_WAIT_S = 1.0
# How long a trial copy (``Live._trial``) may take to serve one request.
TRIAL_TIMEOUT_S = 10.0


def clone_into_namespaces(net: bool = False) -> int:
    """fork(), with the child in new user, mount and pid namespaces at once (pid 1 of its
    own), and a network namespace of its own with ``net``: one copy of the page tables,
    where unshare() and a second fork() would make two.

    clone(2) is called directly, so Python's fork bookkeeping is done as os.fork() does it
    (PyOS_BeforeFork / AfterFork_*: the import lock, the GIL, threading, at-fork hooks). The
    fork happens at the gated point, with every other thread an idle pool worker.
    """
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID
    if net:
        flags |= CLONE_NEWNET
    return clone_process(flags)


_BLAS: dict[str, Any] = {}  # OpenBLAS libraries this process loaded, by path


def stop_blas_threads() -> int:
    """Stop the worker threads of every OpenBLAS this process loaded (NumPy's, SciPy's):
    native threads, which ``threading`` does not list. A copy made by clone(2) has none of
    them but believes it has, so its first parallel BLAS call (a matrix product of a few
    hundred rows) waited for them forever. This is OpenBLAS's own step before a fork(): it
    starts them again at its next parallel call, in this process and in each copy. How
    many libraries were told."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line and " /" in line}
    except OSError:
        return 0
    n = 0
    for path in sorted(paths):
        lib = _BLAS.get(path)
        if lib is None:
            try:
                lib = _BLAS[path] = ctypes.CDLL(path)
            except OSError:
                continue
        shutdown = getattr(lib, "blas_thread_shutdown_", None)
        if shutdown is not None:
            shutdown()
            n += 1
    return n


def clone_process(flags: int = 0) -> int:
    """fork() by clone(2) with ``flags`` (new namespaces, or none), with Python's fork
    bookkeeping (PyOS_BeforeFork / AfterFork_*) and not the C library's: a library's
    pthread_atfork handlers (OpenBLAS joins its worker threads before a fork) would wait
    for threads a copy of a copy does not have. Every copy a live fork, a trial or a
    child's further worker makes is made this way, so each is made alike."""
    api = ctypes.pythonapi
    flags |= signal.SIGCHLD
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    api.PyOS_BeforeFork()
    pid = syscall(ctypes.c_long(SYS_CLONE), ctypes.c_ulong(flags), None, None, None, None)
    if pid == 0:
        api.PyOS_AfterFork_Child()
        return 0
    err = ctypes.get_errno()
    api.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(err, f"clone: {os.strerror(err)}")
    return int(pid)


def _nl_attr(kind: int, data: bytes) -> bytes:
    size = 4 + len(data)
    return struct.pack("=HH", size, kind) + data + b"\0" * (-size % 4)


def configure_netns(ifname: str, addr: str, gateway: str) -> None:
    """In a child, in its own network namespace (whose user namespace it holds every
    capability of): ``lo`` and ``ifname`` up, ``addr`` on it, a default route via
    ``gateway``; one netlink send, no subprocess (the image may have no ``ip``)."""
    index = socket.if_nametoindex(ifname)
    ip, plen = addr.split("/")
    up = 1  # IFF_UP
    msgs = [
        (16, 0, struct.pack("=BxHiII", 0, 0, 1, up, up)),  # RTM_NEWLINK: lo up
        (16, 0, struct.pack("=BxHiII", 0, 0, index, up, up)),
        (  # RTM_NEWADDR, create|excl: IFA_LOCAL and IFA_ADDRESS
            20,
            0x600,
            struct.pack("=BBBBI", socket.AF_INET, int(plen), 0, 0, index)
            + _nl_attr(2, socket.inet_aton(ip))
            + _nl_attr(1, socket.inet_aton(ip)),
        ),
        (  # RTM_NEWROUTE, create|excl: main table, boot proto, universe, unicast
            24,
            0x600,
            struct.pack("=BBBBBBBBI", socket.AF_INET, 0, 0, 0, 254, 3, 0, 1, 0)
            + _nl_attr(5, socket.inet_aton(gateway))  # RTA_GATEWAY
            + _nl_attr(4, struct.pack("=i", index)),  # RTA_OIF
        ),
    ]
    data = b"".join(
        struct.pack("=IHHII", 16 + len(body), kind, flags | 5, seq, 0) + body  # REQUEST|ACK
        for seq, (kind, flags, body) in enumerate(msgs, 1)
    )
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as nl:
        nl.send(data)
        left = set(range(1, len(msgs) + 1))
        while left:
            buf = nl.recv(65536)
            off = 0
            while off + 16 <= len(buf):
                size, kind, _flags, seq, _pid = struct.unpack_from("=IHHII", buf, off)
                if kind == 2 and seq in left:  # NLMSG_ERROR (an ack when 0)
                    left.discard(seq)
                    (err,) = struct.unpack_from("=i", buf, off + 16)
                    if err:
                        raise OSError(-err, f"setting up {ifname} ({seq}): {os.strerror(-err)}")
                off += (size + 3) & ~3


RESOLV = "/etc/resolv.conf"
DOCKER_DNS = "127.0.0.11"


def own_resolver(gateway: str) -> None:
    """In a child with a network namespace of its own: Docker's embedded resolver
    (127.0.0.11) is the container's loopback, not ours; the gateway forwards to it. So our
    resolv.conf (a copy in our control tmpfs, bound over the container's in our mount
    namespace) names the gateway instead."""
    try:
        with open(RESOLV) as f:
            text = f.read()
    except OSError:
        return
    if DOCKER_DNS not in text:
        return
    mine = os.path.join(CTL_DIR, "resolv.conf")
    with open(mine, "w") as f:
        f.write(text.replace(DOCKER_DNS, gateway))
    _mount(mine, RESOLV, None, MS_BIND, None)


def own_root(root: str, work: list[tuple[str, str]], kids: str) -> None:
    """In a child, before it drops its capabilities: make ``root`` (its own overlay of the
    container's files, which the node mounted in its slot) its root filesystem.

    Every mount of the container's is bound (with what is mounted under it) at the same
    path in the new root: /proc, /sys, /dev, /etc/hosts and the like, /.denv/bin and
    /.denv/ctl; each volume's path gets our slot instead, and /.denv/work our ``kids`` dir
    (where our own children's slots appear: the binds keep receiving the node's mounts).
    Then the new root is moved onto ``/`` and we enter our own mount namespace again:
    setns(2) makes the topmost mount over the namespace's root our root and cwd. (Docker's
    seccomp profile refuses pivot_root(2), and chroot(2) too in a container without
    CAP_SYS_CHROOT; it lets mount(2) and setns(2) through with CAP_SYS_ADMIN.) The
    container's root stays below ours in our mount namespace, out of reach and out of
    /proc/self/mountinfo, and its copies of the node's mounts still receive the node's
    unmounts. Files already open stay the old ones."""
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = "/"
    binds = _root_binds(work, kids)
    _mount(root, root, None, MS_BIND | MS_REC, None)  # a mount of ours: it can be moved
    _mount("none", root, None, MS_PRIVATE, None)  # nothing we mount on it goes back out
    for source, target in binds:
        dest = root + target
        if not os.path.lexists(dest):
            if os.path.isdir(source):
                os.makedirs(dest, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                os.close(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
        _mount(source, dest, None, MS_BIND | MS_REC, None)
    os.chdir(root)
    _mount(".", "/", None, MS_MOVE, None)
    ns = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(libc.setns(ns, CLONE_NEWNS), "enter our mount namespace at our root")
    except OSError as exc:
        raise OSError(exc.errno, f"{exc.strerror} (threads: {_threads_here()})") from None
    finally:
        os.close(ns)
    try:
        os.chdir(cwd)
    except OSError:
        os.chdir("/")


def _threads_here() -> str:
    """This process's threads, by name (the kernel's): setns(2) of a mount namespace
    refuses a process of several."""
    names = []
    for task in sorted(os.listdir("/proc/self/task")):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f"{task}:{f.read().strip()}")
        except OSError:
            continue
    py = ", ".join(t.name for t in threading.enumerate())
    return f"{'; '.join(names)} (Python's: {py})"


def _root_binds(work: list[tuple[str, str]], kids: str) -> list[tuple[str, str]]:
    """(source, target) of each bind a child's new root needs, parents before children:
    the container's outermost mounts (each bound with those under it), our volume slots at
    their paths, our ``kids`` dir at /.denv/work; none of the other slots under it."""
    with open("/proc/self/mountinfo") as f:
        points = {_unescape(line.split()[4]) for line in f if line.strip()}
    volumes = {target: slot for slot, target in work}
    tops: list[str] = []
    for point in sorted(points, key=lambda p: (p.count("/"), p)):
        if point == "/" or any(point.startswith(t.rstrip("/") + "/") for t in tops):
            continue
        tops.append(point)
    binds = {WORK_DIR: kids, **volumes}
    for point in tops:
        if point == WORK_DIR or point.startswith(WORK_DIR + "/") or point in binds:
            continue
        binds[point] = point
    return [(binds[t], t) for t in sorted(binds, key=lambda p: (p.count("/"), p))]


def _unescape(path: str) -> str:
    """A mountinfo path (space, tab, newline and backslash written as octal escapes)."""
    out, i = [], 0
    while i < len(path):
        if path[i] == "\\" and path[i + 1 : i + 4].isdigit():
            out.append(chr(int(path[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(path[i])
            i += 1
    return "".join(out)


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    rc = libc.mount(
        source.encode(),
        target.encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    _check(rc, f"mount {source} on {target}")


# --- where uvicorn starts serving: the take-over ------------------------------------------------

TAKEN = False  # this process's first uvicorn serve was seen (a child inherits it: True)


def workers_of(config: Any) -> int:
    """How many worker processes serve the app: ``uvicorn --workers N`` or gunicorn's
    ``-w N`` (its UvicornWorker's config), else 1."""
    notify = getattr(config, "callback_notify", None)  # gunicorn's UvicornWorker sets it
    cfg = getattr(getattr(notify, "__self__", None), "cfg", None)
    return max(int(config.workers or 1), int(getattr(cfg, "workers", 1) or 1))


def refusal(config: Any) -> str | None:
    """Why a server of this uvicorn config cannot be copied by a live fork, or None."""
    if config.reload:
        return "uvicorn runs with --reload (a process that restarts the server)"
    if config.uds or config.fd is not None:
        return "uvicorn listens on a unix socket or an inherited fd, not a TCP port"
    return None


def loop_refusal() -> str | None:
    """Why the running event loop cannot be copied by a live fork, or None: a child repairs
    asyncio's own selector loop (its epoll instance, self-pipe, ready queue); another loop
    (uvloop's, or one an app installs through a policy) keeps its state in C, out of reach."""
    loop = asyncio.get_running_loop()
    if isinstance(loop, selector_events.BaseSelectorEventLoop):
        return None
    kind = f"{type(loop).__module__}.{type(loop).__qualname__}"
    return f"the server's event loop is {kind}, not asyncio's selector loop"


# uvicorn's --loop values that would not run asyncio's own loop ("auto" picks uvloop when the
# image has it: any image with uvicorn[standard]).
NOT_ASYNCIO_LOOPS = ("auto", "uvloop", "zuvloop")


def patch_uvicorn_config(config_module: Any) -> None:
    """Serve on asyncio's own event loop (from the import of ``uvicorn.config``, before the
    server picks its loop): a live fork copies that loop and repairs it in each child, and
    uvloop's cannot be (most OpenEnv images have it through ``uvicorn[standard]``, which
    ``--loop auto``, the default, then picks). An ASGI app runs the same on either loop;
    httptools, which uvicorn[standard] also brings, is kept."""
    cls: Any = config_module.Config
    if getattr(cls, "_denv_patched", False):
        return
    init = cls.__init__

    def init_on_asyncio(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if self.loop in NOT_ASYNCIO_LOOPS:
            if self.loop != "auto" or importlib.util.find_spec("uvloop") is not None:
                _log(f"serving on asyncio's event loop instead of --loop {self.loop} (uvloop)")
            self.loop = "asyncio"

    cls.__init__ = init_on_asyncio
    cls._denv_patched = True


def _claim(name: str, text: str) -> bool:
    """Write /.denv/ctl/<name> unless it exists (the first process to claim it wins)."""
    try:
        fd = os.open(os.path.join(CTL_DIR, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return True


def patch_uvicorn(server_module: Any) -> None:
    """Take over the first ``uvicorn.Server.serve`` of this process (see the module's doc)."""
    cls: Any = server_module.Server
    if getattr(cls, "_denv_patched", False):
        return
    original = cls.serve

    async def serve(self: Any, sockets: Any = None) -> None:
        global TAKEN
        if TAKEN:  # a child's server, or a second server in this process: unchanged
            await original(self, sockets)
            return
        TAKEN = True
        why = refusal(self.config) or loop_refusal()
        if why is not None:
            _claim("refused", why)
            _log(f"serving without live forks: {why}")
            await original(self, sockets)
            return
        workers = workers_of(self.config)
        ctl = "ctl.sock"
        if not _claim("server", str(os.getpid())):
            if workers == 1:
                _log("another process of this container serves live: this one serves unchanged")
                await original(self, sockets)
                return
            # A further worker of a multi-worker server: live too, on a socket of its own
            # (the node forks the worker whose session was active last).
            ctl = f"ctl.{os.getpid()}.sock"
        await take_over(self, original, sockets, ctl, workers)

    cls.serve = serve
    cls._denv_patched = True


async def take_over(
    server: Any, serve: Any, sockets: Any, ctl: str = "ctl.sock", workers: int = 1
) -> None:
    """The server process from here on: the loaded app behind the gate, the heap in huge
    pages, the control socket (``ctl``: one per worker of a multi-worker server), then
    uvicorn's own serve."""
    config = server.config
    if not config.loaded:
        config.load()  # imports the app (uvicorn's serve would, on its first line)
    gate = Gate(config.loaded_app)
    config.loaded_app = gate
    t0 = time.perf_counter()
    huge, failed = collapse_memory()
    ms = (time.perf_counter() - t0) * 1e3
    _log(f"huge pages: {huge >> 20} MiB collapsed, {failed} ranges not, in {ms:.0f} ms")
    quiet_ticks(server)
    live = Live(config, gate, os.environ.get("DENV_ENV_ID", ""), ctl, workers)
    await live.serve(server, serve, sockets)


TICK_S = 1.0


def quiet_ticks(server: Any) -> None:
    """Have uvicorn's main loop wake once a second instead of ten times.

    Between requests uvicorn only wakes to refresh its ``Date`` header (once a second) and
    to see whether it should exit; it does so every 0.1 s, ~0.4 ms of CPU a second per
    server here. A thousand idle live envs of one machine spent that much of its two cores
    (issue 24's density run). Its own ``on_tick`` still runs, the Date header is as fresh,
    and a graceful exit waits up to a second (a live env's delete is a kill).

    In a copy of the process (``Live._repair``) the parent's server is retired: its loop
    stops ticking for good, so a copy wakes for its own server only (twice a second
    otherwise), and never runs the parent's ``on_tick`` (a gunicorn worker's heartbeat,
    which would hide the parent's death).
    """

    async def main_loop() -> None:
        counter = 0
        while True:
            if getattr(server, "denv_retired", False):
                await asyncio.get_running_loop().create_future()  # never done
            if await server.on_tick(counter):
                return
            await asyncio.sleep(TICK_S)
            counter = (counter + 10) % 864000  # on_tick refreshes the header at multiples of 10

    server.main_loop = main_loop


patch_executors()  # this module imported ThreadPoolExecutor: count its jobs from now on
