"""PNG plots of the result files (matplotlib, no display needed).

Not run on its own: bench.report draws them (``python -m bench --report-only``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from .harness import percentile

log = logging.getLogger("bench.plots")

Result = dict[str, Any]
MB = 1024 * 1024


def _ok(rows: list[dict[str, Any]], key: str = "ready_s") -> list[float]:
    return [float(r[key]) for r in rows if key in r and "error" not in r]


def _strip(ax: Axes, groups: list[tuple[str, list[float]]], unit: str = "s") -> None:
    """Each group's samples as dots with its median as a bar."""
    labels = []
    for i, (label, values) in enumerate(groups):
        labels.append(label)
        if not values:
            continue
        ax.scatter(values, [i] * len(values), alpha=0.6, s=18)
        med = percentile(values, 50)
        ax.plot([med, med], [i - 0.3, i + 0.3], color="black", linewidth=2)
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlim(left=0)
    ax.set_xlabel(unit)
    ax.grid(axis="x", alpha=0.3)


def _start(r: Result) -> Figure:
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.4), width_ratios=[3, 2])
    runs = r["runs"]
    names = [
        ("DenvProvider", "denv"),
        ("LocalDockerProvider", "local"),
        ("docker run floor", "floor"),
    ]
    _strip(a, [(label, _ok(runs[k])) for label, k in names])
    a.set_title("start -> ready (dots: runs, bar: median)")
    _strip(b, [(label, _ok(runs[k], "stop_s")) for label, k in names])
    b.set_title("stop")
    b.set_yticks(range(3), ["", "", ""])
    return fig


def _fork8(r: Result) -> Figure:
    fig, ax = plt.subplots(figsize=(8, 2.8))
    n = r["params"]["n"]
    groups = [
        (f"fork({n}) cold", _ok(r["runs"]["cold"])),
        (f"fork({n}) warm", _ok(r["runs"]["warm"])),
    ]
    local = r["ready"].get("local", {})
    _strip(ax, groups)
    if local.get("median") is not None:
        ax.axvline(
            local["median"], color="red", linestyle="--", label="LocalDockerProvider (median)"
        )
        ax.legend(loc="lower right", fontsize=8)
    ax.set_title(f"{n} ready branches of a live env")
    return fig


def _fork(r: Result) -> Figure:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ks = r["params"]["ks"]
    styles = {"fork_cold": "-o", "fork_warm": "-^", "replay": "--s"}
    for method, style in styles.items():
        for n in r["params"]["ns"]:
            cells = [c for c in r["table"] if c["n"] == n and c[method].get("n")]
            if not cells:
                continue
            ax.plot(
                [c["k"] for c in cells],
                [c[method]["median"] for c in cells],
                style,
                label=f"{method.replace('_', ' ')}, N={n}",
            )
    ax.set_xscale("log")
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlabel("prefix K (steps)")
    ax.set_ylabel("seconds to N ready branches at step K")
    ax.set_title("fork against replay")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _snapshot(r: Result) -> Figure:
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    full, by_size, by_change = r["full_write"], r["by_volume_size"], r["by_changed_bytes"]
    a.plot(
        [x["volume_bytes"] / MB for x in full],
        [x["median"] for x in full],
        "-o",
        label="everything changed (first snapshot)",
    )
    a.plot(
        [x["volume_bytes"] / MB for x in by_size],
        [x["median"] for x in by_size],
        "-s",
        label=f"{by_size[0]['changed_bytes']} bytes changed" if by_size else "",
    )
    a.set_xscale("log")
    a.set_xlabel("volume size (MB)")
    a.set_ylabel("snapshot (s)")
    a.set_title("against volume size")
    a.legend(fontsize=8)
    b.plot([x["changed_bytes"] / MB for x in by_change], [x["median"] for x in by_change], "-o")
    b.set_xscale("log")
    b.set_xlabel("changed since the env started (MB)")
    vol = by_change[-1]["volume_bytes"] / MB if by_change else 0
    b.set_title(f"against changed bytes ({vol:.0f} MB volume)")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    return fig


def _latency(r: Result) -> Figure:
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, label in (("direct", "published port"), ("ingress", "ingress proxy")):
        values = sorted(r["samples_ms"][name])
        if values:
            ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=label)
    ax.set_xscale("log")
    ax.set_xlabel("WebSocket step (ms)")
    ax.set_ylabel("fraction of steps")
    ax.set_title("per-step latency (CDF)")
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def _density(r: Result) -> Figure:
    fig, ax = plt.subplots(figsize=(7, 4))
    growth = r["growth"]
    base = growth[0]["mem_available_bytes"]
    ax.plot(
        [g["envs"] for g in growth],
        [(base - g["mem_available_bytes"]) / MB for g in growth],
        "-o",
    )
    ax.set_xlabel("idle echo envs")
    ax.set_ylabel("host memory used since the start (MB)")
    ax.set_title("density")
    ax.grid(alpha=0.3)
    return fig


def _live(r: Result) -> Figure:
    fig, ax = plt.subplots(figsize=(7, 3))
    f8 = r["fork8"]
    _strip(
        ax,
        [
            ("live fork", _ok(f8["runs"]["live"])),
            ("warm volume fork", _ok(f8["runs"]["warm"])),
        ],
    )
    ax.set_title(f"fork({f8['n']}) -> ready clients (health + WebSocket)")
    return fig


def _live_tree(t: Result) -> Figure:
    fig, ax = plt.subplots(figsize=(7, 4))
    kinds = [k for k in ("live", "warm", "replay") if k in t]
    colors = ["tab:green", "tab:blue", "tab:gray"][: len(kinds)]
    ax.bar(kinds, [t[k]["s"] for k in kinds], color=colors)
    ax.set_yscale("log")
    ax.set_ylabel("s (log)")
    ax.set_title(f"tree search B={t['branching']} D={t['depth']} ({t['live']['envs']} envs)")
    ax.grid(axis="y", alpha=0.3)
    return fig


DRAW: dict[str, Callable[[Result], Figure]] = {
    "start": _start,
    "fork8": _fork8,
    "fork": _fork,
    "snapshot": _snapshot,
    "latency": _latency,
    "density": _density,
    "live": _live,
    "live_tree": _live_tree,
}


def draw(results: dict[str, Result], out: Path) -> set[str]:
    """Write <name>.png for every result that has a plot; the names drawn."""
    drawn: set[str] = set()
    for name, fn in DRAW.items():
        r = results.get(name)
        if r is None or "error" in r:
            continue
        try:
            fig = fn(r)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            log.warning("no plot for %s: %s", name, exc)
            continue
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=110)
        plt.close(fig)
        drawn.add(name)
    return drawn
