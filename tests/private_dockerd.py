"""A dockerd of a test's own, so that restarting or reconfiguring it disturbs nobody.

Its own socket, data root, exec root, pidfile and bridge, and no iptables rules (the shared
daemon's stay as they are). Never ``--bridge=none``: a second dockerd given it deletes the
shared daemon's docker0 (seen here), which breaks every later ``docker build`` and run.

``resolv_conf``: the text of the ``/etc/resolv.conf`` this dockerd reads (and so the
upstream resolvers of its embedded DNS), shown to it alone: it runs in a mount namespace of
its own where that file is bind-mounted over ``/etc/resolv.conf``. The host's file is never
touched. Mounts made on the host after that namespace was made reach it only under a shared
mount (the host's ``/`` is private here), so the root is bind-mounted on itself and made
shared first: a server whose state dir is under ``root`` (``state_dir``) has its volumes'
mounts seen by this dockerd.

    d = PrivateDockerd(Path("/tmp/denv-dockerd-1"), resolv_conf="nameserver 127.9.8.7\\n")
    d.start()
    d.load("denv-http-standin:latest")     # from the shared daemon
    os.environ["DOCKER_HOST"] = d.host      # then start a server on d.state_dir
    ...
    d.remove()                             # stopped; bridge, mounts and root removed

The session fixture ``private_engine`` (tests/conftest.py) is one of these, shared by the
tests that need a daemon of their own (restarting it, reading its DNS): copying the
stand-in image into a fresh daemon costs about 12 s. Its upstream resolver is a
``DnsRecorder``: a tiny DNS server on a random loopback address that records every query.
"""

from __future__ import annotations

import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

START_TIMEOUT_S = 60.0


def mounted(path: Path) -> bool:
    """Whether ``path`` is a mount point (a bind mount on the same filesystem included, which
    ``os.path.ismount`` misses)."""
    with open("/proc/self/mountinfo") as info:
        return any(line.split()[4] == str(path) for line in info)


class DnsRecorder:
    """A DNS server on ``address``:53 that records every query's name and answers NXDOMAIN."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for _ in range(20):
            octets = (random.randrange(64, 128), random.randrange(256), random.randrange(1, 255))
            self.address = "127.{}.{}.{}".format(*octets)
            try:
                self.sock.bind((self.address, 53))
                break
            except OSError:
                continue
        else:
            raise RuntimeError("no free loopback address for the test's DNS recorder")
        self.queries: list[str] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                query, peer = self.sock.recvfrom(4096)
            except OSError:
                return  # closed
            labels, i = [], 12
            try:
                while query[i]:
                    labels.append(query[i + 1 : i + 1 + query[i]].decode())
                    i += 1 + query[i]
            except (IndexError, UnicodeDecodeError):
                self.queries.append(f"<unreadable query from {peer[0]}>")
                continue
            self.queries.append(".".join(labels).lower())
            # A response, recursion available, NXDOMAIN; the question echoed, no answers.
            head = query[:2] + (0x8183).to_bytes(2, "big") + bytes([0, 1, 0, 0, 0, 0, 0, 0])
            self.sock.sendto(head + query[12 : i + 5], peer)

    def saw(self, token: str) -> list[str]:
        """The recorded names that hold ``token``."""
        return [q for q in self.queries if token in q]

    def close(self) -> None:
        self.sock.close()
        self._thread.join(5)


class DaemonDidNotStart(RuntimeError):
    pass


class PrivateDockerd:
    """A dockerd of a test's own (see the module's docstring)."""

    def __init__(self, root: Path, resolv_conf: str | None = None, tmpfs_mb: int = 0) -> None:
        self.root = root
        self.sock = root / "docker.sock"
        self.host = f"unix://{self.sock}"
        self.bridge = f"dvt{os.getpid() % 1_000_000}"
        self.resolv_conf = resolv_conf
        self.state_dir = root / "state"
        self.tmpfs_mb = tmpfs_mb
        self.proc: subprocess.Popen[bytes] | None = None
        self.recorder: DnsRecorder | None = None  # its upstream, when a test gives it one

    def command(self) -> list[str]:
        dockerd = [
            "dockerd",
            *("--host", self.host),
            *("--data-root", str(self.root / "data")),
            *("--exec-root", str(self.root / "exec")),
            *("--pidfile", str(self.root / "dockerd.pid")),
            "--iptables=false",
            "--ip-masq=false",
            f"--bridge={self.bridge}",
        ]
        if self.resolv_conf is None:
            return dockerd
        path = self.root / "resolv.conf"
        path.write_text(self.resolv_conf)
        # unshare execs sh, which execs dockerd: the Popen's pid is dockerd's.
        script = (
            f"mount --bind {shlex.quote(str(path))} /etc/resolv.conf && exec {shlex.join(dockerd)}"
        )
        return ["unshare", "--mount", "--propagation", "slave", "sh", "-c", script]

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.resolv_conf is not None and not mounted(self.root):
            subprocess.run(["mount", "--bind", str(self.root), str(self.root)], check=True)
            subprocess.run(["mount", "--make-rshared", str(self.root)], check=True)
        data = self.root / "data"
        if self.tmpfs_mb and not mounted(data):
            data.mkdir(exist_ok=True)
            size = f"size={self.tmpfs_mb}m"
            subprocess.run(["mount", "-t", "tmpfs", "-o", size, "tmpfs", str(data)], check=True)
        if not Path(f"/sys/class/net/{self.bridge}").exists():
            subprocess.run(["ip", "link", "add", self.bridge, "type", "bridge"], check=True)
        subprocess.run(["ip", "link", "set", self.bridge, "up"], check=True)
        log = open(self.root / "dockerd.log", "ab")  # noqa: SIM115 (the daemon keeps it)
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.root / "dockerd.log").read_text(errors="replace")[-1500:]
                raise DaemonDidNotStart(f"the private dockerd did not come up:\n{tail}")
            time.sleep(0.2)

    def answers(self) -> bool:
        done = subprocess.run(
            ["docker", "-H", self.host, "info"], capture_output=True, check=False, timeout=30
        )
        return done.returncode == 0

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)

    def remove(self) -> None:
        """Stop it and remove its bridge, mounts and root."""
        self.stop()
        subprocess.run(["umount", "-R", str(self.root / "exec")], capture_output=True)
        for path in (self.root / "data", self.root):
            # Lazily if still busy (dockerd's containerd may be exiting): detached at once.
            umount = ["umount", "-R", str(path)]
            if mounted(path) and subprocess.run(umount, capture_output=True).returncode:
                subprocess.run([*umount, "-l"], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)

    def docker(self, *args: str) -> str:
        return subprocess.run(
            ["docker", "-H", self.host, *args], capture_output=True, text=True, check=True
        ).stdout

    def load(self, *images: str) -> None:
        """Copy ``images`` from the shared daemon (``docker save | docker load``)."""
        save = subprocess.Popen(["docker", "save", *images], stdout=subprocess.PIPE)
        load = subprocess.run(
            ["docker", "-H", self.host, "load"], stdin=save.stdout, capture_output=True
        )
        assert save.stdout is not None
        save.stdout.close()
        if save.wait() != 0 or load.returncode != 0:
            raise RuntimeError(f"loading {images} into the private dockerd failed: {load.stderr!r}")
