"""A network namespace per live child (``denv serve --live-netns on``) against today's shared
namespace with port rules (``off``), side by side in one run.

Two servers of this run's own, one per mode, each with a stepped live echo root. Rounds
alternate between them: ``fork_clients(root, 8)`` until each child has answered ``state()``
through the ingress (wall), and the CPU that fork spent, by who spent it: the denv server
(API, node: the netns pairs; apart, the subprocesses it ran and waited for, such as the
port rules' ``iptables-restore``), the root's process (its
clones), this client, and the 8 children from their clone to their first answer (read from
each child's own cgroup, before its delete). The kernel's teardown of a child's namespace
runs later in kworkers, outside every process: not counted here (docs/live-forks.md, probe 9,
puts it near 1.5 ms a child). The load average is kept beside each round.

    python -m bench --quick --only live_netns     # -> bench/results/live_netns.json
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from denv.openenv import DenvProvider, fork_clients
from openenv.core import GenericEnvClient

from .bench_live import cpu_ns, live_pid
from .bench_start import READY_TIMEOUT_S
from .harness import (
    Bench,
    Server,
    parallel,
    ratio,
    remove_leftovers,
    start_server,
    stop_process,
    summarize,
)

log = logging.getLogger("bench.live_netns")
MODES = ("off", "on")
WHO = ("server", "server_subprocesses", "root", "client", "children")
STEPS = 10


def _reaped_ms(pid: int) -> float:
    """CPU of the subprocesses ``pid`` has waited for (cutime + cstime, in clock ticks):
    the server's ``iptables-restore`` and ``nsenter`` runs, which its own count misses."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[13]) + int(fields[14])) * 1e3 / os.sysconf("SC_CLK_TCK")


def _cgroup_of(pid: int) -> Path:
    """The cgroup v2 directory of ``pid``."""
    line = next(x for x in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if x[:3] == "0::")
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    mount = next(m.split()[1] for m in mounts if m.split()[2] == "cgroup2")
    return Path(mount) / line[3:].lstrip("/")


class Side:
    """One mode: its server and a stepped live root."""

    def __init__(self, b: Bench, mode: str) -> None:
        self.mode = mode
        self.server: Server = start_server(
            Path(f"{b.server.state_dir}-netns-{mode}"), ("--live-netns", mode)
        )
        self.client: Any = None
        try:
            provider = DenvProvider(
                server=self.server.url,
                api_key=self.server.api_key,
                fork="live",
                ttl_s=7200,
                timeout_s=READY_TIMEOUT_S,
            )
            url = provider.start_container(b.image)
            provider.wait_for_ready(url)
            self.client = GenericEnvClient(base_url=url, provider=provider).sync()
            self.client.reset()
            for i in range(STEPS):
                self.client.step({"message": f"prefix {i}"})
            self.root_pid = live_pid(provider.env_id or "")
            self.tree = _cgroup_of(self.root_pid).parent
        except BaseException:
            self.close()
            raise

    def fork8(self) -> dict[str, float]:
        before = {
            "server": cpu_ns(self.server.proc.pid),
            "server_subprocesses": _reaped_ms(self.server.proc.pid) * 1e6,
            "root": cpu_ns(self.root_pid),
            "client": cpu_ns(os.getpid()),
        }
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        children = fork_clients(self.client, 8)
        states = parallel([c.state for c in children])
        wall = (time.perf_counter() - t0) * 1e3
        after = {
            "server": cpu_ns(self.server.proc.pid),
            "server_subprocesses": _reaped_ms(self.server.proc.pid) * 1e6,
            "root": cpu_ns(self.root_pid),
            "client": cpu_ns(os.getpid()),
        }
        try:
            if not all(s["step_count"] == STEPS for s in states):
                raise RuntimeError(f"a child of the {self.mode} root lost the session: {states}")
            kids = 0
            for c in children:
                procs = (self.tree / (c.provider.env_id or "") / "cgroup.procs").read_text()
                kids += sum(cpu_ns(int(p)) for p in procs.split())
        finally:
            parallel([c.close for c in children])
        row = {k: (after[k] - before[k]) / 1e6 for k in before}
        row.update(children=kids / 1e6, wall_ms=wall, load1=load)
        return row

    def close(self) -> None:
        try:
            if self.client is not None:
                self.client.close()
        finally:
            stop_process(self.server.proc)
            remove_leftovers(self.server.state_dir)


def run(b: Bench) -> dict[str, dict[str, Any]]:
    rounds = int(b.profile.live_netns_rounds)
    sides: dict[str, Side] = {}
    rows: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    try:
        for mode in MODES:
            sides[mode] = Side(b, mode)
        b.settle(max_s=60)
        for r in range(rounds + 1):  # round 0 warms both up (first pairs, first rules)
            for mode in MODES if r % 2 == 0 else reversed(MODES):
                row = sides[mode].fork8()
                if r:
                    rows[mode].append(row)
                time.sleep(1.0)  # the children's teardown, off the next round's clock
    finally:
        for side in sides.values():
            side.close()
    out: dict[str, Any] = {"rounds": rounds, "cores": os.cpu_count()}
    for mode in MODES:
        parts = {k: summarize([row[k] for row in rows[mode]]) for k in rows[mode][0]}
        cpu = sum(parts[k]["median"] for k in WHO)
        out[mode] = {
            "fork8_wall_ms": parts["wall_ms"],
            "cpu_ms_per_fork8": {k: parts[k] for k in WHO},
            "cpu_per_child_ms": {"child": parts["children"]["median"] / 8, "all": cpu / 8},
            "load1": parts["load1"],
            "rows": rows[mode],
        }
    out["ratios"] = {
        "wall_on_over_off": ratio(
            out["on"]["fork8_wall_ms"]["median"], out["off"]["fork8_wall_ms"]["median"]
        ),
        "cpu_per_child_on_over_off": ratio(
            out["on"]["cpu_per_child_ms"]["all"], out["off"]["cpu_per_child_ms"]["all"]
        ),
    }
    return {"live_netns": out}
