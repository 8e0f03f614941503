"""Where a live child's private memory goes: per mapping (the heap, anonymous mappings, each
shared object's writable pages, stacks), after its step, after it idles, and with more
siblings forked later (the live-density row measured 17.2 MB per env at 1,000 envs and the
live bench 9.8 MB at 8).

Runs one server of this checkout (`bench.harness.start_server`), a live root of the echo
image that answered one step, then ``--batches`` forks of ``--batch`` children, each child
stepped once through ingress; then each child's USS (smaps Private_*) by mapping, at once
and after ``--idle`` seconds. Run as root from a checkout:
`.venv/bin/python bench/live_fork_probe/p13_child_memory.py`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.harness import remove_leftovers, start_server, stop_process  # noqa: E402
from bench.live_density import container_pid, server_flags, step_once  # noqa: E402
from denv import Denv  # noqa: E402
from denv.server.docker.live import cgroups as live_apart  # noqa: E402

KB = 1024


def regions(pid: int) -> dict[str, tuple[str, int]]:
    """Private bytes of ``pid`` per mapping, by its address range: {range: (name, bytes)},
    the name [heap], [anon], [stack] or the mapped file's."""
    out: dict[str, tuple[str, int]] = {}
    key, name = "", "?"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and ":" not in head[0]:
            key, name = head[0], (head[5].rsplit("/", 1)[-1] if len(head) > 5 else "[anon]")
            out[key] = (name, 0)
        elif line.startswith(("Private_Clean:", "Private_Dirty:")):
            out[key] = (name, out[key][1] + int(head[1]) * KB)
    return out


def by_mapping(pids: list[int]) -> dict[str, int]:
    """Private bytes of the processes ``pids`` together, per mapping name."""
    out: dict[str, int] = defaultdict(int)
    for pid in pids:
        for name, size in regions(pid).values():
            out[name] += size
    return dict(out)


def growth(
    before: dict[str, tuple[str, int]],
    after: dict[str, tuple[str, int]],
    root: dict[str, tuple[str, int]],
) -> dict[str, int]:
    """Where a child's private bytes grew: in mappings it inherited from the root (copies on
    write, or the root's free space used) or in mappings made since (fresh memory)."""
    out: dict[str, int] = defaultdict(int)
    for key, (name, size) in after.items():
        grew = size - before.get(key, (name, 0))[1]
        if grew:
            where = "inherited" if key in root else "new"
            out[f"{where} {name}"] += grew
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def pids_of(group: live_apart.Group, env_id: str) -> list[int]:
    return [int(p) for p in (group.directory(env_id) / "cgroup.procs").read_text().split()]


def measure(group: live_apart.Group, envs: list[str]) -> dict[str, Any]:
    maps = [by_mapping(pids_of(group, e)) for e in envs]
    totals = sorted(sum(m.values()) for m in maps)
    keys = {k for m in maps for k in m}
    per_map = {k: statistics.median(m.get(k, 0) for m in maps) for k in keys}
    top = sorted(per_map.items(), key=lambda kv: -kv[1])[:12]
    return {
        "uss_median_mb": round(totals[len(totals) // 2] / 2**20, 2),
        "uss_min_mb": round(totals[0] / 2**20, 2),
        "uss_max_mb": round(totals[-1] / 2**20, 2),
        "by_mapping_median_kb": {k: round(v / KB) for k, v in top},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--root-steps", type=int, default=1, help="sessions stepped on the root")
    parser.add_argument("--idle", type=float, default=60)
    parser.add_argument("--image", default="denv-echo-env:latest")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--env", action="append", default=[], help="KEY=VALUE for the root's environment"
    )
    parser.add_argument("--merge-pages", action="store_true", help="the server's flag (KSM)")
    args = parser.parse_args()
    n = args.batch * args.batches
    state = Path("/tmp/denv-p13")
    server = start_server(state, (*server_flags(n), *(["--merge-pages"] * args.merge_pages)))
    api = Denv(server.url, api_key=server.api_key)
    envs: list[str] = []
    out: dict[str, Any] = {
        "batch": args.batch,
        "batches": args.batches,
        "root_steps": args.root_steps,
    }
    try:
        env_vars = dict(kv.split("=", 1) for kv in args.env)
        root = api.create_sandbox(
            args.image, ports=[8000], live=True, wait="healthy", env=env_vars or None
        )
        envs_root = root.id
        envs.append(root.id)
        for i in range(args.root_steps):
            step_once(str(root.endpoints[0].url), f"root {i}")
        group = live_apart.group_of(container_pid(root.id))
        out["root_after_step"] = measure(group, [envs_root])
        first: list[str] = []
        for b in range(args.batches):
            fork = api.fork(root.id, args.batch, kind="live", wait="healthy")
            ids = [e.id for e in fork.envs]
            out[f"batch{b}_before_step"] = measure(group, ids)
            one = pids_of(group, ids[0])[0]
            root_map, before = regions(pids_of(group, root.id)[0]), regions(one)
            for e in fork.envs:
                step_once(str(e.endpoints[0].url), e.id)
            out[f"batch{b}_after_step"] = measure(group, ids)
            out[f"batch{b}_step_growth_kb"] = {
                k: v // KB for k, v in growth(before, regions(one), root_map).items() if v > 64 * KB
            }
            envs += ids
            if b == 0:
                first = ids
        out["root_after_forks"] = measure(group, [envs_root])
        time.sleep(args.idle)
        out["first_batch_after_idle"] = measure(group, first)
        out["all_after_idle"] = measure(group, envs[1:])
        out["root_after_idle"] = measure(group, [envs_root])
        print(json.dumps(out, indent=1))
        if args.out:
            args.out.write_text(json.dumps(out, indent=1) + "\n")
    finally:
        for env_id in envs:
            api.delete_env(env_id)
        stop_process(server.proc)
        remove_leftovers(server.state_dir)


if __name__ == "__main__":
    main()
