"""Probe 15: the CPU of one zygote start and its delete, by who spends it.

Run from the repository root (as root, with the echo image built):

    .venv/bin/python bench/live_fork_probe/p15_start_cpu.py [--starts 60] [--out FILE]

Starts a server of its own (zygotes on), starts the echo env once (a boot, which leaves
the zygote behind) and waits for the zygote. Then, one after another, ``--starts`` cycles
of what ``bench zygote``'s sustained row does: `start_container`, `wait_for_ready`, an
OpenEnv client, `reset()`, the client's close (which deletes the env). The delete is
waited for here (the bench does it in the background), so every cycle's CPU is counted in
its own window. Over all cycles it reads, in CPU milliseconds per cycle:

- ``client``: this process (the provider, the OpenEnv client, its WebSocket);
- ``server``: the denv server's threads, and ``server_subprocs``: the processes it waited
  for (``cutime``/``cstime``: iptables, mount, ...);
- ``dockerd`` and ``containerd`` (with its shims);
- ``envs``: the zygote container's cgroup (the zygote and every copy of it, v1 cpuacct);
- ``machine``: all CPUs busy (``/proc/stat``), and ``other``: what none of the above is
  (kernel threads, softirqs, ksmd, ...).

Prints one line and writes the JSON to ``--out`` (default: p15_start_cpu.json here).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from conftest import start_server  # noqa: E402  (the tests' own server runner)
from denv.openenv import DenvProvider  # noqa: E402
from openenv.core import GenericEnvClient  # noqa: E402

IMAGE = "denv-echo-env:latest"
TICK = os.sysconf("SC_CLK_TCK")
CGROUP_V1 = Path("/sys/fs/cgroup")


def _proc_ms(pid: int, children: bool = False) -> float:
    """utime+stime (or cutime+cstime) of a process, in ms."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    at = 13 if children else 11  # utime is field 14 of stat(5): index 11 after the name
    return (int(fields[at]) + int(fields[at + 1])) * 1e3 / TICK


def _pids(name: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                comm = (entry / "comm").read_text().strip()
            except OSError:
                continue
            if comm.startswith(name):
                found.append(int(entry.name))
    return found


def _machine_ms() -> float:
    """Busy CPU time of all CPUs since boot, ms (user, nice, system, irq, softirq, steal)."""
    parts = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in parts[:8])
    return (user + nice + system + irq + softirq + steal) * 1e3 / TICK


def _zygote_container(state: Path) -> str:
    with sqlite3.connect(state / "denv.db") as con:
        q = "SELECT runtime FROM envs WHERE owner LIKE 'zygote:%' AND status='healthy'"
        row = con.execute(q).fetchone()
    if row is None:
        return ""
    containers = json.loads(row[0]).get("containers") or {}
    return str(next(iter(containers.values()), ""))


def _cpuacct(container: str) -> Path:
    """The container's v1 cpuacct cgroup (under its key's CPU group), from its pid 1."""
    out = subprocess.run(
        ["docker", "inspect", "-f", "{{.State.Pid}}", container],
        check=True,
        capture_output=True,
        text=True,
    )
    for line in Path(f"/proc/{out.stdout.strip()}/cgroup").read_text().splitlines():
        _, ctrls, where = line.split(":", 2)
        if "cpuacct" in ctrls.split(","):
            return CGROUP_V1 / ctrls / where.lstrip("/")
    raise SystemExit(f"container {container} has no cpuacct cgroup")


def _envs_ms(cgroup: Path) -> float:
    return int((cgroup / "cpuacct.usage").read_text()) / 1e6


def _sample(server_pid: int, cgroup: Path) -> dict[str, float]:
    return {
        "client": time.process_time() * 1e3,
        "server": _proc_ms(server_pid),
        "server_subprocs": _proc_ms(server_pid, children=True),
        "dockerd": sum(_proc_ms(p) for p in _pids("dockerd")),
        "containerd": sum(_proc_ms(p) for p in _pids("containerd")),
        "envs": _envs_ms(cgroup),
        "machine": _machine_ms(),
    }


def _cycle(url_base: str, key: str) -> str:
    provider = DenvProvider(server=url_base, api_key=key, ttl_s=3600)
    url = provider.start_container(IMAGE)
    provider.wait_for_ready(url)
    client: Any = GenericEnvClient(base_url=url, provider=provider).sync()
    client.reset()
    start = str(provider.start)
    client.close()  # deletes the env, waited for here
    return start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--starts", type=int, default=60)
    parser.add_argument("--out", type=Path, default=HERE / "p15_start_cpu.json")
    args = parser.parse_args()
    parent = Path(tempfile.mkdtemp(prefix="denv-p15-"))
    state = parent / "state"
    with start_server(state, "--zygotes") as srv:
        _cycle(srv.url, srv.key)  # the boot that leaves the zygote behind
        deadline = time.monotonic() + 600
        while not (container := _zygote_container(state)):
            if time.monotonic() > deadline:
                raise SystemExit("no zygote served within 600 s")
            time.sleep(0.2)
        for _ in range(5):  # warm: the first copies import what later ones find loaded
            _cycle(srv.url, srv.key)
        cgroup = _cpuacct(container)
        before = _sample(srv.proc.pid, cgroup)
        t0 = time.perf_counter()
        kinds = [_cycle(srv.url, srv.key) for _ in range(args.starts)]
        wall = time.perf_counter() - t0
        after = _sample(srv.proc.pid, cgroup)
    shutil.rmtree(parent, ignore_errors=True)  # start_server removed the state dir
    n = args.starts
    per = {k: round((after[k] - before[k]) / n, 1) for k in before}
    named = sum(v for k, v in per.items() if k != "machine")
    per["other"] = round(per["machine"] - named, 1)
    result = {
        "starts": n,
        "copies": sum(k == "zygote" for k in kinds),
        "wall_ms_per_cycle": round(wall * 1e3 / n, 1),
        "cpu_ms_per_cycle": per,
        "load_before": os.getloadavg()[0],
    }
    print(json.dumps(result))
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
