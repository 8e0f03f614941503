"""Live servers of one container kept apart: off each other's ports, each within limits.

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

Limits: where the host has cgroup v1 controllers (memory, pids, cpu), each live server also
gets a cgroup of its own in each, holding the limits of one env's container (its memory and
swap, pids, CPU quota: those of the container's first server), and the container's own
limits grow by that much for each server, so a group of n live envs may use what n
containers could, and no more. An OOM or a fork bomb in one server then fails that server
alone, and the node can say which limit it hit. (On a cgroup v2-only host, the limits stay
the container's, shared by the group.)
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
V1_ROOT = Path("/sys/fs/cgroup")
# The v1 files that make an env's limits, per controller, in the order they are raised (swap
# before memory: memory may never exceed memory+swap).
LIMITS = {
    "memory": ("memory.memsw.limit_in_bytes", "memory.limit_in_bytes"),
    "pids": ("pids.max",),
    "cpu": ("cpu.cfs_quota_us",),
}
UNLIMITED = 1 << 62  # memory limits at or past this are "none" (the kernel shows 2^63 - 4096)
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
    ``path`` the container's cgroup v2 path, ``v1`` its directory in each v1 controller
    that limits (memory, pids, cpu; none on a v2-only host)."""

    pid: int
    path: str
    mount: Path
    v1: dict[str, Path]

    @property
    def tree(self) -> str:
        return f"{self.path}/{TREE}"

    def cgroup(self, env_id: str) -> str:
        return f"{self.tree}/{env_id}"

    def directory(self, env_id: str) -> Path:
        return self.mount / self.cgroup(env_id).lstrip("/")

    def limited(self, env_id: str) -> dict[str, Path]:
        """The server's directory in each v1 controller."""
        return {ctrl: d / TREE / env_id for ctrl, d in self.v1.items()}


def group_of(pid: int) -> Group:
    """The group of the container that process ``pid`` runs in."""
    mount = cgroup2_mount()
    if mount is None:
        raise ApartError("this host has no cgroup v2 hierarchy to keep live envs apart")
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError as exc:
        raise ApartError(f"the env's process has ended ({exc})") from exc
    path, v1 = None, {}
    for line in lines:
        _, ctrls, where = line.split(":", 2)
        where = where.split(f"/{TREE}/")[0].rstrip("/")
        if not ctrls:
            path = where
        for ctrl in set(ctrls.split(",")) & set(LIMITS):
            base = V1_ROOT / ctrls
            if (base / where.lstrip("/")).is_dir():
                v1[ctrl] = base / where.lstrip("/")
    if path is None:
        raise ApartError(f"process {pid} is in no cgroup v2 group")
    return Group(pid, path, mount, v1)


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


def limit(group: Group, template: str | None, env_ids: list[str]) -> None:
    """Give each server its v1 cgroups with one env's limits (those of the group's server
    ``template``, or else the container's own, before any was raised), raising the
    container's limits by as much for each."""
    try:
        for ctrl, container in group.v1.items():
            one = _values(group.limited(template)[ctrl] if template else container, ctrl)
            for env_id in env_ids:
                mine = group.limited(env_id)[ctrl]
                mine.mkdir(parents=True, exist_ok=True)
                _shift(container, ctrl, one, +1)  # the container's first: a server never exceeds it
                for name in reversed(LIMITS[ctrl]):  # memory, then memory+swap
                    if one.get(name) is not None:
                        (mine / name).write_text(str(one[name]))
    except OSError as exc:
        raise ApartError(f"setting the env's limits failed: {exc}") from exc


def lend_pids(group: Group, env_id: str, n: int) -> None:
    """Let the server ``env_id`` hold ``n`` more processes (or ``-n``: give them back): its
    clones count in its cgroup until each is moved into its own."""
    pids = group.limited(env_id).get("pids")
    if pids is None:
        return
    try:
        _shift(pids, "pids", {"pids.max": n}, 1)
    except (OSError, ValueError) as exc:
        raise ApartError(f"lending the forking env {n} pids failed: {exc}") from exc


def enter(group: Group, env_id: str, pid: int) -> None:
    """Move ``pid`` (a live server, before it runs env code again) into its cgroups."""
    dirs = [group.directory(env_id), *group.limited(env_id).values()]
    try:
        for directory in dirs:
            (directory / "cgroup.procs").write_text(str(pid))
    except OSError as exc:
        raise ApartError(f"moving the env's process into its cgroups failed: {exc}") from exc


def exit_reason(group: Group, env_id: str) -> str | None:
    """Which of its limits a server that ended hit, if one did."""
    mine = group.limited(env_id)
    try:
        if "memory" in mine and _field(mine["memory"] / "memory.oom_control", "oom_kill"):
            limit_b = _values(mine["memory"], "memory").get("memory.limit_in_bytes")
            return f"out of memory (its limit {limit_b >> 20} MiB)" if limit_b else "out of memory"
        if "pids" in mine and _field(mine["pids"] / "pids.events", "max"):
            pids = _values(mine["pids"], "pids").get("pids.max")
            return f"it reached its limit of {pids} processes and threads"
    except OSError:
        return None
    return None


def release(group: Group, env_id: str, port: int) -> None:
    """Remove a deleted server's rule and cgroups, and lower the container's limits by its
    share (its process was killed: wait for it to leave). Best effort: the container's end
    removes all of it anyway."""
    with contextlib.suppress(ApartError):
        _restore(group, ["*filter", f"-D {CHAIN} {_rule(group, env_id, port)}", "COMMIT"])
    deadline = time.monotonic() + RMDIR_WAIT_S
    for ctrl, mine in group.limited(env_id).items():
        with contextlib.suppress(OSError):
            _shift(group.v1[ctrl], ctrl, _values(mine, ctrl), -1)
        _rmdir(mine, deadline)
    _rmdir(group.directory(env_id), deadline)


def _rmdir(directory: Path, deadline: float) -> None:
    while directory.exists():
        try:
            directory.rmdir()
        except OSError:
            if time.monotonic() > deadline:
                log.warning("cgroup %s of a deleted live env is still busy", directory)
                return
            time.sleep(0.01)


def _values(directory: Path, ctrl: str) -> dict[str, int | None]:
    """A cgroup's limits of ``ctrl`` (None: unlimited)."""
    out: dict[str, int | None] = {}
    for name in LIMITS[ctrl]:
        raw = (directory / name).read_text().strip()
        value = None if raw == "max" else int(raw)
        out[name] = None if value is None or value < 0 or value >= UNLIMITED else value
    return out


def _shift(container: Path, ctrl: str, one: dict[str, int | None], sign: int) -> None:
    """Raise (+1) or lower (-1) the container's limits of ``ctrl`` by one server's."""
    names = [n for n in one if one[n] is not None]
    current = _values(container, ctrl)
    for name in names if sign > 0 else reversed(names):
        if current.get(name) is not None:
            (container / name).write_text(str(int(current[name] or 0) + sign * int(one[name] or 0)))


def _field(path: Path, key: str) -> int:
    for line in path.read_text().splitlines():
        k, _, v = line.partition(" ")
        if k == key:
            return int(v)
    return 0


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
