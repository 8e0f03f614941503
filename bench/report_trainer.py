"""SUMMARY.md sections of bench_trainer's results (warm16, async_get_env, diff).

Not run on its own: bench.report writes SUMMARY.md with it
(``python -m bench --report-only``).
"""

from __future__ import annotations

from typing import Any

Result = dict[str, Any]


def _s(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def _x(value: Any) -> str:
    return "-" if value is None else f"{value:.1f}x"


def warm16(r: Result) -> list[str]:
    ready, ratios, n = r["ready"], r["ratios"], r["envs"]
    rows = [
        (f"DenvProvider(warm={n}), {n} spares booted", "denv_warm"),
        ("OpenEnv LocalDockerProvider", "local"),
        ("DenvProvider, cold (no spares)", "denv_cold"),
    ]
    lines = [
        f"| {n} envs of one image at once -> all ready | median | max | rounds |",
        "|---|---:|---:|---:|",
    ]
    for label, key in rows:
        x = ready.get(key, {})
        lines.append(f"| {label} | {_s(x.get('median'))} | {_s(x.get('max'))} | {x.get('n', 0)} |")
    share = r.get("warm_share")
    lines += [
        "",
        f"LocalDockerProvider / DenvProvider warm (median): "
        f"**{_x(ratios['local_over_denv_warm_median'])}** (target >= 10x); cold / warm: "
        f"{_x(ratios['denv_cold_over_denv_warm_median'])}. Warm starts among the denv "
        f"envs: {'-' if share is None else f'{share:.0%}'}.",
    ]
    return lines


def async_get_env(r: Result) -> list[str]:
    g, s, m = r["async_gather_s"], r["sequential_s"], r["calls"]
    return [
        f"| {m} `get_env` calls | median | p90 | rounds |",
        "|---|---:|---:|---:|",
        f"| `AsyncDenv`, gathered on one loop | {_s(g.get('median'))} | {_s(g.get('p90'))} "
        f"| {g.get('n', 0)} |",
        f"| `Denv`, one after another | {_s(s.get('median'))} | {_s(s.get('p90'))} "
        f"| {s.get('n', 0)} |",
        "",
        f"Sequential / gathered (median): "
        f"**{_x(r['ratios']['sequential_over_async_median'])}** (target >= 5x).",
    ]


def diff(r: Result) -> list[str]:
    d = r["diff_s"]
    gb = r["volume_bytes"] / 2**30
    return [
        f"| `Denv.diff`, {gb:.2f} GiB volume, 1 MiB changed | median | p90 | reps |",
        "|---|---:|---:|---:|",
        f"| fork child vs its parent's version (shared layers) | "
        f"{_s(d['fork_child'].get('median'))} | {_s(d['fork_child'].get('p90'))} | "
        f"{d['fork_child'].get('n', 0)} |",
        f"| two snapshots of one env (nothing shared) | {_s(d['same_env'].get('median'))} | "
        f"{_s(d['same_env'].get('p90'))} | {d['same_env'].get('n', 0)} |",
        "",
        f"Target <= 50 ms (median): fork child **{_met(d['fork_child'])}**, two snapshots of "
        f"one env **{_met(d['same_env'])}**; the diff listed exactly the changed file: "
        f"{'yes' if r.get('correct') else 'NO'}. Only the layers two versions do not share "
        "are read: a fork's child holds the 1 MiB it changed, while two snapshots of one env "
        "each hold everything the env wrote, so every file is compared.",
    ]


def _met(x: dict[str, Any]) -> str:
    median = x.get("median")
    return "-" if median is None else ("met" if median <= 0.05 else "not met")


SECTIONS = [
    ("warm16", "Trainers: many envs of one image at once, warm", warm16),
    ("async_get_env", "Trainers: AsyncDenv against sequential calls", async_get_env),
    ("diff", "Trainers: diff of two versions", diff),
]
