"""Probe launcher, run INSIDE the env's container: the echo server, forkable live.

``python /probe/forkserver.py`` serves ``echo_env.app:app`` with uvicorn on port 8000 exactly
as the image's CMD does, plus two things a live fork needs:

- an ASGI wrapper that counts requests in flight (HTTP and WebSocket, including the time a
  sync step spends in a threadpool worker), so the event loop knows when it is quiescent;
- a control socket (``$PROBE_CTL/ctl.sock``, a line of JSON per request) served on the same
  event loop. ``{"op": "fork", "ports": [9001, ...]}`` waits until nothing is in flight, then
  forks once per port from the event-loop thread; each child closes the inherited listener,
  the inherited connections and the control socket, and serves the same app object (memory
  included) on its own port.

Options of a fork request: ``freeze`` (gc.freeze() before forking), ``reset_pools`` (the
child forgets the parent's idle threadpool workers, which do not exist after fork()),
``userns`` (the child unshares user+mount+net namespaces and waits at ``$PROBE_CTL/go-<port>``
for a host helper to plumb them, then drops every capability), ``delay_s`` (a test hook).

Also serves ``GET /_probe/state``: pid, requests seen by this process, /work listing.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import json
import os
import selectors
import socket
import sys
import threading
import time
import traceback
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import uvicorn

CTL = os.environ.get("PROBE_CTL", "/ctl")
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24
libc = ctypes.CDLL(None, use_errno=True)


class Jobs:
    """Sync jobs in flight in any ThreadPoolExecutor (OpenEnv runs each step in one)."""

    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.changed = asyncio.Event()

    def inc(self) -> None:
        with self.lock:
            self.n += 1

    def dec(self, _fut: Any) -> None:
        with self.lock:
            self.n -= 1
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.changed.set)


JOBS = Jobs()
_submit = ThreadPoolExecutor.submit
_init = ThreadPoolExecutor.__init__
EXECUTORS: weakref.WeakSet[ThreadPoolExecutor] = weakref.WeakSet()


def _counted_submit(self: ThreadPoolExecutor, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
    JOBS.inc()
    fut = _submit(self, fn, *args, **kwargs)
    fut.add_done_callback(JOBS.dec)
    return fut


def _tracked_init(self: ThreadPoolExecutor, *args: Any, **kwargs: Any) -> None:
    _init(self, *args, **kwargs)
    EXECUTORS.add(self)


def load_app() -> Any:
    """The echo env's app, from the image's /app, with every ThreadPoolExecutor from now on
    counted (JOBS) and tracked (EXECUTORS): the patches first, so that the app's executors
    are among them. Done at start, not on import: importing this module changes nothing."""
    ThreadPoolExecutor.submit = _counted_submit  # type: ignore[method-assign]
    ThreadPoolExecutor.__init__ = _tracked_init  # type: ignore[method-assign]
    sys.path.insert(0, "/app")
    from echo_env.app import app

    return app


class Tracked:
    """ASGI wrapper: counts requests in flight; serves /_probe/state."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.inflight = 0
        self.seen = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.gate = asyncio.Event()  # cleared while a fork drains: no new request or message
        self.gate.set()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.inner(scope, receive, send)
            return
        if scope["type"] == "http" and scope["path"] == "/_probe/state":
            await self._state(send)
            return
        if scope["type"] == "websocket":  # a session is long: gate each message, not it
            await self.inner(scope, self._gated(receive), send)
            return
        await self.gate.wait()
        self.inflight += 1
        self.seen += 1
        self.idle.clear()
        try:
            await self.inner(scope, receive, send)
        finally:
            self.inflight -= 1
            if self.inflight == 0:
                self.idle.set()

    def _gated(self, receive: Any) -> Any:
        async def gated() -> Any:
            message = await receive()
            await self.gate.wait()
            self.seen += 1
            return message

        return gated

    async def quiescent(self) -> None:
        """Until no HTTP request is in flight and no sync job runs in a worker thread."""
        while self.inflight or JOBS.n:
            JOBS.changed.clear()
            if self.inflight:
                await self.idle.wait()
            else:
                await JOBS.changed.wait()

    async def _state(self, send: Any) -> None:
        work: dict[str, str] = {}
        with contextlib.suppress(OSError):
            for name in sorted(os.listdir("/work"))[:20]:
                path = os.path.join("/work", name)
                if os.path.isfile(path):
                    with open(path, errors="replace") as f:
                        work[name] = f.read(200)
        peek: dict[str, Any] = {"pids_visible": sum(p.isdigit() for p in os.listdir("/proc"))}
        try:
            peek["read_pid1_root_work"] = sorted(os.listdir("/proc/1/root/work"))
        except OSError as e:
            peek["read_pid1_root_work"] = e.strerror
        try:
            os.kill(1, 0)
            peek["signal_pid1"] = "allowed"
        except OSError as e:
            peek["signal_pid1"] = e.strerror
        body = json.dumps(
            {
                "peek": peek,
                "pid": os.getpid(),
                "seen": self.seen,
                "threads": threading.active_count(),
                "work": work,
                "netns": os.readlink("/proc/self/ns/net"),
                "mntns": os.readlink("/proc/self/ns/mnt"),
                "userns": os.readlink("/proc/self/ns/user"),
            }
        ).encode()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


