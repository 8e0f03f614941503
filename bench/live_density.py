"""Live density (issue 24 item 7): N live envs of the echo image at once, each answering a
WebSocket step through ingress, each's private memory, and nothing left once they are deleted.

The envs are live forks of one booted root (``fork(kind="live")``, at most ``count=32`` per
request): every one a copy of the root's running server, in its own cgroups and behind its
own port rule, in the root's container. Measured:

- ``fork_all_s``: from the first fork request to the last child serving (the root's boot is
  ``root_boot_s``, apart);
- each env's **private memory** after its step: the sum of ``Private_Clean`` and
  ``Private_Dirty`` in ``/proc/PID/smaps_rollup`` (its USS) over the processes in its own
  cgroup, and what its memory cgroup (v1) was charged; the host's ``MemAvailable`` drop;
- the step: one OpenEnv ``GenericEnvClient`` per env over its ingress URL (connect, ``step``,
  close), ``STEP_THREADS`` at a time;
- what the denv server held at the peak (threads, file descriptors, resident memory);
- after every env is deleted: the server's containers, cgroups and mounts left (none expected).

The benchmark runs it twice, side by side: as served by default, then on a server started
with ``--merge-pages`` (the kernel's same-page merging, docs/live-forks.md). That second run
keeps ``ksmd`` paused while it forks and steps (its first measures are of the same copies as
the first run's), then lets it run ``MERGE_SCANS`` full scans at ``MERGE_PACE`` pages a
wake-up and measures again (``merged``): private memory, ``MemAvailable``, ``ksmd``'s CPU,
a sample of envs stepped again and a fork of 8 from the merged root. The host's KSM
settings are put back afterwards.

Used by ``python -m bench --only live_density`` (its own server, with the per-key caps raised
by flags) and, at smaller counts, by tests/reliability/test_density.py.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from openenv.core import GenericEnvClient

from denv import Denv

from .harness import Bench, remove_leftovers, start_server, stop_process
from .live_cgroups import Group, container_pid, group_of

log = logging.getLogger("bench.live_density")

BATCH = 32  # the API's most children per fork request
KSM = Path("/sys/kernel/mm/ksm")
KSM_SETTINGS = ("pages_to_scan", "sleep_millisecs", "run")  # put back in this order
MERGE_SCANS = 3  # a page is merged on the scan after the one that first saw its twin
MERGE_PACE = 4000  # pages per ksmd wake-up (every 20 ms): ~1 core at ~4 µs a page
MERGE_TIMEOUT_S = 1800
RESTEP_SAMPLE = 64
STEP_THREADS = 16
MB = 1024 * 1024


def server_flags(n: int) -> tuple[str, ...]:
    """What a server must be given to hold ``n`` live envs of one key (its per-key caps)."""
    return (
        *("--max-envs-per-key", str(n + 16)),  # the root, 8 forked after merging
        *("--max-creates-per-key", "0", "--max-starting-per-key", "0"),
        *("--max-ingress-per-key", "0", "--max-leases-per-key", "0"),
        # The parent's own memory cgroup is charged ~5.5 MB per live child it forked (the
        # pages a child writes before the node moves it into its cgroup, and its page
        # tables; kernels since 6.13 no longer move charges): 2 GiB holds ~300 children.
        *("--env-memory", str(max(2048, 256 + n * 8))),
        "--no-zygotes",
    )


def private_bytes(pid: int) -> int:
    """A process's unique set size: the pages only it maps (smaps_rollup Private_*)."""
    total = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:", "Private_Hugetlb:")):
            total += int(line.split()[1]) * 1024
    return total


def env_memory(group: Group, env_id: str) -> dict[str, int]:
    """``uss``: the private memory of the processes in the env's cgroup; ``cgroup``: what
    its v1 memory cgroup was charged (where the host has one), less inactive file cache."""
    pids = [int(p) for p in (group.directory(env_id) / "cgroup.procs").read_text().split()]
    out = {"uss": sum(private_bytes(p) for p in pids), "processes": len(pids)}
    memory = group.memory(env_id)
    if memory is not None:
        usage = int((memory / "memory.usage_in_bytes").read_text())
        stat = dict(line.split() for line in (memory / "memory.stat").read_text().splitlines())
        out["cgroup"] = usage - int(stat.get("total_inactive_file", 0))
    return out


