"""Packing a volume layer into one digested file and back (denv.server.volumes.layerpack).

The layers are made the way a snapshot makes them: an overlay is mounted, an env's changes
land in its upper dir (a whiteout for a deleted file, an opaque dir for a dir deleted and made
again), and ``Volumes.capture`` copies the upper dir with ``cp -a``. Needs root (mounts,
trusted.* xattrs, device nodes), as the server does.
"""

from __future__ import annotations

import io
import os
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from denv.server.volumes.layerpack import (
    LayerDigestMismatch,
    UnsafeLayer,
    file_digest,
    pack_layer,
    unpack_layer,
)
from denv.server.volumes.mounts import mount_points_under
from denv.server.volumes.overlay import Volumes

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="overlays and trusted xattrs need root")

Entry = tuple[str, int, int, int, int, str, tuple[tuple[str, bytes], ...]]


def manifest(root: Path) -> list[Entry]:
    """Every entry under ``root`` (itself included): name, mode (type too), owner, group,
    mtime, content or link target or device numbers, and xattrs."""
    out: list[Entry] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in [".", *sorted(dirnames + filenames)]:
            path = os.path.join(dirpath, name) if name != "." else dirpath
            if name == "." and dirpath != str(root):
                continue
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                what = Path(path).read_bytes().hex()[:64] + f"/{st.st_size}/{st.st_nlink}"
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
            rel = os.path.relpath(path, root)
            mtime = st.st_mtime_ns if not stat.S_ISLNK(st.st_mode) else 0
            out.append((rel, st.st_mode, st.st_uid, st.st_gid, mtime, what, xattrs))
    return sorted(out)


def snapshot_like_layer(tmp_path: Path) -> tuple[Volumes, str, str]:
    """A base layer and, over it, a layer captured from an env's overlay upper dir holding
    every kind of entry a layer can hold: (volumes, base layer, top layer)."""
    vols = Volumes(tmp_path / "state")
    base_dir = tmp_path / "base"
    (base_dir / "gone_dir").mkdir(parents=True)
    (base_dir / "gone_dir" / "old.txt").write_text("old")
    (base_dir / "remade").mkdir()
    (base_dir / "remade" / "hidden.txt").write_text("hidden by an opaque dir")
    (base_dir / "deleted.txt").write_text("deleted in the top layer")
    (base_dir / "kept.txt").write_text("kept")
    base = vols.capture(base_dir)
    assert base is not None
    mnt = vols.mount("env_a", "agent", 0, [base])
    try:
        (mnt / "deleted.txt").unlink()  # a whiteout
        subprocess.run(["rm", "-rf", str(mnt / "gone_dir")], check=True)
        subprocess.run(["rm", "-rf", str(mnt / "remade")], check=True)
        (mnt / "remade").mkdir()  # an opaque dir
        (mnt / "remade" / "new.txt").write_text("new")
        (mnt / "big.bin").write_bytes(os.urandom(3 << 20))
        (mnt / "empty").write_bytes(b"")
        (mnt / "sub" / "deeper").mkdir(parents=True)
        (mnt / "sub" / "deeper" / "f").write_text("deep")
        os.link(mnt / "sub" / "deeper" / "f", mnt / "hardlink")
        os.symlink("/etc/passwd", mnt / "abs_link")  # a target outside: data, never followed
        os.symlink("../kept.txt", mnt / "sub" / "rel_link")
        os.mkfifo(mnt / "fifo")
        script = mnt / "setuid"
        script.write_text("#!/bin/sh\n")
        os.chown(script, 1234, 4321)
        os.chmod(script, 0o4755)
        (mnt / "ro_dir").mkdir(mode=0o555)
        os.setxattr(mnt / "kept.txt", "user.note", b"\xff\x00binary")
        os.utime(mnt / "empty", ns=(1, 1_700_000_000_123_456_789))
        (mnt / "caf\u00e9 \N{SNOWMAN}").write_text("unicode name")
        (mnt / ("long" * 40)).write_text("a name past ustar's 100 bytes")
        top = vols.capture(vols.upper("env_a", "agent", 0))
        assert top is not None
    finally:
        vols.remove_env("env_a")
    return vols, base, top


