"""The live servers' port rules of one container, on a real network namespace and cgroup v2
tree (no engine): a deleted server's rule and cgroup wait for the next fork's transaction, a
port taken again loses its old rule first, and a waiting rule that is already gone never
fails a fork. Needs root, as the server does."""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from denv.server.docker.live import cgroups, port_rules


@pytest.fixture
def group() -> Iterator[cgroups.Group]:
    """A process in a network namespace of its own, and a cgroup v2 dir standing for its
    container's."""
    mount = cgroups.cgroup2_mount()
    assert mount is not None, "this host has no cgroup v2 hierarchy"
    proc = subprocess.Popen(["unshare", "--net", "sleep", "300"])
    path = f"/denv-test-{secrets.token_hex(4)}"
    try:
        # Until unshare has run, the process is in this namespace: rules would go to the host's.
        host = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{proc.pid}/ns/net") == host:
            assert time.monotonic() < deadline, "unshare --net did not make a namespace in 10 s"
            time.sleep(0.005)
        yield cgroups.Group(proc.pid, path, mount, {})
    finally:
        proc.kill()
        proc.wait()
        tree = mount / path.lstrip("/")
        for d in sorted(tree.rglob("*"), key=lambda p: -len(p.parts)):
            if d.is_dir():
                d.rmdir()
        if tree.exists():
            tree.rmdir()


def rules(group: cgroups.Group) -> str:
    cmd = ["nsenter", f"--net=/proc/{group.pid}/ns/net", "--", "iptables", "-S", "DENV-LIVE"]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.replace('"', "")


def names(group: cgroups.Group, env_id: str) -> str:
    """How a rule of ``env_id``'s names its cgroup."""
    return f"--path {group.cgroup(env_id)} -j"


def test_a_deleted_servers_rule_goes_with_the_next_fork(group: cgroups.Group) -> None:
    r = port_rules.Rules()
    r.guard(group, [("root", 8000)], first=True)
    r.guard(group, [("a", 8001), ("b", 8002)], first=False)

    r.release(group, "b", 8002)  # waits: no iptables on the delete's path
    assert names(group, "b") in rules(group)
    assert group.directory("b").exists()

    r.guard(group, [("c", 8002)], first=False)  # b's port again: b's rule goes first
    listed = rules(group)
    assert names(group, "b") not in listed
    assert "--dport 8002 -m cgroup ! " + names(group, "c") in listed
    assert not group.directory("b").exists()


def test_a_port_taken_before_the_delete_loses_its_old_rule_at_once(
    group: cgroups.Group,
) -> None:
    r = port_rules.Rules()
    r.guard(group, [("root", 8000)], first=True)
    r.guard(group, [("a", 8001)], first=False)
    r.guard(group, [("d", 8001)], first=False)  # a's record went first, its port reused

    r.release(group, "a", 8001)
    listed = rules(group)
    assert names(group, "a") not in listed
    assert "--dport 8001 -m cgroup ! " + names(group, "d") in listed


def test_a_waiting_rule_already_gone_never_fails_a_fork(group: cgroups.Group) -> None:
    r = port_rules.Rules()
    r.guard(group, [("root", 8000)], first=True)
    r.guard(group, [("a", 8001)], first=False)
    r.release(group, "a", 8001)
    # Someone removed it meanwhile (a firewall reload): the fork's transaction fails once.
    subprocess.run(
        ["nsenter", f"--net=/proc/{group.pid}/ns/net", "--", "iptables", "-F", "DENV-LIVE"],
        check=True,
    )

    r.guard(group, [("e", 8001)], first=False)
    assert names(group, "e") in rules(group)
    assert not Path(group.directory("a")).exists()
