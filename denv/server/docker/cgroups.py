"""A container's cgroup files: freeze and thaw, CPU weight, memory in use; the keys' groups.

Written directly (0.3 ms, not the 25 of a round trip through dockerd and runc); through the
``Engine`` where a file is not found (another cgroup layout).

Each API key's containers run in a cgroup of the key's (``key_parent``, Docker's
``CgroupParent``) at the top of each hierarchy, beside Docker's own ``/docker``: the kernel
gives each key's group the same CPU weight, so the CPU one key's boots and envs get does not
shrink with the number of envs another key starts (16 booting envs of one key against one of
another's: 1/17 of the containers' CPU for the one, half with groups). While a key's envs
boot its group's weight follows how many (``boot_shares``): a key booting one env outweighs
the host's threads that serve another key's sixteen (dockerd, containerd, runc: they run
outside every key's group), and a key booting many gets less than the default. A live env's children
run in cgroups under their container's (``live/cgroups.py``), so within their key's group too.
Docker's cgroupfs driver only: with the systemd driver containers keep Docker's default.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

from denv.server.docker.engine import Engine

log = logging.getLogger(__name__)

FREEZE_TIMEOUT_S = 2.0
ROOT = Path("/sys/fs/cgroup")
KEY_GROUP = "denv-"  # a key's group: /denv-<server instance>-<digest of the key's owner id>
KEY_SHARES = 1024  # a key's group's CPU weight with no boot in flight (the kernel's default)
BOOT_SHARES = 4096  # a key's boots in flight share this weight: one has it all, eight 1/8 each


def key_parent(instance_id: str, owner: str) -> str | None:
    """The cgroup parent of ``owner``'s containers on the server ``instance_id`` (None: no
    key, Docker's default). Named by a digest: the owner id is itself a key's digest."""
    if not owner:
        return None
    return f"/{KEY_GROUP}{instance_id}-{hashlib.sha256(owner.encode()).hexdigest()[:12]}"


def boot_shares(boots: int) -> int:
    """The CPU weight of a key's group with ``boots`` envs booting: 4x the default for one,
    the default for four, half of it for eight; the default again once none boots."""
    return KEY_SHARES if boots <= 0 else max(2, BOOT_SHARES // boots)


def set_key_shares(parent: str, shares: int, *, make: bool) -> None:
    """Set the CPU weight of a key's group (``key_parent``); with ``make``, make the group
    first if Docker has not yet (Docker keeps a group it finds). cgroup v1's cpu hierarchy,
    or v2 where the group exists; elsewhere nothing."""
    v1 = ROOT / "cpu" / parent.lstrip("/")
    with suppress(OSError):
        if (ROOT / "cpu").is_dir() and not (ROOT / "cpu").is_symlink():
            if make:
                v1.mkdir(exist_ok=True)
            if v1.is_dir():
                (v1 / "cpu.shares").write_text(str(shares))
        elif (v2 := ROOT / parent.lstrip("/") / "cpu.weight").exists():
            v2.write_text(str(1 + (shares - 2) * 9999 // 262142))  # v2's scale, as runc maps


def remove_key_parents(instance_id: str, keep: set[str] | None = None) -> None:
    """Remove the server's key groups (``key_parent``) but those in ``keep``; a group that
    still holds a container stays (rmdir refuses it)."""
    kept = {p.lstrip("/") for p in keep or set()}
    for hierarchy in [ROOT, *(d for d in ROOT.iterdir() if d.is_dir() and not d.is_symlink())]:
        for directory in hierarchy.glob(f"{KEY_GROUP}{instance_id}-*"):
            if directory.name not in kept:
                with suppress(OSError):
                    directory.rmdir()


def _dirs(controller: str, cid: str) -> Iterator[str]:
    """Where a container's cgroup may be, for a v1 ``controller``: in Docker's default
    parent, in a key's group, and the same for cgroup v2 (cgroupfs and systemd drivers)."""
    yield f"{ROOT}/{controller}/docker/{cid}"
    yield from glob.iglob(f"{ROOT}/{controller}/{KEY_GROUP}*/{cid}")
    yield f"{ROOT}/system.slice/docker-{cid}.scope"
    yield f"{ROOT}/docker/{cid}"
    yield from glob.iglob(f"{ROOT}/{KEY_GROUP}*/{cid}")


