"""SUMMARY.md section of bench_isolation's results: runc against gVisor, side by side.

Not run on its own: bench.report writes SUMMARY.md with it
(``python -m bench --report-only``).
"""

from __future__ import annotations

from typing import Any

Result = dict[str, Any]


def fmt_s(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.2f} ms" if value < 1 else f"{value:.2f} s"


def fmt_bytes(value: Any) -> str:
    return "-" if value is None else f"{value / 2**20:.1f} MB"


def fmt_x(value: Any) -> str:
    return "-" if value is None else f"{value:.1f}x"


def isolation(r: Result) -> list[str]:
    runc, gvisor = r["medians"]["runc"], r["medians"]["gvisor"]
    ratios = r["ratios_gvisor_over_runc"]
    rows: list[tuple[str, str, Any]] = [
        ("start -> first `reset()` answered", "start_s", fmt_s),
        ("WebSocket step through ingress (median)", "step_median_s", fmt_s),
        ("memory of an env's container (cgroup)", "memory_env_cgroup", fmt_bytes),
        ("memory of an env's container (private, USS)", "memory_env_uss", fmt_bytes),
    ]
    for n in r["params"]["forks"]:
        kinds = f"{'/'.join(runc.get(f'fork{n}_kinds') or ['-'])} vs "
        kinds += "/".join(gvisor.get(f"fork{n}_kinds") or ["-"])
        rows += [
            (f"fork({n}) to every child's `state()` ({kinds})", f"fork{n}_s", fmt_s),
            (f"memory per child of fork({n}) (cgroup)", f"memory_child{n}_cgroup", fmt_bytes),
            (f"memory per child of fork({n}) (private, USS)", f"memory_child{n}_uss", fmt_bytes),
        ]
    lines = ["| median | runc | gvisor | gvisor / runc |", "|---|---:|---:|---:|"]
    for label, key, fmt in rows:
        a, b, x = fmt(runc.get(key)), fmt(gvisor.get(key)), fmt_x(ratios.get(key))
        lines.append(f"| {label} | {a} | {b} | {x} |")
    warm = r.get("gvisor_warm") or {}
    lines += [
        "",
        f"{r['params']['rounds']} rounds, alternating; OpenEnv's echo env with the defaults a "
        "user gets (`fork='auto'`: live forks under runc, volume forks booting each child "
        "under gvisor). A live child's memory is its own cgroup below its parent's container "
        "(pages it shares with the parent are not its own); a gvisor child's is its whole "
        "sandbox.",
    ]
    if warm.get("refused"):
        lines += ["", f"Warm spares under gvisor: refused by the server ({warm['refused']})."]
    elif warm:
        n = max(r["params"]["forks"])
        lines += ["", f"fork({n}) from warm spares under gvisor: {fmt_s(warm.get(f'fork{n}_s'))}."]
    return lines


SECTIONS = [("isolation", "Isolation: runc against gVisor", isolation)]
