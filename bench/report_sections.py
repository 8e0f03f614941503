"""The SUMMARY.md sections, one renderer per benchmark's result file, and the formatters.

Each renderer turns one ``results/<name>.json`` into Markdown lines; ``SECTIONS`` lists
them in the order SUMMARY.md shows them. Apart from ``report`` (which loads the results,
writes SUMMARY.md and the README's headline) so that adding a benchmark's table touches
this module only.

Not run on its own: bench.report writes SUMMARY.md with it
(``python -m bench --report-only``).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from . import report_isolation, report_trainer

Result = dict[str, Any]


def fmt_s(value: Any) -> str:
    """Seconds for people: '5.31 s', '245 ms', '1.20 ms'; '-' when missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    v = float(value)
    if abs(v) >= 1:
        return f"{v:.2f} s"
    if abs(v) >= 0.01:
        return f"{v * 1000:.0f} ms"
    return f"{v * 1000:.2f} ms"


def fmt_bytes(value: Any) -> str:
    if value is None:
        return "-"
    v = float(value)
    for unit in ("B", "KB", "MB", "GB"):
        if abs(v) < 1024 or unit == "GB":
            return f"{v:.0f} {unit}" if unit in ("B", "KB") else f"{v:.1f} {unit}"
        v /= 1024
    return f"{v:.1f} GB"


def fmt_x(value: Any) -> str:
    return "-" if value is None else f"{float(value):.1f}x"


