"""results/*.json -> results/SUMMARY.md and PNG plots (python -m bench --report-only)."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from . import report_trainer

log = logging.getLogger("bench.report")

Result = dict[str, Any]


def _load(out: Path) -> dict[str, Result]:
    found: dict[str, Result] = {}
    for path in sorted(out.glob("*.json")):
        try:
            found[path.stem] = json.loads(path.read_text())
        except ValueError as exc:
            log.warning("skipping %s: %s", path, exc)
    return found


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


def max_load(results: dict[str, Result]) -> float:
    """The highest 1-minute load average seen when any of the benchmarks began."""
    loads = [
        float((r.get("conditions", {}).get("before", {}).get("loadavg") or [0.0])[0])
        for r in results.values()
    ]
    return max(loads, default=0.0)


def busy_warning(results: dict[str, Result]) -> str | None:
    """A warning when the machine was busier than its cores when a benchmark began."""
    load = max_load(results)
    cores = next(iter(results.values()), {}).get("machine", {}).get("cores") or 1
    if float(load) <= float(cores):
        return None
    return (
        f"**Noisy run**: load average up to {load} on {cores} cores (other work was "
        "running); the ratios are rough and small samples can flip them. Re-run "
        "`make bench` on a quiet machine for numbers to quote."
    )


def _conditions(r: Result) -> str:
    before = r.get("conditions", {}).get("before", {})
    load = before.get("loadavg", ["?"])[0]
    return (
        f"_{r.get('profile', '?')} profile, {r.get('machine', {}).get('date', '?')}, "
        f"load average {load} before, {before.get('containers_running', '?')} containers "
        f"running on the engine, {r.get('elapsed_s', '?')} s._"
    )


def _error(r: Result) -> list[str]:
    return [f"Failed in this run: `{r['error']}`", ""] if "error" in r else []


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


SECTIONS = [
    ("start", "Start -> ready and stop", _start),
    ("fork8", "fork(n) of a live env against one cold start", _fork8),
    ("fork", "Fork against replay", _fork),
    ("snapshot", "Snapshot cost: follows the change, not the volume", _snapshot),
    ("latency", "Per-step latency: published port against the ingress proxy", _latency),
    ("density", "Density", _density),
    *report_trainer.SECTIONS,
    ("live", "Live forks: a running server copied, memory included", _live),
    ("live_tree", "Tree search: live forks, warm volume forks, replay", _live_tree),
]


def summary(results: dict[str, Result], plots: set[str]) -> str:
    any_result = next(iter(results.values()), {})
    m = any_result.get("machine", {})
    lines = [
        "# denv benchmarks",
        "",
        f"Machine: {m.get('cores', '?')} cores, {fmt_bytes(m.get('memory_bytes'))} memory, "
        f"Docker {m.get('docker_version', '?')}, kernel {m.get('kernel', '?')}, "
        f"OpenEnv {m.get('openenv_version', '?')}; denv {m.get('denv_commit', '?')}.",
        "Image: " + f"`{any_result.get('image', '?')}`. Generated by `python -m bench`; "
        "numbers are measured side by side in one run and never asserted.",
        "",
        *([w, ""] if (w := busy_warning(results)) else []),
    ]
    for name, title, render in SECTIONS:
        r = results.get(name)
        if r is None:
            continue
        lines += [f"## {title}", "", _conditions(r), ""]
        try:
            lines += _error(r) or render(r)
        except (KeyError, TypeError) as exc:
            lines.append(f"(no summary: {type(exc).__name__}: {exc})")
        if name in plots:
            lines += ["", f"![{title}]({name}.png)"]
        lines.append("")
    return "\n".join(lines)


README_START = "<!-- bench:latest:start (written by python -m bench; edits are lost) -->"
README_END = "<!-- bench:latest:end -->"


def _get(results: dict[str, Result], *path: Any) -> Any:
    """results[a][b][c]..., or None when any step is missing."""
    node: Any = results
    for key in path:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def headline(results: dict[str, Result], plots: set[str], prefix: str) -> str:
    """The latest numbers in a few lines, for bench/README.md (plots under `prefix`)."""
    any_result = next(iter(results.values()), {})
    m = any_result.get("machine", {})

    def g(*path: Any) -> Any:
        return _get(results, *path)

    lines = [
        f"Latest run: **{any_result.get('profile', '?')} profile**, {m.get('date', '?')}, "
        f"{m.get('cores', '?')} cores, {fmt_bytes(m.get('memory_bytes'))}, Docker "
        f"{m.get('docker_version', '?')}, denv `{str(m.get('denv_commit', '?'))[:12]}`; "
        f"load average up to {max_load(results)} when a benchmark began. "
        "Full tables: [results/SUMMARY.md](results/SUMMARY.md).",
        "",
        *([w, ""] if (w := busy_warning(results)) else []),
        "| claim | denv | alternative | ratio |",
        "|---|---:|---:|---:|",
    ]
    if g("start", "ready"):
        lines.append(
            "| start -> ready (median) | "
            f"{fmt_s(g('start', 'ready', 'denv', 'median'))} | LocalDockerProvider "
            f"{fmt_s(g('start', 'ready', 'local', 'median'))} (floor "
            f"{fmt_s(g('start', 'ready', 'floor', 'median'))}) | "
            f"{fmt_x(g('start', 'ratios', 'local_over_denv_median'))} |"
        )
        lines.append(
            "| stop (median) | "
            f"{fmt_s(g('start', 'stop', 'denv', 'median'))} | LocalDockerProvider "
            f"{fmt_s(g('start', 'stop', 'local', 'median'))} | "
            f"{fmt_x(g('start', 'ratios', 'local_stop_over_denv_stop_median'))} |"
        )
    if g("fork8", "ready"):
        n = g("fork8", "params", "n")
        for mode in ("warm", "cold"):
            if mode == "warm" and not g("fork8", "warm_available"):
                continue
            lines.append(
                f"| fork({n}) {mode}, {n} ready branches (median) | "
                f"{fmt_s(g('fork8', 'ready', mode, 'median'))} | one LocalDockerProvider start "
                f"{fmt_s(g('fork8', 'ready', 'local', 'median'))} | "
                f"{fmt_x(g('fork8', 'ratios', f'local_over_fork8_{mode}_median'))} |"
            )
    table = g("fork", "table") or []
    if table:
        cell = max(table, key=lambda x: (x["k"], x["n"]))
        best = "fork_warm" if cell["fork_warm"].get("n") else "fork_cold"
        lines.append(
            f"| N={cell['n']} branches at step K={cell['k']} | {best.replace('_', ' ')} "
            f"{fmt_s(cell[best].get('median'))} | replay {fmt_s(cell['replay'].get('median'))} "
            f"| {fmt_x(cell.get('replay_over_' + best))} |"
        )
    by_size = g("snapshot", "by_volume_size") or []
    by_change = g("snapshot", "by_changed_bytes") or []
    if by_size and by_change:
        small, big = by_size[-1], by_change[-1]
        lines.append(
            f"| snapshot, {fmt_bytes(small['changed_bytes'])} changed in a "
            f"{fmt_bytes(small['volume_bytes'])} volume | {fmt_s(small.get('median'))} | "
            f"{fmt_bytes(big['changed_bytes'])} changed: {fmt_s(big.get('median'))} | |"
        )
    if g("latency", "step"):
        lines.append(
            "| WebSocket step via ingress (median / p99) | "
            f"{fmt_s(g('latency', 'step', 'ingress', 'median'))} / "
            f"{fmt_s(g('latency', 'step', 'ingress', 'p99'))} | published port "
            f"{fmt_s(g('latency', 'step', 'direct', 'median'))} / "
            f"{fmt_s(g('latency', 'step', 'direct', 'p99'))} | |"
        )
    if g("live", "fork8", "ready"):
        n = g("live", "fork8", "n")
        lines.append(
            f"| live fork({n}), {n} ready branches (median) | "
            f"{fmt_s(g('live', 'fork8', 'ready', 'live', 'median'))} | warm volume fork "
            f"{fmt_s(g('live', 'fork8', 'ready', 'warm', 'median'))} | "
            f"{fmt_x(g('live', 'fork8', 'ratios', 'warm_over_live_median'))} |"
        )
    if g("live_tree", "live"):
        t = g("live_tree")
        others = "-"
        if "warm" in t and "replay" in t:
            others = f"warm volume {fmt_s(t['warm']['s'])}, replay {fmt_s(t['replay']['s'])}"
        ratios = t["ratios"]
        lines.append(
            f"| tree search B={t['branching']} D={t['depth']} ({t['live']['envs']} envs) | "
            f"live {fmt_s(t['live']['s'])} | {others} | {fmt_x(ratios['warm_over_live'])} / "
            f"{fmt_x(ratios['replay_over_live'])} |"
        )
    if g("live", "cpu", "total_ms_median") is not None:
        lines.append(
            f"| CPU of one live fork(8), all processes | "
            f"{g('live', 'cpu', 'total_ms_median'):.0f} ms | floor on "
            f"{g('live', 'cpu', 'cores')} cores {g('live', 'cpu', 'floor_ms'):.0f} ms | |"
        )
    if g("live", "sustained", "per_s") is not None:
        lines.append(
            f"| live children per second, sustained | {g('live', 'sustained', 'per_s'):.0f}/s "
            f"over {g('live', 'sustained', 'seconds'):.0f} s (one client) | "
            + (
                f"two clients at once {g('live', 'sustained2', 'per_s'):.0f}/s"
                if g("live", "sustained2", "per_s") is not None
                else ""
            )
            + " | |"
        )
    if g("live", "memory", "child_mb"):
        lines.append(
            f"| private memory of a live child | "
            f"{g('live', 'memory', 'child_mb', 'median'):.1f} MB | the root "
            f"{g('live', 'memory', 'root_mb'):.1f} MB | |"
        )
    if g("density", "envs") is not None:
        lines.append(
            f"| idle echo envs held (memory each) | {g('density', 'envs')} "
            f"({fmt_bytes(g('density', 'memory_per_env_bytes', 'cgroup_usage', 'median'))}) "
            f"| stopped at: {g('density', 'stopped_because')} | |"
        )
    lines.append("")
    lines += [f"![{name}]({prefix}{name}.png)" for name, _, _ in SECTIONS if name in plots]
    return "\n".join(lines)


def update_readme(readme: Path, block: str) -> None:
    """Replace the text between the README's markers with `block` (no markers: no change)."""
    if not readme.exists():
        return
    text = readme.read_text()
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        log.warning("%s has no %s ... %s markers; not updated", readme, README_START, README_END)
        return
    head = text[: start + len(README_START)]
    readme.write_text(head + "\n" + block + "\n" + text[end:])


def write(out: Path) -> None:
    """Rewrite SUMMARY.md and the plots from the result files in `out`."""
    results = _load(out)
    if not results:
        log.warning("no result files in %s", out)
        return
    from .plots import draw

    plots = draw(results, out)
    (out / "SUMMARY.md").write_text(summary(results, plots))
    log.info("wrote %s", out / "SUMMARY.md")
    readme = Path(__file__).resolve().parent / "README.md"
    if out.resolve() == readme.parent / "results":
        update_readme(readme, headline(results, plots, "results/"))
