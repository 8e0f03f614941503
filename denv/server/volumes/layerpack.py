"""A volume layer as one file with a content digest, to move it between nodes.

A layer dir (``<state>/layers/<lyr_id>/``) is a copy of an overlay upper dir: regular files,
dirs, symlinks, hard links, whiteouts (char devices 0/0), FIFOs, owners, modes, mtimes and
xattrs such as ``trusted.overlay.opaque``. :func:`pack_layer` writes it as a POSIX (pax) tar:
entries in a fixed order (byte order of names, each dir before what it holds), no user or
group names, no atimes, mtimes to the nanosecond and xattrs as ``SCHILY.xattr.*`` records (GNU
tar's names, so ``tar --xattrs -tvf`` reads it). So the same dir always packs to the same
bytes and the same digest, ``sha256:<hex>`` of the file, on any node.

:func:`unpack_layer` checks the digest before it reads a single entry, then extracts only what
:func:`pack_layer` writes: relative names without ``..``, each under a dir the archive made
itself (so a symlink in the archive is never written through), hard links to files it made,
no name twice. It extracts into a temporary dir beside the destination and renames it into
place, so a layer is either whole or absent; anything failing removes the temporary dir.
Symlink targets are data, never followed: a layer is only ever an overlay lowerdir, mounted
``nosuid,nodev`` (see ``overlay.mount_overlay``), like the original.
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import shutil
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

DIGEST_PREFIX = "sha256:"
BUFSIZE = 1 << 20  # reads and writes of file contents
XATTR_KEY = "SCHILY.xattr."
MTIME_KEY = "mtime"  # the pax record, kept as written: seconds with nanoseconds


class LayerDigestMismatch(ValueError):
    """A packed layer's bytes do not have the digest they were announced with."""


class UnsafeLayer(ValueError):
    """A packed layer holds an entry :func:`unpack_layer` refuses to write."""


class HashingWriter:
    """A write-only file that hashes and counts what goes through it (a packed layer being
    written, or received chunk by chunk: its digest without reading it back)."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self.hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes | memoryview) -> int:
        self.hash.update(data)
        self.size += len(data)
        return self._raw.write(data)

    def tell(self) -> int:
        return self.size

    def digest(self) -> str:
        """``sha256:<hex>`` of what was written."""
        return DIGEST_PREFIX + self.hash.hexdigest()


def pack_layer(layer_dir: Path, dest: Path) -> tuple[str, int]:
    """Pack ``layer_dir`` into ``dest`` (replaced atomically): its digest and size in bytes.

    >>> pack_layer(Path("/var/lib/denv/layers/lyr_01..."), Path("/tmp/lyr_01....tar"))
    ('sha256:5f0c...', 1048576)
    """
    if not layer_dir.is_dir() or layer_dir.is_symlink():
        raise FileNotFoundError(f"no layer dir at {layer_dir}")
    part = dest.with_name(f"{dest.name}.part-{secrets.token_hex(4)}")
    try:
        with open(part, "wb") as raw:
            out = HashingWriter(raw)
            # The writer is no real file: tarfile only calls write() (and tell() nowhere).
            with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
                tar.copybufsize = BUFSIZE
                _add_tree(tar, layer_dir)
        os.replace(part, dest)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return out.digest(), out.size


def _add_tree(tar: tarfile.TarFile, root: Path) -> None:
    links: dict[tuple[int, int], str] = {}  # (dev, inode) -> first name, for hard links
    for name, path, st in _walk(root):
        info = _tarinfo(name, path, st)
        if info is None:
            continue  # a socket: not content (cp -a copies it, nothing can use it)
        key = (st.st_dev, st.st_ino)
        if not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1:
            if key in links:
                info.type, info.linkname, info.size = tarfile.LNKTYPE, links[key], 0
                tar.addfile(info)
                _forget_headers(tar)
                continue
            links[key] = name
        if info.isreg():
            with open(path, "rb") as f:
                tar.addfile(info, f)
        else:
            tar.addfile(info)
        _forget_headers(tar)


def _forget_headers(tar: tarfile.TarFile) -> None:
    """Drop the headers tarfile keeps of every entry read or written: a layer of a million
    files would hold them all in memory (this module reads and writes one entry at a time)."""
    tar.members.clear()  # type: ignore[attr-defined]  # not in typeshed, a plain list


def _walk(root: Path) -> Iterator[tuple[str, str, os.stat_result]]:
    """(name in the archive, path, lstat) of ``root`` ("." ) and everything under it, each
    dir before its content, names in byte order."""
    yield ".", str(root), os.lstat(root)
    stack: list[tuple[str, str]] = [("", str(root))]
    while stack:
        prefix, path = stack.pop()
        with os.scandir(path) as it:
            entries = sorted(it, key=lambda e: os.fsencode(e.name))
        subdirs = []
        for entry in entries:
            name = prefix + entry.name
            st = entry.stat(follow_symlinks=False)
            yield name, entry.path, st
            if stat.S_ISDIR(st.st_mode):
                subdirs.append((name + "/", entry.path))
        # Depth first, in order: the next dir popped is the first one listed.
        stack.extend(reversed(subdirs))


def _tarinfo(name: str, path: str, st: os.stat_result) -> tarfile.TarInfo | None:
    info = tarfile.TarInfo(name)
    mode = st.st_mode
    if stat.S_ISREG(mode):
        info.type, info.size = tarfile.REGTYPE, st.st_size
    elif stat.S_ISDIR(mode):
        info.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(mode):
        info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        info.type = tarfile.CHRTYPE if stat.S_ISCHR(mode) else tarfile.BLKTYPE
        info.devmajor, info.devminor = os.major(st.st_rdev), os.minor(st.st_rdev)
    elif stat.S_ISFIFO(mode):
        info.type = tarfile.FIFOTYPE
    else:
        return None
    info.mode = stat.S_IMODE(mode)
    info.uid, info.gid = st.st_uid, st.st_gid
    info.uname = info.gname = ""
    info.mtime = st.st_mtime_ns // 1_000_000_000
    headers = {MTIME_KEY: _mtime_text(st.st_mtime_ns)}
    for attr in sorted(os.listxattr(path, follow_symlinks=False)):
        value = os.getxattr(path, attr, follow_symlinks=False)
        # Binary values survive: tarfile writes them raw (hdrcharset=BINARY) and reads
        # them back the same way.
        headers[XATTR_KEY + attr] = value.decode("utf-8", "surrogateescape")
    info.pax_headers = headers
    return info


def _mtime_text(ns: int) -> str:
    sec, frac = divmod(ns, 1_000_000_000)
    return f"{sec}.{frac:09d}"


def _mtime_ns(info: tarfile.TarInfo) -> int:
    text = info.pax_headers.get(MTIME_KEY)
    if text is None:
        return int(info.mtime) * 1_000_000_000
    sec, _, frac = text.partition(".")
    return int(sec) * 1_000_000_000 + int((frac + "000000000")[:9])


def file_digest(path: Path) -> str:
    """``sha256:<hex>`` of a file's bytes, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(BUFSIZE):
            h.update(block)
    return DIGEST_PREFIX + h.hexdigest()


