"""Diffs of layer stacks (denv.server.volumes.layerdiff) against the truth: both overlays mounted.

Layers are made the way envs make them (a real overlay mounted by `Volumes`, changed, its
upper dir captured), so whiteouts and opaque directories are the kernel's own. The expected
answer is a brute-force walk of both stacks mounted read-only, compared file by file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from denv.server.volumes.layerdiff import diff_stacks
from denv.server.volumes.overlay import Volumes

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting overlays needs root")


def layer_after(vols: Volumes, env: str, below: list[str], change: Callable[[Path], None]) -> str:
    """A new layer on top of `below`: mount, apply `change`, capture the upper dir."""
    mnt = vols.mount(env, "agent", 0, below)
    try:
        change(mnt)
        layer = vols.capture(vols.upper(env, "agent", 0))
        assert layer is not None
        return layer
    finally:
        vols.remove_env(env)


def files_of(vols: Volumes, layers: list[str], view: Path) -> dict[str, tuple[int, int, int]]:
    """Every file the overlay of `layers` shows: path -> (mode, size, mtime_ns)."""
    view.mkdir()
    lowers = ":".join(str(vols.layer_path(x)) for x in layers)
    if len(layers) == 1:  # an overlay needs two lower dirs without an upper one
        lowers += ":" + str(vols.layer_path("empty"))
    subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", f"ro,lowerdir={lowers}", str(view)], check=True
    )
    try:
        out = {}
        for root, _, names in os.walk(view):
            for name in names:
                st = os.lstat(os.path.join(root, name))
                rel = os.path.relpath(os.path.join(root, name), view)
                out[rel] = (st.st_mode, st.st_size, st.st_mtime_ns)
        return out
    finally:
        subprocess.run(["umount", str(view)], check=True)
        view.rmdir()


def truth(
    before: dict[str, tuple[int, int, int]], after: dict[str, tuple[int, int, int]]
) -> list[tuple[str, str, int]]:
    out = []
    for path in sorted(before.keys() | after.keys()):
        a, b = before.get(path), after.get(path)
        if a is None and b is not None:
            out.append((path, "added", b[1]))
        elif a is not None and b is None:
            out.append((path, "deleted", a[1]))
        elif a is not None and b is not None and a != b:
            out.append((path, "modified", b[1]))
    return out


def base(mnt: Path) -> None:
    (mnt / "keep.txt").write_text("same")
    (mnt / "edit.txt").write_text("before")
    (mnt / "gone.txt").write_text("deleted later")
    (mnt / "dir" / "sub").mkdir(parents=True)
    (mnt / "dir" / "a").write_text("a")
    (mnt / "dir" / "sub" / "b").write_text("bb")
    (mnt / "replaced").mkdir()
    (mnt / "replaced" / "old").write_text("old")
    (mnt / "link").symlink_to("keep.txt")


def change(mnt: Path) -> None:
    (mnt / "edit.txt").write_text("after, longer")
    (mnt / "gone.txt").unlink()  # a whiteout
    shutil.rmtree(mnt / "dir")  # a whiteout of a directory with files below it
    shutil.rmtree(mnt / "replaced")
    (mnt / "replaced").mkdir()  # made again: an opaque directory
    (mnt / "replaced" / "new").write_text("new")
    (mnt / "new" / "deep").mkdir(parents=True)
    (mnt / "new" / "deep" / "file").write_bytes(b"x" * 4096)
    (mnt / "link").unlink()
    (mnt / "link").symlink_to("edit.txt")  # a symlink pointing elsewhere


def test_a_child_layer_diffs_like_the_mounted_overlays(tmp_path: Path) -> None:
    vols = Volumes(tmp_path / "state")
    first = layer_after(vols, "env_a", [], base)
    second = layer_after(vols, "env_b", [first], change)
    parent, child = [first], [second, first]

    changes, truncated = diff_stacks(
        [vols.layer_path(x) for x in parent], [vols.layer_path(x) for x in child], 100
    )
    got = [(c.path, c.change, c.size) for c in changes]
    assert not truncated
    assert got == truth(
        files_of(vols, parent, tmp_path / "v1"), files_of(vols, child, tmp_path / "v2")
    )
    assert ("edit.txt", "modified", len("after, longer")) in got
    assert ("gone.txt", "deleted", len("deleted later")) in got
    assert ("dir/sub/b", "deleted", 2) in got  # under a deleted directory
    assert ("replaced/old", "deleted", 3) in got  # hidden by an opaque directory
    assert ("replaced/new", "added", 3) in got
    assert ("new/deep/file", "added", 4096) in got
    assert all(path != "keep.txt" for path, _, _ in got)
    # The other way round, every change turns over.
    back, _ = diff_stacks(
        [vols.layer_path(x) for x in child], [vols.layer_path(x) for x in parent], 100
    )
    flip = {"added": "deleted", "deleted": "added", "modified": "modified"}
    assert sorted((c.path, flip[c.change]) for c in back) == sorted((p, c) for p, c, _ in got)


def test_unrelated_stacks_and_identical_ones(tmp_path: Path) -> None:
    vols = Volumes(tmp_path / "state")
    first = layer_after(vols, "env_a", [], base)
    # A layer with the same content made separately: nothing shared, nothing differs but
    # the times (cp -a keeps them; a rewrite does not).
    copy = layer_after(
        vols,
        "env_c",
        [],
        lambda mnt: shutil.copytree(
            vols.layer_path(first),
            mnt,
            symlinks=True,
            dirs_exist_ok=True,
            copy_function=shutil.copy2,
        ),
    )
    same, _ = diff_stacks([vols.layer_path(first)], [vols.layer_path(first)], 100)
    assert same == []
    mirrored, _ = diff_stacks([vols.layer_path(first)], [vols.layer_path(copy)], 100)
    # Files copied with their times are the same; a symlink's own time is not copied.
    assert [c.path for c in mirrored] in ([], ["link"])
    empty, _ = diff_stacks([], [vols.layer_path(first)], 100)
    assert {c.change for c in empty} == {"added"} and len(empty) == 7


def test_a_diff_stops_at_its_limit(tmp_path: Path) -> None:
    vols = Volumes(tmp_path / "state")

    def many(mnt: Path) -> None:
        for i in range(30):
            (mnt / f"f{i:02}").write_text(str(i))

    layer = layer_after(vols, "env_a", [], many)
    changes, truncated = diff_stacks([], [vols.layer_path(layer)], 10)
    assert truncated and [c.path for c in changes] == [f"f{i:02}" for i in range(10)]