def _start(r: Result) -> list[str]:
    ready, stop, ratios = r["ready"], r["stop"], r["ratios"]
    rows = [
        ("DenvProvider (egress deny, via ingress)", "denv"),
        ("OpenEnv LocalDockerProvider", "local"),
        ("floor: `docker run` to first 200 on /health", "floor"),
    ]
    lines = [
        "| start -> ready | median | p90 | runs | stop (median) | stop (max) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, key in rows:
        a, s = ready.get(key, {}), stop.get(key, {})
        lines.append(
            f"| {label} | {fmt_s(a.get('median'))} | {fmt_s(a.get('p90'))} | {a.get('n', 0)} "
            f"| {fmt_s(s.get('median'))} | {fmt_s(s.get('max'))} |"
        )
    lines += [
        "",
        "What each one waits for: DenvProvider, /health and a WebSocket session through the "
        "ingress proxy; LocalDockerProvider, a fixed 1 s sleep after `docker run`, then "
        "/health polled every 0.5 s (as shipped in OpenEnv); the floor, /health polled "
        "every 10 ms on a published port. Stop: DenvProvider deletes at once (SIGKILL); "
        "LocalDockerProvider runs `docker stop` (SIGTERM, 10 s grace) and `docker rm`.",
        "",
        "LocalDockerProvider / DenvProvider (median): "
        f"**{fmt_x(ratios['local_over_denv_median'])}**; "
        f"DenvProvider / floor: {fmt_x(ratios['denv_over_floor_median'])}; "
        f"LocalDockerProvider / floor: {fmt_x(ratios['local_over_floor_median'])}.",
    ]
    errors = [
        f"{k}: {row.get('error') or 'stop: ' + row['stop_error']}"
        for k, rows_ in r.get("runs", {}).items()
        for row in rows_
        if "error" in row or "stop_error" in row
    ]
    if errors:
        lines += ["", "Errors: " + "; ".join(errors[:5])]
    return lines


def _fork8(r: Result) -> list[str]:
    ready, ratios, n = r["ready"], r["ratios"], r["params"]["n"]
    lines = [
        f"| {n} ready branches (health + WebSocket) | median | p90 | runs "
        "| of which the server's fork call (median) |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, key in (
        (f"denv fork({n}), warm", "warm"),
        (f"denv fork({n}), cold", "cold"),
        ("one LocalDockerProvider cold start (same rounds)", "local"),
    ):
        a = ready.get(key, {})
        if key == "warm" and not r.get("warm_available"):
            lines.append(f"| {label} | not available | | 0 | |")
            continue
        server = r.get("server_fork", {}).get(key, {}).get("median")
        lines.append(
            f"| {label} | {fmt_s(a.get('median'))} | {fmt_s(a.get('p90'))} | {a.get('n', 0)} "
            f"| {fmt_s(server) if key != 'local' else ''} |"
        )
    lines += [
        "",
        f"One LocalDockerProvider start / fork({n}): cold "
        f"{fmt_x(ratios['local_over_fork8_cold_median'])}, warm "
        f"{fmt_x(ratios['local_over_fork8_warm_median'])} (target for warm: 20x, <= 250 ms).",
    ]
    return [*lines, "", *[f"- {n}" for n in r.get("notes", [])]]


def _fork(r: Result) -> list[str]:
    lines = [
        "| K steps | N branches | fork cold | fork warm | replay | replay / fork cold "
        "| replay / fork warm |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in r["table"]:
        lines.append(
            f"| {c['k']} | {c['n']} | {fmt_s(c['fork_cold'].get('median'))} "
            f"| {fmt_s(c['fork_warm'].get('median'))} | {fmt_s(c['replay'].get('median'))} "
            f"| {fmt_x(c['replay_over_fork_cold'])} | {fmt_x(c['replay_over_fork_warm'])} |"
        )
    p = r["params"]
    lines += ["", f"Medians of {p['reps']} run(s) per cell; replay = {p['replay']}."]
    return lines + [f"- {n}" for n in r.get("notes", [])]


def _snapshot(r: Result) -> list[str]:
    lines = [
        "| volume | changed since the env started | snapshot (median) |",
        "|---:|---:|---:|",
    ]
    for group in ("full_write", "by_volume_size", "by_changed_bytes"):
        for row in r[group]:
            if group == "by_changed_bytes" and row in r["by_volume_size"]:
                continue
            lines.append(
                f"| {fmt_bytes(row['volume_bytes'])} | {fmt_bytes(row['changed_bytes'])} "
                f"| {fmt_s(row.get('median'))} |"
            )
    return lines


def _latency(r: Result) -> list[str]:
    step, diff = r["step"], r["ingress_minus_direct_s"]
    lines = [
        "| WebSocket step | median | p90 | p99 | steps |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, key in (("direct (published port)", "direct"), ("ingress proxy", "ingress")):
        s = step[key]
        lines.append(
            f"| {label} | {fmt_s(s['median'])} | {fmt_s(s['p90'])} | {fmt_s(s['p99'])} | {s['n']} |"
        )
    lines.append(
        f"| ingress - direct | {fmt_s(diff['median'])} | {fmt_s(diff['p90'])} "
        f"| {fmt_s(diff['p99'])} | |"
    )
    return lines


def _density(r: Result) -> list[str]:
    m = r["memory_per_env_bytes"]
    return [
        f"- idle echo envs up at once: **{r['envs']}** (stopped at: {r['stopped_because']}); "
        f"{r['healthy_at_end']} of them answered /health at the end",
        f"- memory per env: {fmt_bytes(m['cgroup_usage'].get('median'))} (cgroup usage, median), "
        f"{fmt_bytes(m['cgroup_rss'].get('median'))} anonymous RSS; the host's MemAvailable "
        f"changed by {fmt_bytes(m['host_available_drop'])} per env (noisy when other work runs)",
        f"- at that size, free memory holds about {r['estimated_capacity_by_memory']} envs "
        "(MemAvailable before the run less a reserve of "
        f"{fmt_bytes(r['params']['reserve_bytes'])})",
        f"- booting all took {fmt_s(r['boot_all_s'])}, deleting all {fmt_s(r['delete_all_s'])}",
    ]


def _live(r: Result) -> list[str]:
    lines: list[str] = []
    f8 = r.get("fork8", {})
    if f8.get("ready"):
        n = f8["n"]
        lines += [
            f"| fork({n}) -> {n} clients that answered state() (WebSocket via ingress) | median "
            "| p90 "
            "| runs |",
            "|---|---:|---:|---:|",
        ]
        for key, label in (("live", "live fork"), ("warm", "warm volume fork (spares booted)")):
            x = f8["ready"].get(key, {})
            lines.append(
                f"| {label} | {fmt_s(x.get('median'))} | {fmt_s(x.get('p90'))} | {x.get('n', 0)} |"
            )
        lines += [
            "",
            f"warm / live (median): **{fmt_x(f8['ratios']['warm_over_live_median'])}**; "
            f"children's state equal to the root's: {f8.get('state_ok')}.",
            "",
        ]
    sd = r.get("seed", {})
    if sd.get("eight_forks_s"):
        t = sd["eight_forks_s"]
        lines += [
            f"The seed's usage as written on `{sd['image']}` with `DenvProvider()`'s defaults "
            f"(8 x `root.provider.fork()` until each child answered state()): median "
            f"**{t['default']['median']:.2f} s** for all 8 (starts: "
            f'{", ".join(sd["starts"]["default"])}); with `fork="volume"` '
            f"{t['volume']['median']:.1f} s ({', '.join(sd['starts']['volume'])}): "
            f"{fmt_x(sd['ratios']['volume_over_default_median'])}; state kept: {sd['state_ok']}.",
            "",
        ]
    c = r.get("cpu", {})
    if c.get("ms_per_fork8"):
        parts = ", ".join(f"{k} {v['median']:.0f} ms" for k, v in c["ms_per_fork8"].items())
        lines += [
            f"CPU of one live fork(8) to 8 clients that answered state() (median by part): "
            f"{parts}; **{c['total_ms_median']:.0f} ms** in all, so no schedule on "
            f"{c['cores']} cores finishes it in less than **{c['floor_ms']:.0f} ms**.",
            "",
        ]
    s = r.get("sustained", {})
    if s.get("per_s") is not None:
        lines.append(
            f"Sustained: **{s['per_s']:.0f} live children/s** over {s['seconds']:.0f} s "
            f"({s['children']} children; target >= 100/s)."
        )
    s2 = r.get("sustained2", {})
    if s2.get("per_s") is not None:
        lines.append(
            f"With two clients forking two roots at once: **{s2['per_s']:.0f} live "
            f"children/s** over {s2['seconds']:.0f} s ({s2['children']} children)."
        )
    m = r.get("memory", {})
    if m.get("child_mb"):
        lines.append(
            f"Private memory of a live child after one step: median "
            f"**{m['child_mb']['median']:.1f} MB** (max {m['child_mb']['max']:.1f} MB; target "
            f"<= 30 MB); the root: {m['root_mb']:.1f} MB."
        )
    for part, x in r.items():
        if isinstance(x, dict) and "error" in x:
            lines.append(f"- {part}: {x['error']}")
    return lines


def _live_tree(r: Result) -> list[str]:
    lines: list[str] = []
    t = r
    if t.get("live"):
        lines += [
            f"Tree search, branching {t['branching']}, depth {t['depth']} "
            f"({t['live']['envs']} envs, a fork at every inner node, a step in every node):",
            "",
            "| by | time |",
            "|---|---:|",
        ]
        for key in ("live", "warm", "replay"):
            if key in t:
                lines.append(f"| {key} | {fmt_s(t[key]['s'])} |")
        lines += [
            "",
            f"warm / live: **{fmt_x(t['ratios']['warm_over_live'])}** (target >= 20x); "
            f"replay / live: **{fmt_x(t['ratios']['replay_over_live'])}** (target >= 50x).",
            "",
        ]
    return lines


def _zygote(r: Result) -> list[str]:
    ready, ratios = r["ready"], r["ratios"]
    rows = [
        ("a copy of the key's zygote (`DenvProvider()`'s default)", "zygote"),
        ('a warm spare (`fork="volume", warm_fork=True`)', "warm"),
        ('a boot (`fork="volume"`, no spare)', "boot"),
    ]
    lines = [
        "| `start_container` -> `reset()` answered | median | p90 | runs |",
        "|---|---:|---:|---:|",
    ]
    for label, key in rows:
        a = ready.get(key, {})
        lines.append(
            f"| {label} | {fmt_s(a.get('median'))} | {fmt_s(a.get('p90'))} | {a.get('n', 0)} |"
        )
    one, many = r["sustained"], r["sustained_parallel"]
    target = r["target_sustained_per_s"]
    lines += [
        "",
        f"boot / zygote (median): **{fmt_x(ratios['boot_over_zygote_median'])}**; "
        f"zygote: {r['zygote_median_ms']:.0f} ms (target <= {r['target_zygote_median_ms']} "
        f"ms); the image's first start (a boot, which leaves the zygote): "
        f"{r['first_start_s']:.2f} s.",
        "",
        f"Sustained zygote starts to `reset()` answered: **{one['per_s']}/s** over "
        f"{one['seconds']:.0f} s with one client ({one['starts']} starts), "
        f"**{many['per_s']}/s** with {many['clients']} clients at once (target >= {target}/s).",
        "",
    ]
    missed = dict(Counter(one.get("not_copies", {})) + Counter(many.get("not_copies", {})))
    if missed:
        said = r.get("zygote_warnings") or ["(nothing in its log)"]
        lines += [
            f"**Starts of the sustained runs that were not copies of the zygote: {missed}.** "
            f"The server said: `{said[0][-300:]}`",
            "",
        ]
    elif "not_copies" in one:
        lines += ["Every start of the sustained runs was a copy of the zygote.", ""]
    return lines


def _live_density(r: Result) -> list[str]:
    """One run of bench/live_density.py: as served by default, or with ``--merge-pages``
    (then the figures after ksmd's scans too)."""
    p = r["private_bytes"]
    lines = [
        f"- {r['stepped']} of {r['n']} live echo envs at once answered a WebSocket step "
        f"through ingress; all forked in {fmt_s(r['fork_all_s'])} (root boot "
        f"{fmt_s(r['root_boot_s'])}), deleted in {fmt_s(r['delete_all_s'])}",
        f"- private memory each (USS) after the step: median {fmt_bytes(p['uss_median'])}, "
        f"p90 {fmt_bytes(p['uss_p90'])}, max {fmt_bytes(p['uss_max'])}; total "
        f"{fmt_bytes(p['uss_total'])}; {r['over_15mb']} over 15 MB; MemAvailable fell by "
        f"{fmt_bytes(r['mem_available_drop_bytes'])}",
    ]
    m = r.get("merged")
    if m:
        q = m["private_bytes"]
        lines += [
            f"- after {m['scans']} full scans of ksmd ({m['pages_to_scan']} pages a wake-up; "
            f"{fmt_s(m['merge_s'])}, {m['ksmd_cpu_s']:.1f} s of its CPU): median "
            f"{fmt_bytes(q['uss_median'])}, p90 {fmt_bytes(q['uss_p90'])}, max "
            f"{fmt_bytes(q['uss_max'])}; total {fmt_bytes(q['uss_total'])}; {m['over_15mb']} "
            f"over 15 MB; MemAvailable fell by {fmt_bytes(m['mem_available_drop_bytes'])} in all",
            f"- after merging: {m['restepped']} of {m['restep_sample']} envs stepped again; a "
            f"fork of 8 from the merged root took {fmt_s(m['fork8_s'])} (the run's fork "
            f"requests of {r['batch']} before: median {fmt_s(m['fork8_request_s_before_median'])})",
        ]
    left = r.get("left", {})
    lines.append(
        f"- left after the deletes: {len(left.get('containers', []))} containers, "
        f"{len(left.get('cgroups', []))} cgroups, {len(left.get('mounts', []))} mounts"
    )
    return lines


def _shapes(r: Result) -> list[str]:
    lines = [
        "| server shape | forks | denv start -> `reset()` (median) | LocalDocker | "
        "LocalDocker / denv | fork(4) to 4 `state()` (median) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for shape, row in r["shapes"].items():
        kinds = ", ".join(row.get("fork4_kinds") or []) or "-"
        lines.append(
            f"| {shape} | {kinds} | {fmt_s(row['denv_start'].get('median'))} | "
            f"{fmt_s(row['local_start'].get('median'))} | "
            f"{fmt_x(row.get('local_over_denv_start_median'))} | "
            f"{fmt_s(row['fork4'].get('median'))} |"
        )
    lines += [
        "",
        f"{r['rounds']} rounds per shape, alternating; denv's first start of each shape boots "
        "and the later ones copy its zygote (`denv_starts` in the file).",
    ]
    return lines


SECTIONS = [
    ("start", "Start -> ready and stop", _start),
    ("fork8", "fork(n) of a live env against one cold start", _fork8),
    ("fork", "Fork against replay", _fork),
    ("snapshot", "Snapshot cost: follows the change, not the volume", _snapshot),
    ("latency", "Per-step latency: published port against the ingress proxy", _latency),
    ("density", "Density", _density),
    *report_trainer.SECTIONS,
    ("live", "Live forks: a running server copied, memory included", _live),
    ("zygote_start", "Starts from a booted image (zygotes)", _zygote),
    ("shapes", "Server shapes of real envs: start and fork(4), beside LocalDocker", _shapes),
    *report_isolation.SECTIONS,
    ("live_tree", "Tree search: live forks, warm volume forks, replay", _live_tree),
    ("live_density", "Live envs at once", _live_density),
    ("live_density_merged", "Live envs at once, with `denv serve --merge-pages`", _live_density),
]
