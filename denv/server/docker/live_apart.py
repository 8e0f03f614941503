"""Live servers of one container kept off each other's ports.

A live env's children run in its container's network namespace, each serving on a port of
its own. So that no live server of a group (the env created live and its live descendants)
can connect to another one's port, each runs in a cgroup of its own under the container's,
in the cgroup v2 hierarchy (on a host with cgroup v1 controllers, the unified hierarchy that
systemd mounts beside them, which holds no controllers: the move changes no limit), and the
container's network namespace holds one iptables rule per served port: TCP to a local
address on that port, from a live server's cgroup other than the port's owner, is reset.

What this leaves as it was: ingress (it comes from outside the namespace), the image's
other processes (a start script's helpers), a server's own subprocesses (they inherit its
cgroup), and egress (the container's rules). The rules go with the namespace when the
container ends; a deleted env's rule and cgroup are removed at once.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

log = logging.getLogger(__name__)

TREE = "denv-live"
CHAIN = "DENV-LIVE"
RMDIR_WAIT_S = 1.0


class ApartError(OSError):
    """The servers could not be kept apart (the fork or start that asked fails)."""


@cache
def cgroup2_mount() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup/unified`` on a hybrid
    host, ``/sys/fs/cgroup`` on a v2 one), or None."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


@dataclass(frozen=True)
class Group:
    """The live servers of one container: ``pid`` is any process in it (its namespaces),
    ``path`` the container's cgroup v2 path."""

    pid: int
    path: str
    mount: Path

    @property
    def tree(self) -> str:
        return f"{self.path}/{TREE}"

    def cgroup(self, env_id: str) -> str:
        return f"{self.tree}/{env_id}"

    def directory(self, env_id: str) -> Path:
        return self.mount / self.cgroup(env_id).lstrip("/")


def group_of(pid: int) -> Group:
    """The group of the container that process ``pid`` runs in."""
    mount = cgroup2_mount()
    if mount is None:
        raise ApartError("this host has no cgroup v2 hierarchy to keep live envs apart")
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError as exc:
        raise ApartError(f"the env's process has ended ({exc})") from exc
    for line in lines:
        if line.startswith("0::"):
            path = line[3:].split(f"/{TREE}/")[0].rstrip("/")
            return Group(pid, path, mount)
    raise ApartError(f"process {pid} is in no cgroup v2 group")


def guard(group: Group, servers: list[tuple[str, int]], first: bool) -> None:
    """Give each ``(env, port)`` its cgroup and its port's rule (``first``: the container's
    first server, with the chain and its jump), in one iptables transaction."""
    for env_id, _ in servers:
        group.directory(env_id).mkdir(parents=True, exist_ok=True)
    lines = ["*filter"]
    if first:
        lines += [
            f":{CHAIN} - [0:0]",
            f"-A OUTPUT -p tcp -m addrtype --dst-type LOCAL -m cgroup --path {group.tree} "
            f"-j {CHAIN}",
        ]
    lines += [f"-A {CHAIN} {_rule(group, env_id, port)}" for env_id, port in servers]
    _restore(group, [*lines, "COMMIT"])


def enter(group: Group, env_id: str, pid: int) -> None:
    """Move ``pid`` (a live server, before it runs env code again) into its cgroup."""
    try:
        (group.directory(env_id) / "cgroup.procs").write_text(str(pid))
    except OSError as exc:
        raise ApartError(f"moving the env's process into its cgroup failed: {exc}") from exc


def release(group: Group, env_id: str, port: int) -> None:
    """Remove a deleted server's rule and cgroup (its process was killed: wait for it to
    leave the cgroup). Best effort: the container's end removes both anyway."""
    with contextlib.suppress(ApartError):
        _restore(group, ["*filter", f"-D {CHAIN} {_rule(group, env_id, port)}", "COMMIT"])
    directory = group.directory(env_id)
    deadline = time.monotonic() + RMDIR_WAIT_S
    while directory.exists():
        try:
            directory.rmdir()
        except OSError:
            if time.monotonic() > deadline:
                log.warning("cgroup %s of a deleted live env is still busy", directory)
                return
            time.sleep(0.01)


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
