"""Live children's root filesystems: each child's own copy-on-write view of its container's.

A live child runs in its parent's container, so without this it would write the image's
filesystem (``/workspace``, ``/tmp``, ``/root``, ``/app``) where its parent and siblings do. At
each live fork, while the parent waits at its gate, the node copies the parent's changes to
the image (the container's writable layer for the group's env, a live child's own upper
dir for a child) into a *capture*, and mounts per child an overlay of that capture, the
captures its ancestors got, and the image's layers, with a fresh upper dir of its own. The
child makes that overlay its root (``_denv_live.own_root``). So each child starts with
exactly its parent's files, and nobody sees anyone else's writes after the fork.

Layout under the group's env dir ``envs/<group>/rootfs/``: ``c-<hex>/`` (a capture: an
overlay upper dir copied with its whiteouts, opaque dirs and owners; immutable) and
``users/<env>`` (the lower dirs of a child's overlay, one a line, newest first). A capture
is removed once no child's ``users`` file names it, no fork is still mounting over it and
it is not the last one of a live parent (which its next fork may take again).
The group's whole dir goes with its container (``Volumes.remove_env``).

    lowers = [upper_capture, *rootfs.lowers(group, parent)]   # or the image's layers
    rootfs.attach(group, slot, env_id, base, lowers)         # envs/<group>/live/<slot>/root
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

from denv.server.volumes.mounts import mount

log = logging.getLogger(__name__)

# mount(2) copies at most a page of options: a lowerdir list past it cannot be mounted.
MAX_OPTIONS = 4000
ROOT = "root"  # a child's root overlay in its slot dir, and its upper's dir on its volume fs
SETTLE_NS = 100_000_000  # a capture is reused only if its upper was still this long before
VANISHED = "No such file or directory"  # cp's word for a file removed while it copied


class RootFsError(Exception):
    """A child's root filesystem could not be made (the message says why)."""


