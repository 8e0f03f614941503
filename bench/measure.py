"""The machine a benchmark ran on and the conditions of the run, and what a container used
(memory and CPU from its cgroup), and `sh` to ask the tools that know. Read-only: nothing
here changes the machine.

Not run on its own: the benchmarks import it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import platform
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def sh(*args: str, check: bool = True, timeout: float | None = 120) -> str:
    """Run a command; its stdout (stripped). Errors carry the command's stderr."""
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout.strip()


# -- the machine ----------------------------------------------------------------------------


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes."""
    out: dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                out[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def _git_commit() -> str:
    try:
        commit = sh("git", "-C", str(ROOT), "rev-parse", "HEAD")
        dirty = sh("git", "-C", str(ROOT), "status", "--porcelain", "--", "denv", "adapters")
    except (RuntimeError, OSError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def machine() -> dict[str, Any]:
    """Cores, memory, Docker version, date and denv commit: what a result file records."""
    mem = meminfo()
    try:
        docker_version = sh("docker", "version", "--format", "{{.Server.Version}}")
    except (RuntimeError, OSError) as exc:
        docker_version = f"unavailable ({exc})"
    try:
        from importlib.metadata import version

        import openenv  # noqa: F401  (version only)

        openenv_version = version("openenv")
    except Exception:
        openenv_version = "unknown"
    return {
        "cores": os.cpu_count(),
        "memory_bytes": mem.get("MemTotal"),
        "docker_version": docker_version,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "openenv_version": openenv_version,
        "date": now_iso(),
        "denv_commit": _git_commit(),
    }


def conditions() -> dict[str, Any]:
    """How busy the machine was: load and containers that are not this run's."""
    try:
        running = len(sh("docker", "ps", "-q").split())
    except (RuntimeError, OSError):
        running = -1
    return {
        "loadavg": loadavg(),
        "mem_available_bytes": meminfo().get("MemAvailable"),
        "containers_running": running,
        "at": now_iso(),
    }


# -- containers: memory and CPU from their cgroups ------------------------------------------


def _cgroup_dirs(controller: str, cid: str) -> Iterator[Path]:
    base = Path("/sys/fs/cgroup")
    yield base / controller / "docker" / cid  # v1, cgroupfs driver
    yield base / controller / "system.slice" / f"docker-{cid}.scope"  # v1, systemd driver
    yield base / "system.slice" / f"docker-{cid}.scope"  # v2, systemd driver
    yield base / "docker" / cid  # v2, cgroupfs driver
    # in an API key's group (denv.server.docker.cgroups.key_parent), v1 and v2
    yield from base.glob(f"{controller}/denv-*/{cid}")
    yield from base.glob(f"denv-*/{cid}")


def _stat_file(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            out[key] = int(value)
    return out


def container_memory(cid: str) -> dict[str, int] | None:
    """{"usage": bytes as `docker stats` shows (usage less inactive file cache), "rss": anon}."""
    for d in _cgroup_dirs("memory", cid):
        if (d / "memory.usage_in_bytes").exists():  # v1
            stat = _stat_file(d / "memory.stat")
            usage = int((d / "memory.usage_in_bytes").read_text())
            inactive = stat.get("total_inactive_file", 0)
            return {"usage": usage - inactive, "rss": stat.get("total_rss", 0)}
        if (d / "memory.current").exists():  # v2
            stat = _stat_file(d / "memory.stat")
            usage = int((d / "memory.current").read_text())
            return {"usage": usage - stat.get("inactive_file", 0), "rss": stat.get("anon", 0)}
    return None


def container_cpu_ns(cid: str) -> int | None:
    """CPU time a container has used, in nanoseconds."""
    for d in _cgroup_dirs("cpuacct", cid):
        if (d / "cpuacct.usage").exists():
            return int((d / "cpuacct.usage").read_text())
    for d in _cgroup_dirs("cpu", cid):
        if (d / "cpu.stat").exists():
            usec = _stat_file(d / "cpu.stat").get("usage_usec")
            return None if usec is None else usec * 1000
    return None
