"""Mount primitives of the host: mount(2) without a process, and unmounting a whole tree.

mount("overlay", target, "overlay", MS_NOSUID | MS_NODEV, "lowerdir=...")
unmount_all(*roots)    # every mount at or below each root, stacked ones included
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)

MS_NOSUID = 2
MS_NODEV = 4
MS_BIND = 4096
MS_SHARED = 1 << 20
MNT_DETACH = 2

_libc: ctypes.CDLL | None = None


def mount(source: str, target: Path, fstype: str | None, flags: int, data: str | None) -> None:
    """The mount(2) syscall: no ``mount`` process to start on the fork path."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    rc = _libc.mount(
        source.encode(),
        os.fsencode(target),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mounting {fstype or source} on {target} failed: {os.strerror(err)}")


def _unescape(path: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def _escape(path: str) -> str:
    """A path as mountinfo writes it (space, tab, newline and backslash octal-escaped)."""
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in path)


def mount_points_under(*roots: Path) -> list[str]:
    """Mount points at or below any of ``roots``, deepest (and latest) first. One read of
    the mount table; only its lines that name a root are parsed (a host with a thousand
    live envs has thousands of mounts, and a delete reads the table). No roots: none."""
    if not roots:
        return []
    tops = [str(root.resolve()).rstrip("/") for root in roots]
    needles = [_escape(top) for top in tops]
    found: list[str] = []
    with open("/proc/self/mountinfo") as f:
        table = f.read()
    for line in table.splitlines():
        if not any(needle in line for needle in needles):
            continue
        point = _unescape(line.split()[4])
        if any(point == top or point.startswith(top + "/") for top in tops):
            found.append(point)
    found.reverse()  # later (stacked) mounts are listed after the ones under them
    return sorted(found, key=lambda p: p.count("/"), reverse=True)


def unmount_all(*roots: Path) -> None:
    """Unmount everything at or below each of ``roots`` (stacked mounts included)."""
    for _ in range(64):
        points = mount_points_under(*roots)
        if not points:
            return
        for point in points:
            if _umount2(point, 0) != 0:  # busy: detach it now, the kernel frees it when unused
                _umount2(point, MNT_DETACH)
    log.warning("mounts left under %s after repeated umount", ", ".join(map(str, roots)))


def _umount2(point: str, flags: int) -> int:
    """umount2(2): no ``umount`` process per mount point (a volume has three)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    return int(_libc.umount2(os.fsencode(point), ctypes.c_int(flags)))
