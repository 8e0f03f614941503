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


def kinds_of(runc: Result, gvisor: Result, key: str) -> str:
    """`live vs restored`: the start kinds of each server's children of a fork row."""
    return " vs ".join("/".join(side.get(key) or ["-"]) for side in (runc, gvisor))


def http_rows(runc: Result, gvisor: Result, n: int) -> list[tuple[str, str, Any]]:
    """The rows of fork(n) over HTTP with no session open (bench_isolation's http_fork)."""
    kinds = kinds_of(runc, gvisor, f"http_fork{n}_kinds")
    return [
        (
            f"fork({n}) over HTTP, no session open, to every child's /state ({kinds})",
            f"http_fork{n}_s",
            fmt_s,
        ),
        (
            f"fork({n}) over HTTP: the fork call (under gvisor it saves the parent's sandbox)",
            f"http_fork{n}_call_s",
            fmt_s,
        ),
        (
            f"fork({n}) over HTTP, per child: the fork's answer -> its /state (gvisor: restore)",
            f"http_fork{n}_child_after_call_s",
            fmt_s,
        ),
        (
            f"fork({n}) over HTTP, per child: the fork request -> its /state",
            f"http_fork{n}_child_ready_s",
            fmt_s,
        ),
        (
            f"memory per child of fork({n}) over HTTP (cgroup)",
            f"http_memory_child{n}_cgroup",
            fmt_bytes,
        ),
        (
            f"memory per child of fork({n}) over HTTP (private, USS)",
            f"http_memory_child{n}_uss",
            fmt_bytes,
        ),
    ]


def restore_boot_live(r: Result) -> list[str]:
    """fork(n) under gvisor by restore (HTTP, no session) and by boot (a WebSocket session
    open), beside runc's live fork; the checkpoint's time and size; why a save was refused."""
    compared = r.get("fork_restore_boot_live") or {}
    if not compared:
        return []
    gvisor = r["medians"]["gvisor"]
    lines = [
        "",
        "| fork(n), median | gvisor over HTTP, no session | gvisor from a WebSocket client "
        "| runc over HTTP | gvisor: WebSocket / HTTP | gvisor HTTP / runc HTTP |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for n in r["params"]["forks"]:
        c = compared.get(f"fork{n}") or {}
        kinds = [
            "/".join(c.get(k) or ["-"])
            for k in ("gvisor_http_kinds", "gvisor_websocket_kinds", "runc_http_kinds")
        ]
        lines.append(
            f"| fork({n}) | {fmt_s(c.get('gvisor_http_s'))} ({kinds[0]}) "
            f"| {fmt_s(c.get('gvisor_websocket_s'))} ({kinds[1]}) "
            f"| {fmt_s(c.get('runc_http_s'))} ({kinds[2]}) "
            f"| {fmt_x(c.get('gvisor_websocket_over_http'))} "
            f"| {fmt_x(c.get('gvisor_http_over_runc_http'))} |"
        )
    saved = gvisor.get("checkpoints") or 0
    lines += [
        "",
        f"The parent's sandbox saved for a fork over HTTP under gvisor (runsc checkpoint, from "
        f"the server's log): {fmt_s(gvisor.get('checkpoint_s'))}, "
        f"{fmt_mb(gvisor.get('checkpoint_mb'))} (median of {saved}).",
    ]
    n = max(r["params"]["forks"])
    refused = gvisor.get(f"fork{n}_checkpoint_refused") or []
    if refused:
        lines += [
            "",
            "From a WebSocket client the children boot: the server did not save the sandbox "
            f"(it said: {refused[0]})",
        ]
    for key in (f"http_fork{k}_checkpoint_refused" for k in r["params"]["forks"]):
        for why in gvisor.get(key) or []:
            lines += ["", f"A fork over HTTP that was not saved: {why}"]
    return lines


def fmt_mb(value: Any) -> str:
    return "-" if value is None else f"{value:.1f} MB"


def isolation(r: Result) -> list[str]:
    runc, gvisor = r["medians"]["runc"], r["medians"]["gvisor"]
    ratios = r["ratios_gvisor_over_runc"]
    rows: list[tuple[str, str, Any]] = [
        ("start -> first `reset()` answered", "start_s", fmt_s),
        ("WebSocket step through ingress (median)", "step_median_s", fmt_s),
        ("memory of an env's container (cgroup)", "memory_env_cgroup", fmt_bytes),
        ("memory of an env's container (private, USS)", "memory_env_uss", fmt_bytes),
    ]
    http = "fork_restore_boot_live" in r
    client = " from a WebSocket client" if http else ""
    for n in r["params"]["forks"]:
        kinds = kinds_of(runc, gvisor, f"fork{n}_kinds")
        rows += [
            (f"fork({n}){client} to every child's `state()` ({kinds})", f"fork{n}_s", fmt_s),
            (f"memory per child of fork({n}) (cgroup)", f"memory_child{n}_cgroup", fmt_bytes),
            (f"memory per child of fork({n}) (private, USS)", f"memory_child{n}_uss", fmt_bytes),
        ]
    if http:
        for n in r["params"]["forks"]:
            rows += http_rows(runc, gvisor, n)
    lines = ["| median | runc | gvisor | gvisor / runc |", "|---|---:|---:|---:|"]
    for label, key, fmt in rows:
        a, b, x = fmt(runc.get(key)), fmt(gvisor.get(key)), fmt_x(ratios.get(key))
        lines.append(f"| {label} | {a} | {b} | {x} |")
    warm = r.get("gvisor_warm") or {}
    if http:
        how = (
            "`fork='auto'`: live forks under runc; under gvisor the parent's sandbox is "
            "saved and each child resumes from it (`restored`), but not while a client "
            "holds a WebSocket session to the parent (this runsc cannot save an open TCP "
            "connection): then each child boots from the parent's /work (`cold`)"
        )
    else:
        how = "`fork='auto'`: live forks under runc, volume forks booting each child under gvisor"
    lines += [
        "",
        f"{r['params']['rounds']} rounds, alternating; OpenEnv's echo env with the defaults a "
        f"user gets ({how}). A live child's memory is its own cgroup below its parent's "
        "container (pages it shares with the parent are not its own); a gvisor child's is its "
        "whole sandbox.",
        *restore_boot_live(r),
    ]
    if warm.get("refused"):
        lines += ["", f"Warm spares under gvisor: refused by the server ({warm['refused']})."]
    elif warm:
        n = max(r["params"]["forks"])
        lines += ["", f"fork({n}) from warm spares under gvisor: {fmt_s(warm.get(f'fork{n}_s'))}."]
    return lines


SECTIONS = [("isolation", "Isolation: runc against gVisor", isolation)]
