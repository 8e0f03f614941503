"""Overlay volumes on the real host (needs root for mount): capture, whiteouts, merge."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from denv.server.config import LAYER_DEPTH_LIMIT
from denv.server.volumes.mounts import MS_NODEV, MS_NOSUID, mount, mount_points_under, unmount_all
from denv.server.volumes.overlay import Volumes

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting overlays needs root")


def test_snapshot_chain_merges_past_the_depth_limit(tmp_path: Path) -> None:
    vols = Volumes(tmp_path)
    layers: list[str] = []
    try:
        for i in range(LAYER_DEPTH_LIMIT + 1):
            env = f"env_{i}"
            mnt = vols.mount(env, "agent", 0, layers)
            (mnt / f"f{i}").write_text(str(i))
            if i == 2:
                (mnt / "f0").unlink()  # a whiteout in this layer hides f0 from then on
            new = vols.capture(vols.upper(env, "agent", 0))
            layers = vols.stack(new, layers)
            vols.remove_env(env)
        assert len(layers) == 1  # merged: the stack went past the limit
        mnt = vols.mount("env_last", "agent", 0, layers)
        names = sorted(p.name for p in mnt.iterdir())
        assert names == sorted(f"f{i}" for i in range(1, LAYER_DEPTH_LIMIT + 1))
        assert (mnt / "f3").read_text() == "3"
    finally:
        vols.remove_env("env_last")
    assert mount_points_under(tmp_path) == []
    assert vols.capture(tmp_path / "nothing") is None


def _loop_devices_of(root: Path) -> list[str]:
    """Loop devices whose backing file is under ``root``."""
    found = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        if backing.read_text().strip().startswith(str(root)):
            found.append(backing.parent.parent.name)
    return found


def test_a_sized_volume_refuses_writes_past_its_size_and_leaves_nothing(tmp_path: Path) -> None:
    vols = Volumes(tmp_path, size_mb=16)
    assert vols.fs is not None
    vols.fs.check()
    try:
        mnt = vols.mount("env_a", "agent", 0, [])
        other = vols.mount("env_b", "agent", 0, [])
        written = 0
        with pytest.raises(OSError) as err, open(mnt / "filler", "wb") as f:
            while True:
                f.write(b"x" * 65536)
                f.flush()
                os.fsync(f.fileno())
                written += 65536
        assert err.value.errno == 28  # ENOSPC
        assert 12 * 2**20 <= written <= 16 * 2**20
        # the other volume, and the host's copy of this one, are untouched
        (other / "f").write_bytes(b"y" * 2**20)
        assert (other / "f").stat().st_size == 2**20
        image = tmp_path / "envs" / "env_a" / "agent" / "0" / "disk.img"
        assert image.stat().st_blocks * 512 <= 17 * 2**20
        assert vols.capture(vols.upper("env_a", "agent", 0)) is not None
        print(f"sized volume: {written / 2**20:.1f} MiB written of 16 MiB, then ENOSPC")
        assert len(_loop_devices_of(tmp_path)) == 2
    finally:
        vols.remove_env("env_a")
        vols.remove_env("env_b")
    try:
        assert mount_points_under(tmp_path / "envs") == []
        # Both filesystems were emptied into the pool (the filler's 14 MiB removed), and
        # the next volume takes one of them: same loop device, nothing in it, full size.
        pool = tmp_path / "volfs" / "pool"
        assert _loop_devices_of(tmp_path) == _loop_devices_of(pool)
        assert len(_loop_devices_of(pool)) == 2
        for fs in pool.glob("*/fs"):
            assert sorted(p.name for p in fs.iterdir()) == ["lost+found", "upper", "work"]
            assert [*(fs / "upper").iterdir(), *(fs / "work").iterdir()] == []
        again = vols.mount("env_c", "agent", 0, [])
        assert list(again.iterdir()) == []
        assert len(_loop_devices_of(pool)) == 1 and len(_loop_devices_of(tmp_path)) == 2
        (again / "f").write_bytes(b"z" * 12 * 2**20)  # the filler's space is free again
        vols.remove_env("env_c")
    finally:
        vols.fs.drain()
    assert mount_points_under(tmp_path) == []
    assert _loop_devices_of(tmp_path) == []


def test_unmount_all_takes_several_roots_in_one_pass_and_paths_with_spaces(tmp_path: Path) -> None:
    """A delete unmounts all of an env's volumes with one read of the mount table per pass;
    mountinfo escapes a space, and a root's sibling with a longer name is not under it."""
    roots = [tmp_path / "a b", tmp_path / "c"]
    sibling = tmp_path / "c2"  # shares the prefix "c" but is not under it
    points = [roots[0] / "x", roots[0] / "x" / "deeper", roots[1] / "y", sibling]
    try:
        for point in points:
            point.mkdir(parents=True, exist_ok=True)
            mount("tmpfs", point, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m")
        mount("tmpfs", roots[1] / "y", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m")  # stacked
        assert mount_points_under() == []  # no roots: none, without reading the table
        found = mount_points_under(*roots)
        assert found[0] == str(points[1])  # deepest first
        assert sorted(found) == sorted(map(str, [points[0], points[1], points[2], points[2]]))
        unmount_all(*roots)
        assert mount_points_under(*roots) == []
        assert mount_points_under(sibling) == [str(sibling)]  # left alone
    finally:
        unmount_all(tmp_path)
    assert mount_points_under(tmp_path) == []