def test_a_captured_layer_unpacks_to_the_same_tree_and_mounts_the_same(tmp_path: Path) -> None:
    vols, base, top = snapshot_like_layer(tmp_path)
    layer = vols.layer_path(top)
    kinds = {stat.S_IFMT(e[1]) for e in manifest(layer)}
    assert {stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK, stat.S_IFCHR, stat.S_IFIFO} <= kinds
    opaque = [e for e in manifest(layer) if ("trusted.overlay.opaque", b"y") in e[6]]
    assert [e[0] for e in opaque] == ["remade"]

    digest, size = pack_layer(layer, tmp_path / "top.tar")
    assert digest.startswith("sha256:") and len(digest) == 71
    assert size == (tmp_path / "top.tar").stat().st_size
    assert digest == file_digest(tmp_path / "top.tar")
    assert pack_layer(layer, tmp_path / "again.tar") == (digest, size)  # deterministic

    other = Volumes(tmp_path / "other")
    unpack_layer(tmp_path / "top.tar", digest, other.layer_path(top))
    b_digest, _ = pack_layer(vols.layer_path(base), tmp_path / "base.tar")
    unpack_layer(tmp_path / "base.tar", b_digest, other.layer_path(base))
    assert manifest(other.layer_path(top)) == manifest(layer)
    assert manifest(other.layer_path(base)) == manifest(vols.layer_path(base))
    assert [p.name for p in other.layers_dir.iterdir() if p.name.startswith(".tmp")] == []

    # As overlay lowerdirs, the copies show exactly what the originals show.
    views = []
    for v, env in ((vols, "env_orig"), (other, "env_copy")):
        mnt = v.mount(env, "agent", 0, [top, base])
        views.append({p.relative_to(mnt).as_posix() for p in mnt.rglob("*")})
        assert (mnt / "remade" / "new.txt").read_text() == "new"
        assert not (mnt / "remade" / "hidden.txt").exists()
        assert not (mnt / "deleted.txt").exists() and not (mnt / "gone_dir").exists()
        assert (mnt / "kept.txt").read_text() == "kept"
        assert os.readlink(mnt / "abs_link") == "/etc/passwd"
        v.remove_env(env)
    assert views[0] == views[1]
    assert mount_points_under(tmp_path) == []


def test_a_tampered_file_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    vols, _, top = snapshot_like_layer(tmp_path)
    digest, _ = pack_layer(vols.layer_path(top), tmp_path / "top.tar")
    with open(tmp_path / "top.tar", "r+b") as f:
        f.seek(4096)
        byte = f.read(1)
        f.seek(4096)
        f.write(bytes([byte[0] ^ 1]))
    dest = tmp_path / "out" / top
    dest.parent.mkdir()
    with pytest.raises(LayerDigestMismatch) as err:
        unpack_layer(tmp_path / "top.tar", digest, dest)
    assert digest in str(err.value) and file_digest(tmp_path / "top.tar") in str(err.value)
    assert list(dest.parent.iterdir()) == []


def _tar(tmp_path: Path, entries: list[tuple[tarfile.TarInfo, bytes]]) -> tuple[Path, str]:
    path = tmp_path / "evil.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path, file_digest(path)


def _entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o755
    return info


@pytest.mark.parametrize(
    ("entries", "why"),
    [
        ([_entry(".", tarfile.DIRTYPE), _entry("../escape")], "not a plain relative path"),
        ([_entry(".", tarfile.DIRTYPE), _entry("/etc/evil")], "not a plain relative path"),
        ([_entry(".", tarfile.DIRTYPE), _entry("a/b")], "not under a dir the archive made"),
        (
            [_entry(".", tarfile.DIRTYPE), _entry("a", tarfile.SYMTYPE, "/etc"), _entry("a/x")],
            "not under a dir the archive made",
        ),
        (
            [_entry(".", tarfile.DIRTYPE), _entry("h", tarfile.LNKTYPE, "../../etc/passwd")],
            "not a file the archive made",
        ),
        ([_entry(".", tarfile.DIRTYPE), _entry("f"), _entry("f")], "appears twice"),
        ([_entry("f")], "not under a dir the archive made"),
        ([_entry(".")], "must be the archive's first entry, a dir"),
        ([], "the archive is empty"),
    ],
)
def test_an_archive_writing_outside_its_dir_is_refused_and_leaves_nothing(
    tmp_path: Path, entries: list[tarfile.TarInfo], why: str
) -> None:
    src, digest = _tar(tmp_path, [(e, b"x") for e in entries])
    dest = tmp_path / "layers" / "lyr_x"
    dest.parent.mkdir()
    with pytest.raises(UnsafeLayer, match=why):
        unpack_layer(src, digest, dest)
    assert list(dest.parent.iterdir()) == []


def test_an_existing_layer_is_never_replaced(tmp_path: Path) -> None:
    (tmp_path / "layer").mkdir()
    (tmp_path / "layer" / "f").write_text("one")
    digest, _ = pack_layer(tmp_path / "layer", tmp_path / "l.tar")
    (tmp_path / "dest").mkdir()
    with pytest.raises(FileExistsError):
        unpack_layer(tmp_path / "l.tar", digest, tmp_path / "dest")
    with pytest.raises(FileNotFoundError):
        pack_layer(tmp_path / "missing", tmp_path / "m.tar")
    assert not (tmp_path / "m.tar").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest", "l.tar", "layer"]
