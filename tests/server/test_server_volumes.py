"""Overlay volumes on the real host (needs root for mount): capture, whiteouts, merge."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from denv.server.config import LAYER_DEPTH_LIMIT
from denv.server.volumes import Volumes, mount_points_under

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
