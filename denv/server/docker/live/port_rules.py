"""Live servers of one container kept off each other's ports (``--live-netns off``).

Without a network namespace per child, a live env's children run in its container's network
namespace, each serving on a port of its own. So that no live server of a group can connect
to another one's port, each runs in a cgroup of its own (``cgroups``), and the container's
network namespace holds one iptables rule per served port: TCP to a local address on that
port, from a live server's cgroup other than the port's owner, is reset.

What this leaves as it was: ingress (it comes from outside the namespace), the image's
other processes (a start script's helpers), a server's own subprocesses (they inherit its
cgroup), and egress (the container's rules). The rules go with the namespace when the
container ends; a deleted env's rule waits for the container's next fork (:class:`Rules`).
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Sequence

from denv.server.docker.live.cgroups import (
    RMDIR_WAIT_S,
    ApartError,
    Group,
    release_limits,
    retry_busy,
    rmdir,
)

CHAIN = "DENV-LIVE"


def guard(
    group: Group,
    servers: list[tuple[str, int]],
    first: bool,
    gone: Sequence[tuple[str, int]] = (),
) -> None:
    """Give each ``(env, port)`` its cgroup and its port's rule (``first``: the container's
    first server, with the chain and its jump), and remove the rules of the deleted servers
    ``gone`` first, in one iptables transaction."""
    for env_id, _ in servers:
        group.directory(env_id).mkdir(parents=True, exist_ok=True)
    lines = ["*filter"]
    if first:
        lines += [
            f":{CHAIN} - [0:0]",
            f"-A OUTPUT -p tcp -m addrtype --dst-type LOCAL -m cgroup --path {group.tree} "
            f"-j {CHAIN}",
        ]
    lines += [f"-D {CHAIN} {_rule(group, env_id, port)}" for env_id, port in gone]
    lines += [f"-A {CHAIN} {_rule(group, env_id, port)}" for env_id, port in servers]
    _restore(group, [*lines, "COMMIT"])


def release(group: Group, env_id: str, port: int) -> None:
    """Remove a deleted server's rule, then its v2 cgroup (which the rule names). Its process
    was killed: wait for it to leave. Best effort: the container's end removes all of it."""
    deadline = time.monotonic() + RMDIR_WAIT_S
    with contextlib.suppress(ApartError):
        _restore(group, ["*filter", f"-D {CHAIN} {_rule(group, env_id, port)}", "COMMIT"])
    rmdir(group.directory(env_id), deadline)
    retry_busy()


class Rules:
    """The port rules this server made in each container, so that a deleted server's rule
    waits for the container's next fork and goes in that fork's transaction: one
    ``iptables-restore`` per fork, none per delete.

    A waiting rule resets connections to a port no one serves, from the group's live
    servers: they would be refused anyway. When its port is taken again, the rule is gone
    first: removed in the transaction that adds the port's new rule, or at once when the
    port was taken before the delete (the rule names the deleted server's cgroup, so the new
    owner's rule stays). The deleted server's v2 cgroup stays until its rule is removed (with
    the legacy iptables, a table that holds a rule whose cgroup is gone cannot be changed).
    Rules this server did not make (before a restart) are removed at once, as before.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._owners: dict[str, dict[int, str]] = {}  # group path: port -> its env
        self._gone: dict[str, list[tuple[str, int]]] = {}  # group path: rules to remove

    def _group_lock(self, group: Group) -> threading.Lock:
        with self._lock:
            return self._locks.setdefault(group.path, threading.Lock())

    def guard(self, group: Group, servers: list[tuple[str, int]], first: bool) -> None:
        """:func:`guard`, removing the rules of the servers deleted since the last one in
        the same transaction."""
        with self._group_lock(group):
            if first:  # a new container: nothing of an earlier one with this path is left
                self._owners[group.path], self._gone[group.path] = {}, []
            gone = self._gone.pop(group.path, [])
            cgroups = [group.directory(env_id) for env_id, _ in gone]
            try:
                guard(group, servers, first, gone)
            except ApartError:
                if not gone:
                    raise
                # A deleted server's rule never fails a fork: this fork's rules alone, then
                # each deleted one's as a delete removed it before.
                try:
                    guard(group, servers, first)
                except ApartError:
                    self._gone.setdefault(group.path, []).extend(gone)
                    raise
                for env_id, port in gone:
                    release(group, env_id, port)
                cgroups = []
            owners = self._owners.setdefault(group.path, {})
            for env_id, port in gone:
                if owners.get(port) == env_id:
                    del owners[port]
            owners.update({port: env_id for env_id, port in servers})
        for directory in cgroups:  # empty since their release: no wait on a fork's path
            rmdir(directory, 0.0)

    def release(self, group: Group, env_id: str, port: int) -> None:
        """:func:`release`; the rule (and v2 cgroup) is left to the next fork when this
        server made it and its port is not taken again."""
        release_limits(group, env_id)  # v1 gone: its process has left
        with self._group_lock(group):
            if self._owners.get(group.path, {}).get(port) == env_id:
                self._gone.setdefault(group.path, []).append((env_id, port))
                return
        release(group, env_id, port)

    def forget(self, container: str) -> None:
        """The container ended: its rules went with its network namespace (its cgroup path
        names its id, under either of Docker's cgroup drivers)."""
        with self._lock:
            for path in [p for p in self._owners if container in p]:
                self._locks.pop(path, None)
                self._owners.pop(path, None)
                self._gone.pop(path, None)


def _rule(group: Group, env_id: str, port: int) -> str:
    return (
        f"-p tcp --dport {port} -m cgroup ! --path {group.cgroup(env_id)} "
        "-j REJECT --reject-with tcp-reset"
    )


def _restore(group: Group, lines: list[str]) -> None:
    """One ``iptables-restore --noflush`` in the container's network namespace."""
    netns = f"--net=/proc/{group.pid}/ns/net"
    proc = subprocess.run(
        ["nsenter", netns, "--", "iptables-restore", "-w", "5", "--noflush"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise ApartError(f"iptables-restore in the env's network namespace: {proc.stderr.strip()}")
