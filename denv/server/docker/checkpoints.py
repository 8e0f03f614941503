"""Sandbox checkpoints on the Docker node (``CheckpointCalls``): where their images live, who
saves them, and how a container resumes from one.

The node does not know how a sandbox is saved: its runtime does. The composition root gives
it a ``SandboxSaver`` (gVisor's: ``denv.server.gvisor.checkpoint``); without one (runc) every
``checkpoint`` is ``CheckpointUnsupported``. A container created with ``RESTORE_ENV`` naming
an image is resumed from it by the runtime (gVisor's ``denv-runsc``: ``runsc restore`` where
Docker asks it to start the container), in the network, mounts and limits Docker made for it.

Images live under ``root`` (``<state dir>/checkpoints``), one directory per checkpoint. The
lifecycle lets go of one once its children have started; one it never let go of (the
server stopped first) goes at a later checkpoint, once older than ``STALE_S``.
"""

from __future__ import annotations

import itertools
import logging
import shutil
import threading
import time
from pathlib import Path
from typing import Protocol

from denv.server.docker.engine import Engine
from denv.server.node.errors import CheckpointUnsupported
from denv.server.node.seam import Checkpoint

log = logging.getLogger(__name__)

# Read by the container's runtime: the image it resumes the sandbox from instead of starting
# the container's command.
RESTORE_ENV = "DENV_RESTORE_IMAGE"
# A sandbox holding an open TCP connection cannot be saved, and a save that fails on one
# leaves that connection stalled for a while (gVisor stops its packets for the save): so no
# save is tried while this machine has a connection to the container's address (the
# ingress's, a published port's proxy, a probe). Those closing are waited for this long.
QUIET_WAIT_S, QUIET_POLL_S = 0.3, 0.03
_TIME_WAIT = "06"  # /proc/net/tcp's state: this side closed first, the container's is gone
STALE_S = 3600.0  # an image nobody let go of (the server stopped before its children started)


class SandboxSaver(Protocol):
    """Saves a running container's sandbox into a directory (the runtime's own way)."""

    def save(self, container: str, pid: int, dest: Path) -> None:
        """Save ``container`` (its sandbox's process ``pid``) into ``dest`` while it keeps
        running; ``CheckpointUnsupported`` naming why not."""
        ...


class Checkpoints:
    """The node's checkpoint images: saved, found for a restore, let go of."""

    def __init__(
        self, engine: Engine, root: Path, saver: SandboxSaver | None, why_not: str
    ) -> None:
        """``why_not``: what ``checkpoint`` says when there is no ``saver``."""
        self.engine, self.root, self.saver, self.why_not = engine, root, saver, why_not
        self._n = itertools.count()
        self._lock = threading.Lock()

    def save(self, env_id: str, container: str) -> Checkpoint:
        if self.saver is None:
            raise CheckpointUnsupported(self.why_not)
        info = self.engine.inspect(container)
        pid = int(((info or {}).get("State") or {}).get("Pid") or 0)
        if pid <= 0:
            raise CheckpointUnsupported(
                f"env {env_id}'s container is not running: no sandbox to save"
            )
        networks = ((info or {}).get("NetworkSettings") or {}).get("Networks") or {}
        wait_quiet(env_id, {n.get("IPAddress") for n in networks.values()} - {None, ""})
        self.sweep()
        dest = self.root / f"{env_id}-{time.time_ns()}-{next(self._n)}"
        dest.mkdir(parents=True, mode=0o700)
        t0 = time.perf_counter()
        try:
            self.saver.save(container, pid, dest)
        except BaseException:
            shutil.rmtree(dest, ignore_errors=True)
            raise
        seconds = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
        log.info("checkpoint of %s: %.2f s, %.1f MB", env_id, seconds, size / 1e6)
        return Checkpoint(env_id=env_id, image=dest.name, bytes=size, seconds=seconds)

    def path(self, image: str) -> Path | None:
        """Where ``image`` is, or None when it is gone (or not a name of this node's)."""
        path = self.root / image
        if not image or "/" in image or image.startswith(".") or not path.is_dir():
            return None
        return path

    def drop(self, image: str) -> None:
        if (path := self.path(image)) is not None:
            shutil.rmtree(path, ignore_errors=True)

    def sweep(self) -> None:
        """Remove images older than ``STALE_S``: nobody is left to let go of them."""
        if not self.root.is_dir():
            return
        with self._lock:
            cutoff = time.time() - STALE_S
            for path in self.root.iterdir():
                if path.is_dir() and path.stat().st_mtime < cutoff:
                    log.info("removing the stale checkpoint %s", path.name)
                    shutil.rmtree(path, ignore_errors=True)


def connections_to(addresses: set[str]) -> int:
    """This network namespace's TCP connections to any of ``addresses`` (IPv4), but those
    this side closed first (TIME_WAIT: the other side's end is gone)."""
    wanted = {_hex_ip(a) for a in addresses if a.count(".") == 3}
    found = 0
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return 0
    for line in lines:
        fields = line.split()
        if len(fields) > 3 and fields[2].split(":")[0] in wanted and fields[3] != _TIME_WAIT:
            found += 1
    return found


def wait_quiet(env_id: str, addresses: set[str]) -> None:
    """Return once no connection to ``addresses`` is open (waiting ``QUIET_WAIT_S`` for those
    closing); ``CheckpointUnsupported`` naming how many stay open."""
    deadline = time.monotonic() + QUIET_WAIT_S
    while (n := connections_to(addresses)) and time.monotonic() < deadline:
        time.sleep(QUIET_POLL_S)
    if n:
        raise CheckpointUnsupported(
            f"env {env_id} has {n} open connection{'s' if n > 1 else ''} (a WebSocket session, "
            "a request in flight or a client of a published port), and a sandbox holding one "
            "cannot be saved: its children boot from /work (close the session before forking "
            "to resume them from the parent's sandbox)"
        )


def _hex_ip(address: str) -> str:
    """An IPv4 address as /proc/net/tcp writes it (little-endian hex)."""
    return "".join(f"{int(part):02X}" for part in reversed(address.split(".")))
