"""Run inside a user + mount namespace (``unshare -Urm python3 overlay_try.py CASE``): mount an
overlay at /mnt over /data/lower, the upper chosen by CASE, with mount(2); read the lower's file,
write a new one. Prints MOUNT_OK or the errno."""

from __future__ import annotations

import ctypes
import os
import sys

libc = ctypes.CDLL(None, use_errno=True)


def mount(src: str, dst: str, fstype: str, opts: str) -> None:
    if libc.mount(src.encode(), dst.encode(), fstype.encode(), 0, opts.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype} {opts}: {os.strerror(err)}")


def main(case: str) -> None:
    upper, work = "/data/upper", "/data/work"
    extra = "userxattr," if case == "ext4-userxattr" else ""
    if case == "tmpfs":
        mount("t", "/tmp", "tmpfs", "")
        os.mkdir("/tmp/u")
        os.mkdir("/tmp/w")
        upper, work = "/tmp/u", "/tmp/w"
    mount("o", "/mnt", "overlay", f"{extra}lowerdir=/data/lower,upperdir={upper},workdir={work}")
    with open("/mnt/parent.txt") as f:
        print(f.read().strip())
    with open("/mnt/child.txt", "w") as f:
        f.write("child\n")
    print(sorted(os.listdir("/mnt")), "MOUNT_OK")


if __name__ == "__main__":
    main(sys.argv[1])