def process_status(pid: int) -> dict[str, int]:
    """Threads, open file descriptors and resident memory (bytes) of a process."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return {
        "threads": int(fields["Threads"]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "rss_bytes": int(fields["VmRSS"].split()[0]) * 1024,
    }


MEMINFO = (
    "MemAvailable",
    "AnonPages",
    "PageTables",
    "KernelStack",
    "Slab",
    "SUnreclaim",
    "Buffers",
    "Cached",
    "Shmem",
)


def meminfo() -> dict[str, int]:
    """The host's /proc/meminfo fields of ``MEMINFO``, in bytes."""
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in MEMINFO:
            out[name] = int(value.split()[0]) * 1024
    return out


def idle_wakeups(group: Group, env_ids: list[str], seconds: float = 2.0) -> float:
    """How often an idle live env's server wakes, per second (the median over ``env_ids``):
    the kernel's count of times its main thread ran (``/proc/PID/schedstat``)."""

    def runs() -> dict[str, int]:
        out = {}
        for env_id in env_ids:
            pid = (group.directory(env_id) / "cgroup.procs").read_text().split()[0]
            out[env_id] = int(Path(f"/proc/{pid}/schedstat").read_text().split()[2])
        return out

    before = runs()
    time.sleep(seconds)
    after = runs()
    rates = sorted((after[e] - before[e]) / seconds for e in env_ids)
    return rates[len(rates) // 2] if rates else 0.0


def mem_available() -> int:
    return meminfo()["MemAvailable"]


def step_once(url: str, message: str) -> str:
    """One OpenEnv client session on ``url``: connect, step, close; the echoed message."""
    with GenericEnvClient(base_url=url).sync() as env:
        result = env.step({"message": message})
    return str(result.observation["echoed_message"])


def _step_or_error(url: str, message: str, errors: list[str]) -> str:
    try:
        return step_once(url, message)
    except Exception as exc:  # counted as not stepped; the first few kept
        errors.append(f"{type(exc).__name__}: {exc}")
        return ""


def memory_of(group: Group, root_id: str, env_ids: list[str]) -> dict[str, Any]:
    """``private_bytes``: the envs' private memory (median, p90, max, total) and the
    root's; ``over_15mb``: how many envs hold more."""
    mem = {env_id: env_memory(group, env_id) for env_id in env_ids}
    out: dict[str, Any] = {}
    try:
        root_now: dict[str, int] = env_memory(group, root_id)
    except OSError:  # its process ended (its cgroup went with it)
        root_now, out["root_ended"] = {}, True
    uss = sorted(m["uss"] for m in mem.values())
    out["private_bytes"] = {
        "uss_median": uss[len(uss) // 2],
        "uss_p90": uss[int(len(uss) * 0.9)],
        "uss_max": uss[-1],
        "uss_total": sum(uss),
        "cgroup_median": sorted(m.get("cgroup", 0) for m in mem.values())[len(uss) // 2],
        "root_uss": root_now.get("uss"),
        "root_cgroup_after": root_now.get("cgroup"),
        "processes_per_env_max": max(m["processes"] for m in mem.values()),
    }
    out["over_15mb"] = sum(u > 15 * MB for u in uss)
    return out


def ksm_read(name: str) -> int:
    return int((KSM / name).read_text().split()[0])


def ksm_write(name: str, value: int | str) -> None:
    (KSM / name).write_text(f"{value}\n")


def ksmd_cpu_s() -> float:
    """The CPU time ``ksmd`` (a kernel thread) has used, in seconds."""
    pid = subprocess.run(["pgrep", "-x", "ksmd"], capture_output=True, text=True, check=True)
    fields = Path(f"/proc/{pid.stdout.split()[0]}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def merge_and_measure(group: Group, root_id: str, children: dict[str, str]) -> dict[str, Any]:
    """Let ``ksmd`` (paused until now) make ``MERGE_SCANS`` full scans at ``MERGE_PACE``;
    then the envs' private memory again, what merging took, and a sample stepped again
    (a merged page is read-only: a write gets a copy of its own)."""
    scans0, cpu0, t0 = ksm_read("full_scans"), ksmd_cpu_s(), time.perf_counter()
    ksm_write("pages_to_scan", MERGE_PACE)
    ksm_write("sleep_millisecs", 20)
    ksm_write("run", 1)
    while ksm_read("full_scans") < scans0 + MERGE_SCANS:
        if time.perf_counter() - t0 > MERGE_TIMEOUT_S:
            raise RuntimeError(f"ksmd made no {MERGE_SCANS} full scans in {MERGE_TIMEOUT_S}s")
        time.sleep(1)
    out: dict[str, Any] = {
        "scans": MERGE_SCANS,
        "pages_to_scan": MERGE_PACE,
        "merge_s": time.perf_counter() - t0,
        "ksmd_cpu_s": ksmd_cpu_s() - cpu0,
        **{name: ksm_read(name) for name in ("pages_shared", "pages_sharing", "pages_unshared")},
    }
    out.update(memory_of(group, root_id, list(children)))
    out["mem_available_bytes"] = mem_available()  # before the steps below copy pages again
    errors: list[str] = []
    sample = list(children.items())[:RESTEP_SAMPLE]
    with ThreadPoolExecutor(STEP_THREADS) as pool:
        echoed = pool.map(lambda item: _step_or_error(item[1], f"{item[0]}+", errors), sample)
        out["restepped"] = sum(e == f"{i}+" for e, (i, _) in zip(echoed, sample, strict=True))
    out["restep_sample"], out["restep_errors"] = len(sample), errors[:5]
    return out


def run(
    api: Denv,
    image: str,
    n: int,
    server_pid: int | None = None,
    progress: Callable[[str], None] = log.info,
    merge: bool = False,
) -> dict[str, Any]:
    """Start ``n`` live envs, step each, measure, delete them all; the measures. Deletes
    whatever it started, also when it fails. ``merge``: the server was started with
    ``--merge-pages``; ``ksmd`` is paused until the envs are measured, then merges
    (``merge_and_measure``); the caller puts the host's KSM settings back."""
    if merge:
        ksm_write("run", 0)
    info0 = meminfo()
    avail0 = info0["MemAvailable"]
    reserve = max(2 * 1024 * MB, avail0 // 10)  # stop before the machine runs short
    root_id: str | None = None
    children: dict[str, str] = {}  # env id -> ingress URL
    out: dict[str, Any] = {"n": n, "batch": BATCH, "step_threads": STEP_THREADS}
    try:
        t0 = time.perf_counter()
        root = api.create_sandbox(image, ports=[8000], live=True, wait="healthy")
        root_id = root.id
        out["root_boot_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        step_once(str(root.endpoints[0].url), "root")  # the children continue a served session
        out["root_step_s"] = time.perf_counter() - t0
        group = group_of(container_pid(root_id))
        root_charged = env_memory(group, root_id).get("cgroup")
        forks: list[float] = []
        t0 = time.perf_counter()
        while len(children) < n:
            if mem_available() < reserve:
                out["stopped_because"] = f"MemAvailable fell under {reserve >> 20} MiB"
                break
            count = min(BATCH, n - len(children))
            t1 = time.perf_counter()
            try:
                fork = api.fork(root_id, count, kind="live", wait="healthy")
            except Exception as exc:  # measure the envs that are up; say why there are no more
                out["stopped_because"] = f"a fork failed: {type(exc).__name__}: {exc}"
                log.warning("live density: %s", out["stopped_because"])
                break
            forks.append(time.perf_counter() - t1)
            for env in fork.envs:
                children[env.id] = str(env.endpoints[0].url)
            bad = [e.id for e in fork.envs if e.status != "healthy"]
            if bad:
                raise RuntimeError(f"fork gave children that are not healthy: {bad[:5]}")
            if len(forks) % 8 == 0:
                progress(f"live density: {len(children)} envs ({forks[-1]:.2f}s for the last fork)")
        out["fork_all_s"] = time.perf_counter() - t0
        out["envs"] = len(children)
        if not children:
            raise RuntimeError(f"live density: no env was forked ({out.get('stopped_because')})")
        out["idle_wakeups_per_s"] = idle_wakeups(group, list(children)[:16])
        out["root_cgroup_bytes"] = {"before_forks": root_charged}
        out["fork_request_s"] = forks
        out["mem_available_drop_after_forks_bytes"] = avail0 - mem_available()

        t0 = time.perf_counter()
        items, stepped = list(children.items()), 0
        errors: list[str] = []
        with ThreadPoolExecutor(STEP_THREADS) as pool:
            for start in range(0, len(items), 4 * BATCH):
                if mem_available() < reserve:
                    out["stopped_because"] = f"MemAvailable fell under {reserve >> 20} MiB"
                    break
                chunk = items[start : start + 4 * BATCH]
                echoed = pool.map(lambda item: _step_or_error(item[1], item[0], errors), chunk)
                stepped += sum(e == i for e, (i, _) in zip(echoed, chunk, strict=True))
        out["step_all_s"] = time.perf_counter() - t0
        out["stepped"] = stepped
        out["step_errors"] = errors[:5]
        progress(f"live density: {out['stepped']} of {n} envs answered a step")

        out.update(memory_of(group, root_id, list(children)))
        if out.get("root_ended"):
            merge = False  # nothing left to fork from: the merged figures would mislead
        info1 = meminfo()
        out["mem_available_drop_bytes"] = avail0 - info1["MemAvailable"]
        out["meminfo_growth_bytes"] = {k: info1[k] - info0[k] for k in MEMINFO}
        if server_pid is not None:
            out["server_at_peak"] = process_status(server_pid)
        container = process_status(group.pid)
        out["container_pid1"] = container
        if merge:
            progress(f"live density: merging ({MERGE_SCANS} full scans of ksmd)")
            out["merged"] = merged = merge_and_measure(group, root_id, children)
            merged["mem_available_drop_bytes"] = avail0 - merged.pop("mem_available_bytes")
            t1 = time.perf_counter()
            extra = api.fork(root_id, 8, kind="live", wait="healthy").envs
            merged["fork8_s"] = time.perf_counter() - t1
            merged["fork8_request_s_before_median"] = sorted(forks)[len(forks) // 2]
            for env in extra:
                children[env.id] = str(env.endpoints[0].url)
            merged["fork8_healthy"] = sum(e.status == "healthy" for e in extra)
    finally:
        t0 = time.perf_counter()
        ids = [*children, *([root_id] if root_id else [])]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(api.delete_env, ids))
        out["delete_all_s"] = time.perf_counter() - t0
    return out


def bench(b: Bench) -> dict[str, dict[str, Any]]:
    """``python -m bench --only live_density``: the run above on a server of its own, with
    the caps raised for ``b.profile.live_density_n`` envs, then again with
    ``--merge-pages`` (unless the profile leaves it out: ``live_density_merged``); after
    each, what that server left."""
    n = int(b.profile.live_density_n)
    variants = [("live_density", False)]
    if b.profile.live_density_merged:
        variants.append(("live_density_merged", True))
    else:
        log.info("live density: the merged run is not in the %s profile", b.profile.name)
    saved = {name: (KSM / name).read_text().strip() for name in KSM_SETTINGS}
    results = {}
    try:
        for name, merge in variants:
            state = Path(f"{b.server.state_dir}-{name}")
            flags = (*server_flags(n), *(["--merge-pages"] if merge else []))
            server = start_server(state, flags)
            try:
                api = Denv(server.url, server.api_key, timeout_s=600)
                try:
                    result = run(api, b.image, n, server.proc.pid, merge=merge)
                finally:
                    api.close()
                time.sleep(2)  # deletes answered; the container's removal may be in flight
                result["left"] = _left(server.instance, state)
            finally:
                stop_process(server.proc)
                remove_leftovers(state)
            result["server_flags"] = list(flags)
            results[name] = result
    finally:
        for name in KSM_SETTINGS:
            ksm_write(name, saved[name])
    return results


def _left(instance: str, state: Path) -> dict[str, list[str]]:
    """The server's containers, key cgroups and mounts under its state dir that remain."""
    ps = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=denv.instance={instance}"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    cgroups = sorted(str(p) for p in Path("/sys/fs/cgroup").glob(f"*/denv-{instance}-*"))
    root = str(state.resolve()) + "/"
    with open("/proc/self/mountinfo") as f:
        mounts = [ln.split()[4] for ln in f if ln.split()[4].startswith(root)]
    pool = [m for m in mounts if "/volfs/pool/" in m]  # emptied filesystems kept for reuse
    return {
        "containers": ps,
        "cgroups": cgroups,
        "mounts": [m for m in mounts if m not in pool],
        "pooled_filesystems": [f"{len(pool)} emptied, kept mounted for reuse"] if pool else [],
    }
