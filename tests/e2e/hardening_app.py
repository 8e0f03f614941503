"""The app the hardening tests run in envs (``python3 -c <this file>``), stdlib only: what the
kernel under it refuses, reports and lets it do to itself. Port 8000.

GET /health -> {"ok": true}; /headers -> the request's headers; /caps -> each privileged
call's outcome ("refused: EPERM" or "allowed") and /work's mount options; /probe -> the kernel
it runs on (release, /proc/version), syscalls the host's kernel has and gVisor's does not, and
the privileged calls but mknod (gVisor lets a process make nodes in its own memory) with a
node of the host's first disk opened; /connect/<host>:<port> -> a TCP connect's outcome;
/bomb -> fork until refused (20 s at most); /hog -> allocate until killed.
"""

import contextlib
import ctypes
import errno
import http.server
import json
import os
import platform
import signal
import socket
import stat
import time

libc = ctypes.CDLL(None, use_errno=True)


def refused(probe):
    try:
        probe()
    except OSError as exc:
        return "refused: " + errno.errorcode.get(exc.errno, str(exc.errno))
    return "allowed"


def do_mount():
    if libc.mount(b"none", b"/mnt", b"tmpfs", 0, None) != 0:
        raise OSError(ctypes.get_errno(), "mount")


def do_chown():
    open("/tmp/owned", "w").close()
    os.chown("/tmp/owned", 4321, 4321)


def host_disk():
    # a node for the host's first disk (8, 0): made or not, it must not open onto a disk
    with contextlib.suppress(OSError):
        os.mknod("/tmp/disk", 0o600 | stat.S_IFBLK, os.makedev(8, 0))
    os.close(os.open("/tmp/disk", os.O_RDONLY))


PROBES = {
    "mknod": lambda: os.mknod("/tmp/null", 0o600 | stat.S_IFCHR, os.makedev(1, 3)),
    "raw_socket": lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
    "mount": do_mount,
    "chown": do_chown,
    "setuid": lambda: os.setuid(4321),
}


def syscall(nr, *args):
    ctypes.set_errno(0)
    return "ok" if libc.syscall(nr, *args) >= 0 else errno.errorcode[ctypes.get_errno()]


def read(path):
    with open(path) as f:
        return f.read().strip()


def probe():
    privileged = {name: refused(p) for name, p in PROBES.items() if name != "mknod"}
    privileged["host_disk"] = refused(host_disk)
    return {
        "release": platform.release(),
        "proc_version": read("/proc/version"),
        "syscalls": {  # x86_64 numbers; each is in Docker's default seccomp allowlist
            "pidfd_open": syscall(434, os.getpid(), 0),
            "memfd_secret": syscall(447, 0),
            "landlock_create_ruleset": syscall(444, 0, 0, 1),
        },
        "privileged": privileged,
    }


def connect(target):
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        return "connected"
    except OSError as exc:
        return type(exc).__name__


def bomb(seconds):
    children, error, deadline = [], "", time.monotonic() + seconds
    while time.monotonic() < deadline and len(children) < 100000:
        try:
            pid = os.fork()
        except OSError as exc:
            error = errno.errorcode.get(exc.errno, str(exc.errno))
            break
        if pid == 0:
            time.sleep(seconds)
            os._exit(0)
        children.append(pid)
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    for pid in children:
        os.waitpid(pid, 0)
    return {"forked": len(children), "error": error}


def hog():
    print("hogging memory in 16 MiB chunks", flush=True)
    chunks = []
    while True:
        chunks.append(b"\x01" * (16 << 20))


def work_mount():
    with open("/proc/self/mountinfo") as mounts:
        for line in mounts:
            parts = line.split()
            if parts[4] == "/work":
                return parts[5]
    return ""


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health":
            body = {"ok": True}
        elif self.path == "/headers":
            body = {k.lower(): v for k, v in self.headers.items()}
        elif self.path == "/caps":
            body = {name: refused(p) for name, p in PROBES.items()}
            body["work_mount"] = work_mount()
        elif self.path == "/probe":
            body = probe()
        elif self.path.startswith("/connect/"):
            body = {"result": connect(self.path.removeprefix("/connect/"))}
        elif self.path == "/bomb":
            body = bomb(20)
        elif self.path == "/hog":
            body = hog()
        else:
            body = {}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("", 8000), Handler).serve_forever()
