"""Writing an export: all files into a temporary folder beside DIR, then one rename.

A failure at any point leaves DIR as it was (absent, empty, or with its old contents under
--force) and removes the temporary folder.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

from ._files import Files
from ._plan import ExportError


class Progress:
    """One line per step on stderr, numbered, with the time since the start."""

    def __init__(self, stream: TextIO | None = None, *, quiet: bool = False) -> None:
        self._stream = stream or sys.stderr
        self._quiet = quiet
        self._start = time.monotonic()
        self.count = 0

    def step(self, what: str) -> None:
        self.count += 1
        if not self._quiet:
            elapsed = time.monotonic() - self._start
            print(f"  [{elapsed:5.2f}s] {what}", file=self._stream, flush=True)


def check_destination(dest: Path, force: bool) -> None:
    """DIR must not exist, or be an empty folder, or --force must say to replace it."""
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise ExportError(f"{dest} exists and is not a folder: choose another DIR")
    if dest.is_dir() and any(dest.iterdir()) and not force:
        raise ExportError(
            f"{dest} exists and is not empty: choose another DIR, or pass --force to replace it"
        )
    if not dest.parent.is_dir():
        raise ExportError(f"{dest.parent} does not exist: create it first")


def _target(root: Path, relative: str) -> Path:
    """`root/relative`, refused when it would land outside `root`."""
    parts = Path(relative).parts
    if Path(relative).is_absolute() or not parts or ".." in parts:
        raise ExportError(f"refusing to write {relative!r}: it would land outside DIR")
    target = (root / relative).resolve()
    if not target.is_relative_to(root.resolve()):
        raise ExportError(f"refusing to write {relative!r}: it would land outside DIR")
    return target


def write_tree(dest: Path, files: Files, *, force: bool, progress: Progress) -> None:
    """Write `files` as the folder `dest`, all or nothing."""
    check_destination(dest, force)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".denv-export", dir=dest.parent))
    try:
        for relative in sorted(files):
            content, mode = files[relative]
            target = _target(tmp, relative)
            progress.step(f"writing {relative}")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
            target.chmod(mode)
        tmp.chmod(0o755)
        _replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _replace(tmp: Path, dest: Path) -> None:
    if not dest.exists():
        os.rename(tmp, dest)
        return
    if not any(dest.iterdir()):
        dest.rmdir()
        os.rename(tmp, dest)
        return
    # --force: the old folder moves aside first, so at every instant DIR is whole.
    old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".old", dir=dest.parent))
    os.rename(dest, old / "content")
    try:
        os.rename(tmp, dest)
    except BaseException:
        os.rename(old / "content", dest)
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)
