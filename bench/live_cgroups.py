"""Where a container's live envs run on the host, read from /proc as any host tool would.

The server puts each live env's processes in a cgroup of its own below its container's,
``<container's cgroup>/denv-live/<env id>`` (on a host with cgroup v1 controllers, the same
path in each that limits, e.g. memory), and labels the container ``denv.env=<env id>``.
The benchmarks read both from the outside, not from the server's modules, which may move.

Not run on its own: bench_isolation and live_density import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .measure import sh

#: The cgroup below a container's that holds one cgroup per live env (`<tree>/<env id>`).
TREE = "denv-live"
V1_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Group:
    """The live envs of one container: `pid` a process of it (its pid 1), `v2` the
    container's cgroup v2 directory, `memory_v1` its v1 memory cgroup (None on a v2 host)."""

    pid: int
    v2: Path
    memory_v1: Path | None

    def directory(self, env_id: str) -> Path:
        """The env's cgroup v2 directory (`cgroup.procs`: its processes)."""
        return self.v2 / TREE / env_id

    def memory(self, env_id: str) -> Path | None:
        """The env's v1 memory cgroup directory, where the host has that controller."""
        return None if self.memory_v1 is None else self.memory_v1 / TREE / env_id


def container_pid(env_id: str) -> int:
    """The host pid of pid 1 of the container of env `env_id` (found by its label)."""
    ids = sh("docker", "ps", "-q", "--filter", f"label=denv.env={env_id}").split()
    if not ids:
        raise RuntimeError(f"no running container has label denv.env={env_id}")
    return int(sh("docker", "inspect", "-f", "{{.State.Pid}}", ids[0]))


def group_of(pid: int) -> Group:
    """The group of the container that process `pid` runs in."""
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    v2_mount = next((Path(m.split()[1]) for m in mounts if m.split()[2] == "cgroup2"), None)
    if v2_mount is None:
        raise RuntimeError("this host has no cgroup v2 hierarchy (live envs need one)")
    v2: Path | None = None
    memory_v1: Path | None = None
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, where = line.split(":", 2)
        where = where.split(f"/{TREE}/")[0].strip("/")
        if not controllers:
            v2 = v2_mount / where
        elif "memory" in controllers.split(","):
            candidate = V1_ROOT / controllers / where
            memory_v1 = candidate if candidate.is_dir() else None
    if v2 is None:
        raise RuntimeError(f"process {pid} is in no cgroup v2 group")
    return Group(pid, v2, memory_v1)
