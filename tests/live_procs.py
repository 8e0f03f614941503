"""Live envs' processes on this machine, found from the host (e2e and cluster tests)."""

from __future__ import annotations

from pathlib import Path


def live_pid(env_id: str) -> int:
    """The host pid of a live env's server: pid 1 of its own pid namespace, in the cgroup
    named after it (whether it serves its own port in its container's network namespace or
    the env's port in one of its own: ``denv serve --live-netns``)."""
    return min(live_pids(env_id))


def live_pids(env_id: str) -> list[int]:
    """The host pids of a live env's processes (its cgroup's): a child of a server of N
    workers runs N, its first (pid 1 of its namespace) the lowest."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            text = (proc / "cgroup").read_text()
        except OSError:
            continue
        if f"/denv-live/{env_id}\n" in text:
            found.append(int(proc.name))
    assert found, f"no process of live env {env_id}"
    return sorted(found)