def _file(controller: str, cid: str, v1: str, v2: str) -> Path | None:
    """The first of a container's cgroup files that exists (``v1`` in the v1 layout)."""
    for directory in _dirs(controller, cid):
        name = v1 if directory.startswith(f"{ROOT}/{controller}/") else v2
        if os.path.exists(path := f"{directory}/{name}"):
            return Path(path)
    return None


def freeze(engine: Engine, cid: str) -> str | None:
    """Stop a running container's processes for a snapshot; how, for :func:`thaw`.

    Its cgroup's freezer, as ``docker pause`` does, without the round trips through
    dockerd and runc; ``docker pause`` where there is no freezer file.
    None (no error) when the container does not run or is already paused.
    """
    path = _freezer(cid)
    if path is None:
        return "docker" if engine.try_pause(cid) else None
    v1 = path.name == "freezer.state"
    try:
        if _frozen(path):
            return None
        path.write_text("FROZEN" if v1 else "1")
        deadline = time.monotonic() + FREEZE_TIMEOUT_S
        while not _frozen(path):
            if time.monotonic() > deadline:
                path.write_text("THAWED" if v1 else "0")
                log.warning("freezing %s timed out; pausing it through docker", cid[:12])
                return "docker" if engine.try_pause(cid) else None
            time.sleep(0.0002)
    except OSError:  # the container stopped meanwhile
        return None
    return "freezer"


def thaw(engine: Engine, cid: str, how: str | None = "freezer") -> None:
    """Undo :func:`freeze` (idempotent; a no-op for a container that is not frozen)."""
    if how == "docker":
        engine.unpause(cid)
        return
    path = _freezer(cid)
    if path is not None:
        with suppress(OSError):
            path.write_text("THAWED" if path.name == "freezer.state" else "0")


def set_cpu_shares(engine: Engine, cid: str, shares: int) -> None:
    """Change a running container's CPU weight (its cgroup file: no dockerd round trip)."""
    weight = 1 + (shares - 2) * 9999 // 262142  # cgroup v2's scale, as runc maps it
    path = _file("cpu", cid, "cpu.shares", "cpu.weight")
    if path is not None:
        with suppress(OSError):
            path.write_text(str(shares if path.name == "cpu.shares" else weight))
            return
    engine.update_cpu_shares(cid, shares)


def memory_bytes(engine: Engine, cid: str) -> int | None:
    """Memory the container uses now (its cgroup's count), None when unknown."""
    found = cgroup_memory(cid)
    return found if found is not None else engine.stats_memory(cid)


def cgroup_memory(cid: str) -> int | None:
    """Memory the container uses now, from its cgroup file only (None: not found)."""
    path = _file("memory", cid, "memory.usage_in_bytes", "memory.current")
    if path is not None:
        with suppress(OSError, ValueError):
            return int(path.read_text())
    return None


def _freezer(cid: str) -> Path | None:
    """The freezer control file of a container's cgroup (v1 or v2), None when not found."""
    return _file("freezer", cid, "freezer.state", "cgroup.freeze")


def _frozen(path: Path) -> bool:
    if path.name == "freezer.state":
        return path.read_text().strip() == "FROZEN"
    return "frozen 1" in (path.parent / "cgroup.events").read_text()


def cpu_seconds(cid: str) -> float | None:
    """CPU time the container's processes used so far (None when unknown)."""
    path = _file("cpuacct", cid, "cpuacct.usage", "cpu.stat")
    try:
        if path is not None and path.name == "cpuacct.usage":
            return int(path.read_text()) / 1e9
        for line in path.read_text().splitlines() if path is not None else []:
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
    except (OSError, ValueError):
        pass
    return None
