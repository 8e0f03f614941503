"""Each live server of a container in cgroups of its own: kept apart, each within limits.

Each live server of a group (the env created live and its live descendants) runs in a cgroup
of its own under the container's, in the cgroup v2 hierarchy (on a host with cgroup v1
controllers, the unified hierarchy that systemd mounts beside them, which holds no
controllers: the move changes no limit). What it uses is then its own (``usage``), and the
port rules of ``--live-netns off`` (``port_rules``) name it. A server's own subprocesses
inherit its cgroup; the image's other processes (a start script's helpers) stay in the
container's.

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
import threading
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
        dirs[0].mkdir(parents=True, exist_ok=True)  # made by port_rules unless --live-netns on
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


def release_limits(group: Group, env_id: str) -> None:
    """Remove a deleted server's v1 cgroups, lowering the container's limits by its share
    (its v2 cgroup goes with ``release_cgroups``, or with its port rule: ``port_rules``).
    Its process was killed: wait for it to leave. Best effort: the container's end removes
    all of it."""
    deadline = time.monotonic() + RMDIR_WAIT_S
    for ctrl, mine in group.limited(env_id).items():
        with contextlib.suppress(OSError):
            _shift(group.v1[ctrl], ctrl, _values(mine, ctrl), -1)
        rmdir(mine, deadline)
    retry_busy()


def release_cgroups(group: Group, env_id: str) -> None:
    """Remove a deleted server's cgroups, v1 (lowering the container's limits by its
    share) and v2, where no port rule names it (``--live-netns on``). Best effort."""
    release_limits(group, env_id)
    rmdir(group.directory(env_id), time.monotonic() + RMDIR_WAIT_S)


def rmdir(directory: Path, deadline: float) -> None:
    """Remove a deleted server's cgroup once its process has left, waiting until
    ``deadline``; still busy then, it is kept for a later release (``retry_busy``)."""
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


def retry_busy() -> None:
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
