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
import threading
import time
from collections.abc import Sequence
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
        dirs[0].mkdir(parents=True, exist_ok=True)  # made by guard() unless --live-netns on
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


def usage(pid: int, first: bool) -> tuple[int | None, float | None]:
    """Memory (bytes) and CPU time (seconds) of the live server ``pid``, from the cgroups
    it was moved into (``enter``): its own, not its group's. CPU from its cgroup v2
    ``cpu.stat`` (kept whether or not a controller is on there); memory from its v1 memory
    cgroup, else its v2 ``memory.current``, else its proportional share of its pages (a
    v2-only host, where the server's memory is counted only in its container's).

    A cgroup keeps the pages charged before a process moved in, so a fork's own group
    counts what the fork added (the pages it shares stay its parent's). ``first``: the
    container's first server, which booted there: it is counted with what the container
    holds outside every server's group (its boot's pages, the launcher), so the group's
    envs add up to the container."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None, None
    mount = cgroup2_mount()
    v2: Path | None = None
    memory: Path | None = None
    for line in lines:
        _, ctrls, where = line.split(":", 2)
        if not ctrls and mount is not None:
            v2 = mount / where.lstrip("/")
        elif "memory" in ctrls.split(","):
            memory = V1_ROOT / ctrls / where.lstrip("/") / "memory.usage_in_bytes"
    if memory is None and v2 is not None and (v2 / "memory.current").exists():
        memory = v2 / "memory.current"
    mem = cpu = None
    with contextlib.suppress(OSError, ValueError):
        mem = int(memory.read_text()) if memory is not None else _pss(pid)
        if first and memory is not None and memory.parent.parent.name == TREE:
            container = memory.parent.parent.parent
            servers = sum(
                int((d / memory.name).read_text())
                for d in (container / TREE).iterdir()
                if d.is_dir()
            )
            mem += int((container / memory.name).read_text()) - servers
    if v2 is not None:
        with contextlib.suppress(OSError, ValueError):
            cpu = _field(v2 / "cpu.stat", "usage_usec") / 1e6
    return mem, cpu


def _pss(pid: int) -> int:
    """The process's proportional share of the pages it maps, in bytes."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    raise ValueError("no Pss in smaps_rollup")


def release(group: Group, env_id: str, port: int, rule: bool = True, limits: bool = True) -> None:
    """Remove a deleted server's rule and v2 cgroup (unless ``rule`` is False: then
    :class:`Rules` removes them with the container's next fork), and its v1 cgroups,
    lowering the container's limits by its share (unless ``limits`` is False). Its process
    was killed: wait for it to leave. Best effort: the container's end removes all of it."""
    deadline = time.monotonic() + RMDIR_WAIT_S
    if rule:
        with contextlib.suppress(ApartError):
            _restore(group, ["*filter", f"-D {CHAIN} {_rule(group, env_id, port)}", "COMMIT"])
    for ctrl, mine in group.limited(env_id).items() if limits else ():
        with contextlib.suppress(OSError):
            _shift(group.v1[ctrl], ctrl, _values(mine, ctrl), -1)
        _rmdir(mine, deadline)
    if rule:
        _rmdir(group.directory(env_id), deadline)
    _retry_busy()


def release_cgroups(group: Group, env_id: str) -> None:
    """Remove a deleted server's cgroups, v1 (lowering the container's limits by its
    share) and v2, where no port rule names it (``--live-netns on``). Best effort."""
    release(group, env_id, 0, rule=False)
    _rmdir(group.directory(env_id), time.monotonic() + RMDIR_WAIT_S)


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
                    release(group, env_id, port, limits=False)
                cgroups = []
            owners = self._owners.setdefault(group.path, {})
            for env_id, port in gone:
                if owners.get(port) == env_id:
                    del owners[port]
            owners.update({port: env_id for env_id, port in servers})
        for directory in cgroups:  # empty since their release: no wait on a fork's path
            _rmdir(directory, 0.0)

    def release(self, group: Group, env_id: str, port: int) -> None:
        """:func:`release`; the rule (and v2 cgroup) is left to the next fork when this
        server made it and its port is not taken again."""
        release(group, env_id, port, rule=False)  # v1 gone: its process has left
        with self._group_lock(group):
            if self._owners.get(group.path, {}).get(port) == env_id:
                self._gone.setdefault(group.path, []).append((env_id, port))
                return
        release(group, env_id, port, limits=False)

    def forget(self, container: str) -> None:
        """The container ended: its rules went with its network namespace (its cgroup path
        names its id, under either of Docker's cgroup drivers)."""
        with self._lock:
            for path in [p for p in self._owners if container in p]:
                self._locks.pop(path, None)
                self._owners.pop(path, None)
                self._gone.pop(path, None)


def _rmdir(directory: Path, deadline: float) -> None:
    while directory.exists():
        try:
            directory.rmdir()
        except OSError:
            if time.monotonic() > deadline:
                log.info("cgroup %s of a deleted live env is still busy: later", directory)
                with _busy_lock:
                    _busy.append(directory)
                return
            time.sleep(0.01)


# Cgroups of deleted live envs whose process had not left by the deadline (a busy machine).
# Every release tries them again, so a group container that runs for days (a zygote's, whose
# copies come and go) does not gather an empty cgroup for each env it ever ran.
_busy: list[Path] = []
_busy_lock = threading.Lock()


def _retry_busy() -> None:
    """Remove the busy cgroups that have emptied since (children before their parents)."""
    with _busy_lock:
        left = []
        for directory in _busy:
            try:
                if directory.exists():
                    directory.rmdir()
            except OSError:
                left.append(directory)
        _busy[:] = left


def _values(directory: Path, ctrl: str) -> dict[str, int | None]:
    """A cgroup's limits of ``ctrl`` (None: unlimited)."""
    out: dict[str, int | None] = {}
    for name in LIMITS[ctrl]:
        raw = (directory / name).read_text().strip()
        value = None if raw == "max" else int(raw)
        out[name] = None if value is None or value < 0 or value >= UNLIMITED else value
    return out


# Copies of one zygote start and end at once, each shifting its container's limits: a shift
# reads, then writes, so two at once lost one's write, and then wrote memory past memory+swap
# (EINVAL, and the copy failed). The server's shifts take turns.
_shift_lock = threading.Lock()


def _shift(container: Path, ctrl: str, one: dict[str, int | None], sign: int) -> None:
    """Raise (+1) or lower (-1) the container's limits of ``ctrl`` by one server's."""
    names = [n for n in one if one[n] is not None]
    with _shift_lock:
        current = _values(container, ctrl)
        for name in names if sign > 0 else reversed(names):
            if current.get(name) is not None:
                value = int(current[name] or 0) + sign * int(one[name] or 0)
                (container / name).write_text(str(value))


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
