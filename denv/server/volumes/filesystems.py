"""Size-limited volume filesystems: what an env changes in a volume lives in an image of its own.

An env writes a volume through an overlay whose upper dir holds what it changed. This host's
ext4 has no project quotas (the kernel is built without CONFIG_QUOTA) and no reflinks, so the
upper dir (and the overlay's work dir) live on a filesystem of their own: a sparse ext4 image
file, loop-mounted. A write past its size fails with ENOSPC inside the env; the host's disk
holds at most the image's size for the volume, and less once files are deleted (mounted with
``discard``, the loop device punches the freed blocks out of the image).

The cost stays off a fork's path. Formatting is done once per size, into a template; each
volume copies the template's few data blocks (about 150 KB for 10 GiB: no journal, no
reserved GDT blocks, inode tables left to the image's holes), attaches a loop device
(``LOOP_CONFIGURE``) and mounts it with mount(2): about 2 ms, no process started. A warm
spare does this when it boots, so the late mount of a fork only mounts the overlay.

    fs = VolumeFs(state_dir / "volfs", size_mb=10240)
    fs.check()                        # at server start: OSError naming the fix
    fs.make(base / "disk.img", base / "fs")   # base/fs is now an ext4 of 10 GiB
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import struct
import subprocess
import tempfile
import threading
from pathlib import Path

from denv.server.volumes.mounts import MS_NODEV, MS_NOSUID, mount, mount_points_under, unmount_all

log = logging.getLogger(__name__)

LOOP_CTL_GET_FREE = 0x4C82
LOOP_CONFIGURE = 0x4C0A  # Linux 5.8: attach and configure in one call
LO_FLAGS_AUTOCLEAR = 4  # the device detaches itself once unmounted
LOOP_RETRIES = 64  # another process may take the free device between the two calls
# Without a journal: a volume's filesystem lives no longer than its env, which a host crash
# ends anyway, and a journal would be written through to the image on every metadata change.
MKFS_FEATURES = "^has_journal,^resize_inode,sparse_super2"
MOUNT_DATA = "noinit_itable,discard"  # inode tables are the image's holes: zero already
POOL = "pool"  # under the templates dir: the emptied filesystems kept for the next volumes
POOL_MAX = 32  # emptied filesystems kept mounted for the next volumes (a loop device each)


class VolumeFs:
    """Makes and mounts the per-volume filesystems of one server (one size for all).

    A deleted env's filesystem is emptied and kept, mounted, in a pool (``pool/<n>``), up to
    ``POOL_MAX``; the next volume takes one by renaming its dir into place (the mount goes
    with it), so a live fork's children and a boot skip the loop device and the mount, and
    a delete skips the unmount. Emptied means every file the env wrote is gone: what is
    left is the filesystem's root with ``lost+found`` and empty ``upper`` and ``work``.
    The pool is emptied at start (``Volumes`` calls :func:`drain_pool`) and at a clean
    exit (:meth:`drain`).
    """

    def __init__(self, templates_dir: Path, size_mb: int) -> None:
        self.templates_dir = templates_dir
        self.size_mb = size_mb
        self._lock = threading.Lock()
        self.pool_dir = templates_dir / POOL
        self._pool: list[Path] = []

    def drain(self) -> None:
        """Unmount and delete every pooled filesystem."""
        with self._lock:
            self._pool.clear()
            drain_pool(self.templates_dir)

    def take(self, base: Path) -> bool:
        """Move a pooled filesystem to ``base`` (``base/disk.img``, ``base/fs`` mounted,
        with empty ``upper`` and ``work``); False when the pool is empty."""
        with self._lock:
            entry = self._pool.pop() if self._pool else None
        if entry is None:
            return False
        try:
            os.rename(entry, base)
        except OSError:
            log.warning("a pooled volume filesystem could not be moved to %s", base, exc_info=True)
            unmount_all(entry)
            shutil.rmtree(entry, ignore_errors=True)
            return False
        return True

    def give_back(self, base: Path) -> bool:
        """Empty the filesystem of a deleted volume (``base/fs``, mounted, nothing mounted
        under it) and pool it; False (nothing changed but maybe emptied) when it cannot be:
        the pool is full, something else is mounted, or a file resists removal."""
        fs = base / "fs"
        with self._lock:
            if len(self._pool) >= POOL_MAX:
                return False
        if mount_points_under(base) != [str(fs.resolve())]:
            return False
        try:
            _empty(fs, keep={"lost+found"})
            for d in ("upper", "work"):
                (fs / d).mkdir()
            _empty(base, keep={"fs", "disk.img"})
            self.pool_dir.mkdir(parents=True, exist_ok=True)
            entry_dir = self.pool_dir / os.urandom(8).hex()
            os.rename(base, entry_dir)
        except OSError:
            log.debug("volume filesystem of %s not pooled", base, exc_info=True)
            return False
        with self._lock:
            self._pool.append(entry_dir)
        return True

    @property
    def template(self) -> Path:
        return self.templates_dir / f"ext4-{self.size_mb}m.img"

    def _template(self) -> Path:
        with self._lock:
            if not self.template.exists():
                self.templates_dir.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=self.templates_dir, prefix=".tmp-")
                try:
                    os.ftruncate(fd, self.size_mb * 1024 * 1024)
                    os.close(fd)
                    _mkfs(Path(tmp))
                    os.rename(tmp, self.template)
                except BaseException:
                    os.unlink(tmp)
                    raise
        return self.template

    def make(self, image: Path, target: Path) -> None:
        """A fresh filesystem of ``size_mb`` in ``image``, mounted on ``target`` (made)."""
        _copy_sparse(self._template(), image)
        target.mkdir(parents=True, exist_ok=True)
        dev, fd = _attach_loop(image)
        try:
            mount(dev, target, "ext4", MS_NOSUID | MS_NODEV, MOUNT_DATA)
        finally:
            os.close(fd)  # mounted, the device stays; unmounted, it detaches (autoclear)

    def check(self) -> None:
        """Make and mount one filesystem now: OSError (naming the fix) when this host cannot."""
        probe = self.templates_dir / ".probe"
        try:
            unmount_all(probe)
            probe.mkdir(parents=True, exist_ok=True)
            self.make(probe / "disk.img", probe / "fs")
        except OSError as exc:
            raise OSError(
                f"cannot make a size-limited volume filesystem ({exc}); it needs mkfs.ext4 "
                "(e2fsprogs) and loop devices (/dev/loop-control) on the host, or run denv "
                "serve with --max-volume-mb 0 (volume sizes not enforced while envs write)"
            ) from exc
        finally:
            unmount_all(probe)
            for leftover in (probe / "disk.img",):
                leftover.unlink(missing_ok=True)
            for d in (probe / "fs", probe):
                if d.is_dir():
                    d.rmdir()


def drain_pool(templates_dir: Path) -> None:
    """Unmount and delete the pooled filesystems under ``templates_dir`` (its ``pool``),
    whoever made them: a server at start, ``denv cluster down`` for a node that died."""
    pool_dir = templates_dir / POOL
    if pool_dir.exists():
        unmount_all(pool_dir)
        shutil.rmtree(pool_dir, ignore_errors=True)


def _empty(path: Path, keep: set[str]) -> None:
    """Remove everything in the dir ``path`` but the entries named in ``keep`` (a symlink
    is removed, never followed); OSError on the first entry that resists."""
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.name in keep:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)


def _mkfs(image: Path) -> None:
    base = ["mkfs.ext4", "-q", "-F", "-m", "0", "-O", MKFS_FEATURES, "-L", "denv-volume"]
    # assume_storage_prezeroed (e2fsprogs 1.47) keeps the inode tables out of the image.
    for extended in ("lazy_itable_init=1,assume_storage_prezeroed=1", "lazy_itable_init=1"):
        proc = subprocess.run(
            [*base, "-E", extended, str(image)], capture_output=True, text=True, check=False
        )
        if proc.returncode == 0:
            return
    raise OSError(f"mkfs.ext4 failed: {proc.stderr.strip() or proc.returncode}")


def _copy_sparse(src: Path, dst: Path) -> None:
    """Copy ``src`` into a new ``dst`` of the same size, its holes left holes."""
    s = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        d = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(d, os.fstat(s).st_size)
            offset = 0
            while True:
                try:
                    start = os.lseek(s, offset, os.SEEK_DATA)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:  # no data past offset
                        return
                    raise
                end = os.lseek(s, start, os.SEEK_HOLE)
                pos = start
                while pos < end:
                    pos += os.copy_file_range(s, d, end - pos, pos, pos)
                offset = end
        finally:
            os.close(d)
    finally:
        os.close(s)


def _attach_loop(image: Path) -> tuple[str, int]:
    """A free loop device backed by ``image`` (autoclear): its path and an open fd on it."""
    backing = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
        try:
            for _ in range(LOOP_RETRIES):
                dev = f"/dev/loop{fcntl.ioctl(ctl, LOOP_CTL_GET_FREE)}"
                fd = os.open(dev, os.O_RDWR | os.O_CLOEXEC)
                try:
                    fcntl.ioctl(fd, LOOP_CONFIGURE, _loop_config(backing, image))
                    return dev, fd
                except OSError as exc:
                    os.close(fd)
                    if exc.errno != errno.EBUSY:
                        raise
        finally:
            os.close(ctl)
    finally:
        os.close(backing)  # the device holds its own reference
    raise OSError(errno.EBUSY, "no free loop device after repeated tries")


def _loop_config(backing_fd: int, image: Path) -> bytes:
    """``struct loop_config``: fd, block size, ``struct loop_info64``, reserved."""
    info = struct.pack(
        "=5Q4I64s64s32s2Q",
        0,  # lo_device, lo_inode, lo_rdevice, lo_offset, lo_sizelimit
        0,
        0,
        0,
        0,
        0,  # lo_number, lo_encrypt_type, lo_encrypt_key_size, lo_flags
        0,
        0,
        LO_FLAGS_AUTOCLEAR,
        os.fsencode(image)[:63],
        b"",
        b"",
        0,
        0,
    )
    return struct.pack("=II", backing_fd, 0) + info + bytes(64)
