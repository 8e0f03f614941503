"""A key's CPU group gets the weight of its boots in flight (docker/cgroups.py, issue 25).

A real cgroup of this machine (no Docker needed): the group is made only when asked (a key
with an env on the node), its weight follows ``boot_shares``, and the server's clean-up of
its key groups removes it.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from denv.server.docker import cgroups


def cpu_hierarchy() -> Path:
    root = cgroups.ROOT / "cpu"
    if not (root / "cpu.shares").exists():
        pytest.fail("no cgroup v1 cpu hierarchy at /sys/fs/cgroup/cpu: run as root on cgroup v1")
    return root


def test_a_key_booting_one_env_outweighs_the_default_and_one_booting_many_does_not() -> None:
    assert cgroups.boot_shares(0) == cgroups.KEY_SHARES == 1024
    assert cgroups.boot_shares(1) == 4 * cgroups.KEY_SHARES
    assert cgroups.boot_shares(4) == cgroups.KEY_SHARES
    assert cgroups.boot_shares(8) == cgroups.KEY_SHARES // 2
    assert cgroups.boot_shares(10**6) == 2  # the kernel's least


def test_the_weight_is_written_to_the_keys_group_and_the_group_is_removed() -> None:
    root = cpu_hierarchy()
    instance = f"test{uuid.uuid4().hex[:8]}"
    parent = cgroups.key_parent(instance, "owner-digest")
    assert parent is not None
    group = root / parent.lstrip("/")
    try:
        cgroups.set_key_shares(parent, cgroups.boot_shares(1), make=False)
        assert not group.exists()  # no env of the key here: no group made for it
        cgroups.set_key_shares(parent, cgroups.boot_shares(1), make=True)
        assert (group / "cpu.shares").read_text().strip() == "4096"
        cgroups.set_key_shares(parent, cgroups.boot_shares(0), make=False)
        assert (group / "cpu.shares").read_text().strip() == "1024"
        cgroups.remove_key_parents(instance)
        assert not group.exists()
    finally:
        if group.exists():
            group.rmdir()
