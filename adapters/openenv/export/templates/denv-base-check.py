"""The digest of an image's files: proves a build's base is the image `denv export` pinned.

A tag can name any image, so the exported Dockerfile's FROM (a tag derived from the image
id) is checked by content: this script hashes every file, link and folder of the root
filesystem (path, type, mode, owner, bytes; not times), leaving out what Docker mounts into
a running container or build step (/proc, /sys, /dev, /etc/hosts ...). `denv export` ran
it in a container of the version's image; the build runs it on its base:

    python3 -I -B denv-base-check.py            # print the digest
    python3 -I -B denv-base-check.py sha256:... # exit 1 unless the digest is this one

It runs on the base's own Python (3.7 or later), with nothing but the standard library.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys

#: Mounted or added by Docker in containers and build steps (they differ run to run and
#: builder to builder), and this script's own copy in a build.
SKIP = {
    b"/proc",
    b"/sys",
    b"/dev",
    b"/etc/hosts",
    b"/etc/hostname",
    b"/etc/resolv.conf",
    b"/etc/mtab",  # a link Docker adds to containers, not to BuildKit's build steps
    b"/.dockerenv",
    b"/run/.containerenv",
    b"/denv-base-check.py",
}
CHUNK = 1 << 20


def _file_digest(path: bytes) -> bytes:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(CHUNK)
            if not block:
                return h.hexdigest().encode()
            h.update(block)


def _entry(path: bytes, name: bytes, st: os.stat_result) -> bytes:
    kind = stat.S_IFMT(st.st_mode)
    head = b"%s %o %o %d %d" % (name, kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
    if stat.S_ISREG(kind):
        return head + b" %d %s" % (st.st_size, _file_digest(path))
    if stat.S_ISLNK(kind):
        return head + b" -> " + os.readlink(path)
    if stat.S_ISCHR(kind) or stat.S_ISBLK(kind):
        return head + b" dev %d" % st.st_rdev
    return head


def digest(root: bytes = b"/") -> str:
    """The digest of the tree at `root` (paths are taken from `root`, which counts as /)."""
    h = hashlib.sha256()
    prefix = len(root.rstrip(b"/"))
    pending = [root]
    while pending:
        folder = pending.pop()
        for name in sorted(os.listdir(folder), reverse=True):
            path = os.path.join(folder, name)
            if path[prefix:] in SKIP:
                continue
            st = os.lstat(path)
            h.update(_entry(path, path[prefix:], st) + b"\n")
            if stat.S_ISDIR(st.st_mode):
                pending.append(path)
    return "sha256:" + h.hexdigest()


def main(argv: list[str]) -> int:
    found = digest()
    if len(argv) < 2:
        print(found)
        return 0
    if found == argv[1]:
        print(f"denv: the base image's files match the exported version's image ({found})")
        return 0
    sys.stderr.write(
        "denv: this base is not the image the version was exported from: its files' digest "
        f"is {found}, the export expects {argv[1]}. Tag the version's own image as the FROM "
        "line names it (docker load it first on another machine), or export the version "
        "again.\n"
    )
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