tracked: Tracked  # the app served (load_app), wrapped: set at start, before main()
SERVER: uvicorn.Server | None = None
CTL_SERVER: asyncio.AbstractServer | None = None


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def reset_thread_pools() -> int:
    """After fork(): every ThreadPoolExecutor and anyio's worker pool believe the parent's
    idle workers still exist; work handed to them would wait forever. Forget them."""
    n = 0
    for ex in list(EXECUTORS):  # walking gc.get_objects() instead costs ~50 ms and dirties pages
        ex._threads.clear()
        ex._idle_semaphore = threading.Semaphore(0)
        n += 1
    with contextlib.suppress(Exception):
        from anyio._backends import _asyncio as anyio_asyncio

        anyio_asyncio._threadpool_idle_workers.set(__import__("collections").deque())
        anyio_asyncio._threadpool_workers.set(set())
    loop = asyncio.get_running_loop()
    loop._default_executor = None  # type: ignore[attr-defined]
    return n


def enter_userns(port: int) -> dict[str, float]:
    """Child side of the spare-shell variant: own user+mount+net namespaces, wait for the
    host helper to plumb the spare's interface, /work and cgroup, then drop everything."""
    t0 = time.perf_counter()
    _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET), "unshare")
    # The uid/gid maps are written by the host helper: mapping uid 0 needs CAP_SETFCAP in
    # the parent user namespace (kernel >= 5.12), which this process does not have.
    t1 = time.perf_counter()
    go = os.path.join(CTL, f"go-{port}")
    with open(os.path.join(CTL, f"ready-{port}"), "w") as f:
        f.write(str(os.getpid()))
    while not os.path.exists(go):  # the host helper plumbs us meanwhile
        time.sleep(0.0005)
    t2 = time.perf_counter()
    # Drop every capability this process holds in its own user namespace.
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    hdr = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(libc.capset(hdr, data), "capset")
    return {"unshare_ms": (t1 - t0) * 1e3, "plumb_wait_ms": (t2 - t1) * 1e3}


def own_selector_and_self_pipe(loop: Any) -> None:
    """The child shares the parent's epoll instance and the loop's self-pipe (both are
    inherited file descriptions): an unregister in the child would silently remove the
    parent's registration, and wake-ups would cross. Give the child its own of each."""
    old = loop._selector
    new = selectors.DefaultSelector()
    ssock = loop._ssock.fileno()
    for key in list(old.get_map().values()):
        if key.fd != ssock:
            new.register(key.fileobj, key.events, key.data)
    loop._selector = new
    old.close()  # closes only the child's descriptor of the shared epoll
    loop._close_self_pipe()
    loop._make_self_pipe()


def become_child(port: int, req: dict[str, Any], conn: asyncio.StreamWriter) -> None:
    """In the forked child, on the event-loop thread: drop the parent's sockets, serve anew."""
    assert SERVER is not None and CTL_SERVER is not None
    info: dict[str, Any] = {"port": port}
    # CPython's asyncio at-fork hook forgets the running loop (and the signal wakeup fd) in
    # the child, though this very loop is running us: put it back.
    asyncio.events._set_running_loop(JOBS.loop)
    own_selector_and_self_pipe(JOBS.loop)
    for srv in SERVER.servers:
        srv.close()
    for c in list(SERVER.server_state.connections):
        c.transport.abort()  # our copy only: the parent keeps its own
    CTL_SERVER.close()
    conn.transport.abort()
    if req.get("reset_pools"):
        info["pools_reset"] = reset_thread_pools()
    if req.get("userns"):
        info.update(enter_userns(port))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("0.0.0.0", 8000 if req.get("userns") else port))
    sock.listen(128)
    config = uvicorn.Config(tracked, lifespan="off", log_level="warning")
    child = uvicorn.Server(config)
    tracked.idle.set()
    tracked.gate.set()
    JOBS.n = 0
    asyncio.get_running_loop().create_task(child.serve(sockets=[sock]))
    with open(os.path.join(CTL, f"child-{port}.json"), "w") as f:
        json.dump(info, f)


async def handle_ctl(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while line := await reader.readline():
        req = json.loads(line)
        out: dict[str, Any] = {}
        if req["op"] == "fork":
            t0 = time.perf_counter()
            if req.get("gate", True):
                tracked.gate.clear()
            try:
                await tracked.quiescent()
                t1 = time.perf_counter()
                if req.get("freeze"):
                    gc.freeze()
                children = []
                for port in req["ports"]:
                    f0 = time.perf_counter()
                    pid = os.fork()
                    if pid == 0:
                        try:
                            become_child(port, req, writer)
                        except BaseException:
                            with open(os.path.join(CTL, f"error-{port}.txt"), "w") as f:
                                traceback.print_exc(file=f)
                            os._exit(1)
                        return
                    ms = (time.perf_counter() - f0) * 1e3
                    children.append({"pid": pid, "port": port, "fork_ms": ms})
                if req.get("freeze"):
                    gc.unfreeze()
            finally:
                tracked.gate.set()
            threads = threading.active_count()
            out = {"wait_ms": (t1 - t0) * 1e3, "children": children, "threads": threads}
        elif req["op"] == "info":
            threads = threading.active_count()
            out = {"pid": os.getpid(), "inflight": tracked.inflight, "threads": threads}
        writer.write(json.dumps(out).encode() + b"\n")
        await writer.drain()


async def main() -> None:
    global SERVER, CTL_SERVER
    path = os.path.join(CTL, "ctl.sock")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    JOBS.loop = asyncio.get_running_loop()
    CTL_SERVER = await asyncio.start_unix_server(handle_ctl, path)
    os.chmod(path, 0o666)
    SERVER = uvicorn.Server(uvicorn.Config(tracked, host="0.0.0.0", port=8000, log_level="warning"))
    await SERVER.serve()


if __name__ == "__main__":
    tracked = Tracked(load_app())
    asyncio.run(main())
