"""What changed between two layer stacks of a volume, read from the layers, no env started.

A stack is a volume's layers, newest first, as overlayfs stacks them: a file in a newer
layer hides the same path below it, a whiteout (a 0/0 character device) deletes it, and an
opaque directory (``trusted.overlay.opaque=y``) hides everything below it at that path.

Two versions of one lineage share the older end of their stacks; only the layers they do not
share can hold a difference, so those are walked for candidate paths and each candidate is
looked up in both stacks. The cost follows what changed, not the size of the volume::

    changes, truncated = diff_stacks(base_layer_dirs, layer_dirs, limit=10_000)
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Change = Literal["added", "modified", "deleted"]
_OPAQUE_XATTRS = ("trusted.overlay.opaque", "user.overlay.opaque")


@dataclass(frozen=True)
class FileChange:
    """One file that differs: its path relative to the volume, how, and its size in bytes."""

    path: str
    change: Change
    size: int


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _opaque(path: str) -> bool:
    for name in _OPAQUE_XATTRS:
        try:
            if os.getxattr(path, name, follow_symlinks=False) == b"y":
                return True
        except OSError:
            continue
    return False


def _hides_below(layer: Path, rel: str) -> bool:
    """Does ``layer`` hide ``rel`` of the layers under it (a whiteout, a file or an opaque
    directory on its way)?"""
    parts = rel.split("/")
    for i in range(1, len(parts)):
        at = os.path.join(layer, *parts[:i])
        st = _lstat(at)
        if st is None:
            return False  # nothing of the way is in this layer: lower layers show through
        if not stat.S_ISDIR(st.st_mode) or _opaque(at):
            return True
    return False


def lookup(stack: list[Path], rel: str) -> os.stat_result | None:
    """``rel`` as the overlay of ``stack`` shows it (None when absent)."""
    for layer in stack:
        st = _lstat(os.path.join(layer, rel))
        if st is not None:
            return None if _whiteout(st) else st
        if _hides_below(layer, rel):
            return None
    return None


def _walk(root: Path, rel: str = "") -> Iterator[tuple[str, os.DirEntry[str]]]:
    """Every entry under ``root/rel``, depth first, with its path relative to ``root``."""
    try:
        entries = list(os.scandir(os.path.join(root, rel)))
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        path = f"{rel}/{entry.name}" if rel else entry.name
        yield path, entry
        if entry.is_dir(follow_symlinks=False):
            yield from _walk(root, path)


def _candidates(own: list[Path], every: list[Path]) -> set[str]:
    """Paths that may differ: what the unshared layers ``own`` hold, and under a whiteout or
    an opaque directory of theirs whatever any layer of either stack (``every``) holds."""
    found: set[str] = set()
    hidden: set[str] = set()
    for layer in own:
        for path, entry in _walk(layer):
            found.add(path)
            if entry.is_dir(follow_symlinks=False):
                if _opaque(entry.path):
                    hidden.add(path)
            elif _whiteout(entry.stat(follow_symlinks=False)):
                hidden.add(path)
    for path in hidden:
        for layer in every:
            found.update(sub for sub, _ in _walk(layer, path))
    return found


def _file(st: os.stat_result | None) -> os.stat_result | None:
    return None if st is None or stat.S_ISDIR(st.st_mode) else st


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_mode, a.st_size, a.st_mtime_ns) == (b.st_mode, b.st_size, b.st_mtime_ns)


def diff_stacks(base: list[Path], other: list[Path], limit: int) -> tuple[list[FileChange], bool]:
    """Files (not directories) that differ from ``base`` to ``other``, by path; at most
    ``limit`` of them, and whether there were more."""
    shared = 0
    while shared < min(len(base), len(other)) and base[-1 - shared] == other[-1 - shared]:
        shared += 1
    own = base[: len(base) - shared] + other[: len(other) - shared]
    changes: list[FileChange] = []
    for path in sorted(_candidates(own, base + other)):
        before, after = _file(lookup(base, path)), _file(lookup(other, path))
        if before is None and after is not None:
            changes.append(FileChange(path, "added", after.st_size))
        elif before is not None and after is None:
            changes.append(FileChange(path, "deleted", before.st_size))
        elif before is not None and after is not None and not _same(before, after):
            changes.append(FileChange(path, "modified", after.st_size))
        if len(changes) > limit:
            return changes[:limit], True
    return changes, False