def check_digest(path: Path, digest: str) -> None:
    """LayerDigestMismatch naming both digests when ``path`` does not have ``digest``."""
    actual = file_digest(path)
    if actual != digest:
        raise LayerDigestMismatch(
            f"packed layer {path} has digest {actual}, expected {digest}: it was changed or "
            "damaged on its way; fetch it again from its origin node or the store"
        )


def check_received(written: HashingWriter, digest: str, what: str) -> None:
    """LayerDigestMismatch naming both digests when what went through ``written`` (a layer
    received from ``what``) does not have ``digest``."""
    actual = written.digest()
    if actual != digest:
        raise LayerDigestMismatch(
            f"packed layer ({written.size} bytes from {what}) has digest {actual}, expected "
            f"{digest}: it was changed or damaged on its way; fetch it again from its origin "
            "node or the store"
        )


def unpack_layer(src: Path, digest: str, dest_dir: Path, *, checked: bool = False) -> None:
    """Check ``src`` has ``digest``, then extract it as the new layer dir ``dest_dir``.

    LayerDigestMismatch (a ValueError) before anything is written when the digest differs;
    UnsafeLayer for an entry that would escape the dir or is not what :func:`pack_layer`
    writes; FileExistsError when ``dest_dir`` exists (a layer is immutable: never replaced).
    ``checked``: the caller has just checked this private file's digest itself
    (``LayerStore.get`` does), so it is not read twice.
    """
    if not checked:
        check_digest(src, digest)
    if dest_dir.exists():
        raise FileExistsError(f"layer dir {dest_dir} exists already")
    tmp = dest_dir.with_name(f".tmp-{dest_dir.name}.{secrets.token_hex(4)}")
    try:
        with tarfile.open(src, mode="r:") as tar:
            _extract(tar, tmp)
        os.rename(tmp, dest_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _extract(tar: tarfile.TarFile, root: Path) -> None:
    dirs: set[str] = set()  # names of dirs this archive made
    others: set[str] = set()  # names of everything else it made (hard link targets)
    dir_times: list[tuple[str, int]] = []
    while (info := tar.next()) is not None:
        _forget_headers(tar)
        name = info.name
        if name == ".":
            if dirs or others or not info.isdir():
                raise UnsafeLayer(f"'.' must be the archive's first entry, a dir: {name!r}")
            os.mkdir(root, 0o700)
            dirs.add(".")
            path = str(root)
        else:
            _check_name(name, dirs, others)
            path = os.path.join(root, name)
            _make(tar, info, path, root, others)
        if info.isdir():
            dirs.add(name)
            dir_times.append((path, _mtime_ns(info)))
        else:
            others.add(name)
        if not info.islnk():
            _set_meta(info, path)
    if "." not in dirs:
        raise UnsafeLayer("the archive is empty: a packed layer holds at least its root dir")
    # Dirs last, deepest first: making their content changed their mtimes.
    for path, ns in reversed(dir_times):
        os.utime(path, ns=(ns, ns), follow_symlinks=False)


def _check_name(name: str, dirs: set[str], others: set[str]) -> None:
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise UnsafeLayer(f"entry {name!r} is not a plain relative path")
    if "\0" in name:
        raise UnsafeLayer(f"entry {name!r} holds a NUL byte")
    parent = "/".join(parts[:-1]) or "."
    if parent not in dirs:
        raise UnsafeLayer(f"entry {name!r} is not under a dir the archive made before it")
    if name in dirs or name in others:
        raise UnsafeLayer(f"entry {name!r} appears twice")


def _make(
    tar: tarfile.TarFile, info: tarfile.TarInfo, path: str, root: Path, others: set[str]
) -> None:
    if info.isreg():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            _copy_member(tar, info, out)
    elif info.isdir():
        os.mkdir(path, 0o700)
    elif info.issym():
        os.symlink(info.linkname, path)
    elif info.islnk():
        if info.linkname not in others:
            raise UnsafeLayer(
                f"hard link {info.name!r} -> {info.linkname!r}: not a file the archive made"
            )
        os.link(os.path.join(root, info.linkname), path, follow_symlinks=False)
    elif info.ischr() or info.isblk():
        kind = stat.S_IFCHR if info.ischr() else stat.S_IFBLK
        os.mknod(path, kind | 0o600, os.makedev(info.devmajor, info.devminor))
    elif info.isfifo():
        os.mkfifo(path, 0o600)
    else:
        raise UnsafeLayer(f"entry {info.name!r} has a type a layer never holds ({info.type!r})")


def _copy_member(tar: tarfile.TarFile, info: tarfile.TarInfo, out: BinaryIO) -> None:
    """A regular member's bytes into ``out``: copied by the kernel (``copy_file_range``, as
    ``cp`` does) when the archive is a file on a filesystem that can, else through a buffer.
    The kernel's copy is what keeps unpacking a big layer from costing as much CPU as
    receiving it."""
    src_fd = _archive_fd(tar)
    if src_fd is not None and not info.issparse():
        offset, left = info.offset_data, info.size
        try:
            while left > 0:
                n = os.copy_file_range(src_fd, out.fileno(), min(left, 1 << 30), offset)
                if n == 0:
                    raise UnsafeLayer(f"the archive ends inside entry {info.name!r}")
                offset, left = offset + n, left - n
            return
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            out.seek(0)  # this filesystem cannot: start the entry again, through a buffer
            out.truncate()
    src = tar.extractfile(info)
    assert src is not None  # a regular member always has a file object
    with src:
        shutil.copyfileobj(src, out, BUFSIZE)


def _archive_fd(tar: tarfile.TarFile) -> int | None:
    """The archive's file descriptor when it is a plain file (``copy_file_range`` reads it at
    explicit offsets, so tarfile's own position is untouched); None for anything else."""
    if not hasattr(os, "copy_file_range"):
        return None
    try:
        fd = tar.fileobj.fileno()  # type: ignore[attr-defined]  # a file object, when not None
    except (AttributeError, OSError, ValueError):
        return None
    return fd if stat.S_ISREG(os.fstat(fd).st_mode) else None


def _set_meta(info: tarfile.TarInfo, path: str) -> None:
    os.chown(path, info.uid, info.gid, follow_symlinks=False)
    if not info.issym():
        os.chmod(path, info.mode)  # after chown, which drops setuid/setgid bits
    for key, value in info.pax_headers.items():
        if key.startswith(XATTR_KEY):
            raw = value.encode("utf-8", "surrogateescape")
            os.setxattr(path, key[len(XATTR_KEY) :], raw, follow_symlinks=False)
    if not info.isdir():
        ns = _mtime_ns(info)
        os.utime(path, ns=(ns, ns), follow_symlinks=False)
