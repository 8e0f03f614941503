"""Helpers shared by the cluster tests (import as ``from cluster_helpers import ...``)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from denv.server.volumes import Volumes

Entry = tuple[str, int, int, int, int, str, tuple[tuple[str, bytes], ...]]


def tree_manifest(root: Path) -> list[Entry]:
    """Every entry under ``root`` (itself as "."), sorted: name, mode (with the type), owner,
    group, mtime (ns; 0 for symlinks), what it holds (content hash prefix, size and link
    count; a link's target; a device's numbers) and its xattrs. Two dirs with the same
    manifest hold the same tree."""
    out: list[Entry] = []
    for dirpath, dirnames, filenames in os.walk(root):
        names = ([] if dirpath != str(root) else ["."]) + sorted(dirnames + filenames)
        for name in names:
            path = dirpath if name == "." else os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                what = f"{Path(path).read_bytes().hex()[:64]}/{st.st_size}/{st.st_nlink}"
            elif stat.S_ISLNK(st.st_mode):
                what = os.readlink(path)
            elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                what = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
            else:
                what = ""
            xattrs = tuple(
                (a, os.getxattr(path, a, follow_symlinks=False))
                for a in sorted(os.listxattr(path, follow_symlinks=False))
            )
            mtime = 0 if stat.S_ISLNK(st.st_mode) else st.st_mtime_ns
            rel = os.path.relpath(path, root)
            out.append((rel, st.st_mode, st.st_uid, st.st_gid, mtime, what, xattrs))
    return sorted(out)


def snapshot_layers(vols: Volumes, big_bytes: int = 3 << 20) -> tuple[str, str]:
    """Two layers made as snapshots make them: a base, and over it the upper dir of an env
    that deleted a file (a whiteout), deleted and remade a dir (opaque), and wrote files,
    links, a FIFO, a setuid file of another owner and an xattr. (base, top) layer ids."""
    seed = vols.layers_dir.parent / "seed"
    (seed / "gone_dir").mkdir(parents=True)
    (seed / "gone_dir" / "old.txt").write_text("old")
    (seed / "remade").mkdir()
    (seed / "remade" / "hidden.txt").write_text("hidden by an opaque dir")
    (seed / "deleted.txt").write_text("deleted above")
    (seed / "kept.txt").write_text("kept")
    base = vols.capture(seed)
    assert base is not None
    env = "env_h2snap"
    mnt = vols.mount(env, "agent", 0, [base])
    try:
        (mnt / "deleted.txt").unlink()
        subprocess.run(["rm", "-rf", str(mnt / "gone_dir"), str(mnt / "remade")], check=True)
        (mnt / "remade").mkdir()
        (mnt / "remade" / "new.txt").write_text("new")
        (mnt / "big.bin").write_bytes(os.urandom(big_bytes))
        (mnt / "sub" / "deeper").mkdir(parents=True)
        (mnt / "sub" / "deeper" / "f").write_text("deep")
        os.link(mnt / "sub" / "deeper" / "f", mnt / "hardlink")
        os.symlink("/etc/passwd", mnt / "abs_link")
        os.symlink("../kept.txt", mnt / "sub" / "rel_link")
        os.mkfifo(mnt / "fifo")
        (mnt / "setuid").write_text("#!/bin/sh\n")
        os.chown(mnt / "setuid", 1234, 4321)
        os.chmod(mnt / "setuid", 0o4755)
        os.setxattr(mnt / "kept.txt", "user.note", b"\xff\x00binary")
        top = vols.capture(vols.upper(env, "agent", 0))
        assert top is not None
    finally:
        vols.remove_env(env)
    return base, top
