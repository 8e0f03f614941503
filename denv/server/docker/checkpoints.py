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
# ingress's, a published port's proxy, a probe). One still open is waited for QUIET_WAIT_S;
# one this side already closed, for the sandbox to close its end (under ptrace and load that
# took over 0.3 s in a CI run), CLOSING_WAIT_S.
QUIET_WAIT_S, CLOSING_WAIT_S, QUIET_POLL_S = 0.3, 3.0, 0.03
# /proc/net/tcp's states: TIME_WAIT (this side closed first, the container's end is gone)
# is not counted; FIN_WAIT1, FIN_WAIT2, CLOSE, LAST_ACK and CLOSING are closing.
_TIME_WAIT = "06"
_CLOSING = frozenset({"04", "05", "07", "09", "0B"})
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


def connection_states(addresses: set[str]) -> list[str]:
    """The states (/proc/net/tcp's hex) of this network namespace's TCP connections to any
    of ``addresses`` (IPv4), but those in TIME_WAIT (the other side's end is gone)."""
    wanted = {_hex_ip(a) for a in addresses if a.count(".") == 3}
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return []
    rows = [line.split() for line in lines]
    return [
        f[3] for f in rows if len(f) > 3 and f[2].split(":")[0] in wanted and f[3] != _TIME_WAIT
    ]


def connections_to(addresses: set[str]) -> int:
    """How many connections to ``addresses`` this network namespace holds (TIME_WAIT aside)."""
    return len(connection_states(addresses))


def wait_quiet(env_id: str, addresses: set[str]) -> None:
    """Return once no connection to ``addresses`` is left, waiting ``QUIET_WAIT_S`` for open
    ones and ``CLOSING_WAIT_S`` for those closing; ``CheckpointUnsupported`` naming how many
    stay."""
    began = time.monotonic()
    while states := connection_states(addresses):
        waited = time.monotonic() - began
        closing = all(state in _CLOSING for state in states)
        if waited >= (CLOSING_WAIT_S if closing else QUIET_WAIT_S):
            break
        time.sleep(QUIET_POLL_S)
    if n := len(states):
        raise CheckpointUnsupported(
            f"env {env_id} has {n} open connection{'s' if n > 1 else ''} (a WebSocket session, "
            "a request in flight or a client of a published port), and a sandbox holding one "
            "cannot be saved: its children boot from /work (close the session before forking "
            "to resume them from the parent's sandbox)"
        )


def _hex_ip(address: str) -> str:
    """An IPv4 address as /proc/net/tcp writes it (little-endian hex)."""
    return "".join(f"{int(part):02X}" for part in reversed(address.split(".")))
