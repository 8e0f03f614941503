"""What same-page merging (``denv serve --merge-pages``) does to the live root: its huge
pages (what makes a fork cheap: docs/live-forks.md) and the forks made from it afterwards.

Runs one server of this checkout with ``--merge-pages`` and a live root of the echo image
that answered one step, with ``ksmd`` paused; then ``--rounds`` fork(8)s, each child stepped
once and deleted (forks before merging); then ``--keep`` children stepped and kept while
``ksmd`` makes ``--scans`` full scans, and ``ksmd`` paused again, ``--rounds`` fork(8)s
(after merging).
Reports the root's private memory and ``AnonHugePages`` at each point, the kept children's
private memory, and the fork times on each side. The host's KSM settings are put back. Run
as root from a checkout: `.venv/bin/python bench/live_fork_probe/p14_merge_root.py`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.harness import remove_leftovers, start_server, stop_process  # noqa: E402
from bench.live_density import (  # noqa: E402
    KSM,
    KSM_SETTINGS,
    container_pid,
    ksm_read,
    ksm_write,
    ksmd_cpu_s,
    private_bytes,
    server_flags,
    step_once,
)
from denv import Denv  # noqa: E402
from denv.server.docker.live import cgroups as live_apart  # noqa: E402

MB = 2**20


def root_memory(pid: int) -> dict[str, float]:
    """The root's private memory and its anonymous huge pages, in MB."""
    huge = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            huge = int(line.split()[1]) * 1024
    return {"uss_mb": round(private_bytes(pid) / MB, 1), "anon_huge_mb": round(huge / MB, 1)}


def forks(api: Denv, root_id: str, rounds: int) -> list[float]:
    """``rounds`` fork(8)s, each to 8 healthy children (timed), stepped once and deleted."""
    times = []
    for r in range(rounds):
        t0 = time.perf_counter()
        envs = api.fork(root_id, 8, kind="live", wait="healthy").envs
        times.append(time.perf_counter() - t0)
        for env in envs:
            step_once(str(env.endpoints[0].url), f"round {r}")
        for env in envs:
            api.delete_env(env.id)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--keep", type=int, default=16, help="children kept while merging")
    parser.add_argument("--scans", type=int, default=3)
    parser.add_argument("--image", default="denv-echo-env:latest")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    saved = {name: (KSM / name).read_text().strip() for name in KSM_SETTINGS}
    state = Path("/tmp/denv-p14")
    server = start_server(state, (*server_flags(args.keep + 16), "--merge-pages"))
    api = Denv(server.url, api_key=server.api_key)
    out: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    ids: list[str] = []
    try:
        ksm_write("run", 0)  # paused until the kept children are stepped
        root = api.create_sandbox(args.image, ports=[8000], live=True, wait="healthy")
        ids.append(root.id)
        step_once(str(root.endpoints[0].url), "root")
        group = live_apart.group_of(container_pid(root.id))
        pid = int((group.directory(root.id) / "cgroup.procs").read_text().split()[0])
        out["root_start"] = root_memory(pid)
        out["fork8_before_s"] = forks(api, root.id, args.rounds)
        out["root_after_forks"] = root_memory(pid)
        kept = api.fork(root.id, args.keep, kind="live", wait="healthy").envs
        ids += [e.id for e in kept]
        for env in kept:
            step_once(str(env.endpoints[0].url), "kept")

        def kids_mb() -> float:
            return round(
                statistics.median(
                    private_bytes(int(p)) / MB
                    for e in kept
                    for p in (group.directory(e.id) / "cgroup.procs").read_text().split()[:1]
                ),
                1,
            )

        out["children_before_merge_mb"] = kids_mb()
        scans0, cpu0, t0 = ksm_read("full_scans"), ksmd_cpu_s(), time.perf_counter()
        ksm_write("pages_to_scan", 4000)
        ksm_write("sleep_millisecs", 20)
        ksm_write("run", 1)
        while ksm_read("full_scans") < scans0 + args.scans:
            time.sleep(0.5)
        ksm_write("run", 0)  # merged pages stay merged; no ksmd beside the timed forks
        out["merge_s"] = round(time.perf_counter() - t0, 1)
        out["ksmd_cpu_s"] = round(ksmd_cpu_s() - cpu0, 1)
        out["children_after_merge_mb"] = kids_mb()
        out["root_after_merge"] = root_memory(pid)
        out["fork8_after_s"] = forks(api, root.id, args.rounds)
        out["root_at_end"] = root_memory(pid)
        for side in ("before", "after"):
            out[f"fork8_{side}_median_s"] = round(statistics.median(out[f"fork8_{side}_s"]), 3)
    finally:
        for env_id in reversed(ids):
            api.delete_env(env_id)
        api.close()
        stop_process(server.proc)
        remove_leftovers(state)
        for name in KSM_SETTINGS:
            ksm_write(name, saved[name])
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