class RootFs:
    """Captures and mounts live children's root overlays under one state dir's ``envs``."""

    def __init__(self, envs_dir: Path) -> None:
        self.envs_dir = Path(os.path.abspath(envs_dir))  # lowers are named by whole paths
        self._lock = threading.Lock()
        self._in_flight: set[Path] = set()  # captures made, their children not yet named
        # (group, env) -> its last capture and what its upper was then: a parent whose
        # upper has not changed since (a zygote, a root forked again before its next step)
        # gives its next children the same capture, copied once.
        self._last: dict[tuple[str, str], tuple[Path, bytes]] = {}
        # group -> how many children's ``users`` files name each lower dir (read from the
        # files once a server run, at the group's first need, then kept up to date)
        self._refs: dict[str, Counter[str]] = {}

    def _dir(self, group: str) -> Path:
        return self.envs_dir / group / "rootfs"

    def capture(self, group: str, env_id: str, upper: Path) -> Path:
        """Copy the upper dir of ``env_id`` (its container's writable layer, or a child's
        upper) into a capture of ``group``, or take its last one if the upper has not
        changed since: kept from removal until :meth:`done`."""
        now = time.time_ns()
        mark, newest = fingerprint(upper)
        with self._lock:
            last = self._last.get((group, env_id))
            if last is not None and last[1] == mark and last[0].is_dir():  # not collected
                self._in_flight.add(last[0])
                return last[0]
        top = self._dir(group)
        (top / "users").mkdir(parents=True, exist_ok=True)
        target = top / f"c-{os.urandom(6).hex()}"
        with self._lock:
            self._in_flight.add(target)
        try:
            # cp -a keeps what an overlay needs: whiteouts (0/0 char devices), the opaque
            # dirs' trusted.overlay xattrs, owners, modes and times.
            proc = subprocess.run(
                ["cp", "-a", f"{upper}/.", str(target)], capture_output=True, text=True
            )
            # A file the container's other processes (not the gated server) removed while it
            # was copied is simply not in the capture, as if removed just before.
            errors = [e for e in proc.stderr.splitlines() if VANISHED not in e]
            if proc.returncode != 0 and (errors or not target.is_dir()):
                raise RootFsError(f"copying {upper} failed: {' '.join(errors)[:400]}")
        except BaseException:
            self.done(group, target)
            raise
        # A change within a clock tick of an entry's last one may keep its ctime (before
        # multigrain timestamps, Linux 6.13): a capture is reused only if no entry changed
        # shortly before it was taken.
        if newest < now - SETTLE_NS:
            with self._lock:
                old = self._last.get((group, env_id))
                self._last[(group, env_id)] = (target, mark)
            if old is not None:
                self._collect(group, [str(old[0])])
        return target

    def done(self, group: str, capture: Path) -> None:
        """The fork that made (or took) ``capture`` has named it in each child's ``users``
        file, or failed: removed if nothing stands on it."""
        with self._lock:
            self._in_flight.discard(capture)
        self._collect(group, [str(capture)])

    def upper_base(self, env_id: str, base: Path | None) -> Path:
        """Where a child's root upper and work dirs live: on its first volume's filesystem
        (``base/fs``, so its writes count against that volume's size), else its env dir."""
        return base / "fs" / ROOT if base is not None else self.envs_dir / env_id / ROOT

    def attach(
        self, group: str, slot: str, env_id: str, base: Path | None, lowers: list[str]
    ) -> None:
        """Mount a child's root overlay (``lowers`` newest first, a fresh upper) at
        ``envs/<group>/live/<slot>/root``, and record its lowers as its ``users`` file."""
        fs = self.upper_base(env_id, base)
        for d in (fs / "upper", fs / "work"):
            d.mkdir(parents=True, exist_ok=True)
        opts = f"lowerdir={':'.join(lowers)},upperdir={fs / 'upper'},workdir={fs / 'work'}"
        if len(opts) > MAX_OPTIONS:
            raise RootFsError(
                f"its root filesystem would stack {len(lowers)} layers, more than one mount "
                "can name: fork a shallower env"
            )
        users = self._dir(group) / "users"
        users.mkdir(parents=True, exist_ok=True)
        with self._lock:
            refs = self._refs_of(group)
            (users / env_id).write_text("".join(f"{x}\n" for x in lowers))
            refs.update(lowers)
        target = self.envs_dir / group / "live" / slot / ROOT
        target.mkdir(parents=True, exist_ok=True)
        # No nosuid/nodev: this is the image's filesystem, mounted as Docker mounts it.
        mount("overlay", target, "overlay", 0, opts)

    def lowers(self, group: str, env_id: str) -> list[str] | None:
        """A child's lower dirs, newest first; None when it has no root of its own."""
        try:
            text = (self._dir(group) / "users" / env_id).read_text()
        except FileNotFoundError:
            return None
        return [line for line in text.splitlines() if line]

    def release(self, group: str, env_id: str) -> None:
        """A live env is gone (a child's overlay unmounted): forget it, and remove the
        captures it stood on, or made last, that no other child stands on and no parent may
        give again."""
        mine = self._dir(group) / "users" / env_id
        with self._lock:
            last = self._last.pop((group, env_id), None)
            candidates = [str(last[0])] if last is not None else []  # its own last capture
            if mine.exists():
                refs = self._refs_of(group)
                lowers = self.lowers(group, env_id) or []
                mine.unlink()
                refs.subtract(lowers)
                candidates += lowers
        self._collect(group, candidates)

    def _refs_of(self, group: str) -> Counter[str]:
        """The group's counts of lower dirs (under the lock)."""
        refs = self._refs.get(group)
        if refs is None:
            refs = Counter()
            users = self._dir(group) / "users"
            with contextlib.suppress(FileNotFoundError), os.scandir(users) as files:
                for f in files:
                    with contextlib.suppress(OSError):
                        refs.update(x for x in Path(f.path).read_text().splitlines() if x)
            self._refs[group] = refs
        return refs

    def _collect(self, group: str, candidates: list[str]) -> None:
        """Remove those of ``candidates`` that are captures of ``group`` no child stands on,
        no fork is mounting over and no parent may give again."""
        top = str(self._dir(group))
        doomed = []
        with self._lock:
            refs = self._refs_of(group)
            kept = {str(c) for c, _ in self._last.values()} | {str(c) for c in self._in_flight}
            for c in candidates:
                path = Path(c)
                if str(path.parent) != top or not path.name.startswith("c-"):
                    continue  # an image layer, or another group's
                if refs[c] > 0 or c in kept:
                    continue
                refs.pop(c, None)
                gone = path.with_name(f".rm-{path.name}")
                with contextlib.suppress(OSError):  # renamed under the lock: out of reach
                    os.rename(path, gone)
                    doomed.append(gone)
        for p in doomed:
            shutil.rmtree(p, ignore_errors=True)

    def forget(self, group: str) -> None:
        """A group's container and dir are gone: nothing of it is kept in memory either."""
        with self._lock:
            for key in [k for k in self._last if k[0] == group]:
                del self._last[key]
            self._refs.pop(group, None)


def fingerprint(top: Path) -> tuple[bytes, int]:
    """What an upper dir holds, by each entry's path, inode, size, mode and ctime (which
    every change to a file's content, owner, mode or xattrs moves): equal only if nothing
    under ``top`` changed; and the newest ctime seen (ns)."""
    h = hashlib.blake2b(digest_size=16)
    st = top.lstat()
    h.update(f"{st.st_ino} {st.st_ctime_ns}\n".encode())
    newest = st.st_ctime_ns
    stack = [str(top)]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                line = f"{entry.path}\0{st.st_ino} {st.st_size} {st.st_mode} {st.st_ctime_ns}\n"
                h.update(line.encode(errors="surrogateescape"))
                newest = max(newest, st.st_ctime_ns)
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
    return h.digest(), newest
