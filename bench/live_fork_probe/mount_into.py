"""Host-side helper: attach the host directory ``src`` at ``dst`` in process ``pid``'s mount
namespace, with the new mount API (a detached clone, then setns, then move_mount).

    python mount_into.py PID SRC DST     (root on the host; single-threaded, as setns needs)

The mount is made by host root, so an overlay (ext4 upper included) mounted on the host works
where one mounted inside the child's user namespace does not.
"""

from __future__ import annotations

import ctypes
import os
import sys

SYS_OPEN_TREE, SYS_MOVE_MOUNT = 428, 429  # x86_64
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC, AT_RECURSIVE = 1, 0o2000000, 0x8000
MOVE_MOUNT_F_EMPTY_PATH, AT_FDCWD, CLONE_NEWNS = 0x4, -100, 0x00020000
libc = ctypes.CDLL(None, use_errno=True)


def check(rc: int, what: str) -> int:
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return rc


def main() -> None:
    pid, src, dst = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE
    tree = check(libc.syscall(SYS_OPEN_TREE, AT_FDCWD, src.encode(), flags), "open_tree")
    ns = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)
    check(libc.setns(ns, CLONE_NEWNS), "setns(mnt)")
    check(
        libc.syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, dst.encode(), MOVE_MOUNT_F_EMPTY_PATH),
        "move_mount",
    )


if __name__ == "__main__":
    main()
