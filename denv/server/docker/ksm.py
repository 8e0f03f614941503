"""The kernel's same-page merging (KSM) for live envs (``denv serve --merge-pages``).

A live child starts with every page shared with its parent, and a Python server writes to
many of them on its first request: each object it touches has its reference count moved
and put back, so the page is copied though it ends up holding the same bytes. Those
copies are most of a stepped child's private memory (~10 of ~16 MB on the echo env,
docs/live-forks.md). With KSM on, the launcher marks a live root's memory mergeable before
each fork (children inherit the mark) and the kernel's ``ksmd`` folds pages holding the
same bytes back into one read-only copy.

The costs, which are why it is a flag: ``ksmd`` reads every marked page to compare it
(its CPU, set by ``pages_to_scan``/``sleep_millisecs`` under ``/sys/kernel/mm/ksm``), and
a merged page is slower to write, which another process on the machine can time: envs
that do not trust each other should not have their pages merged.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("denv.server")

KSM_DIR = Path("/sys/kernel/mm/ksm")


def enable(ksm_dir: Path = KSM_DIR) -> bool:
    """Make sure the kernel merges pages (``run`` = 1); True when this call turned it on.

    It stays on after the server stops: with no page marked, ``ksmd`` has nothing to do,
    and another server may be relying on it. OSError naming the fix when it cannot."""
    run = ksm_dir / "run"
    try:
        state = run.read_text().strip()
    except FileNotFoundError:
        raise OSError(
            f"--merge-pages needs the kernel's same-page merging, and {run} does not exist "
            "(a kernel built without CONFIG_KSM): run without --merge-pages"
        ) from None
    if state == "1":
        log_pace(ksm_dir)
        return False
    try:
        run.write_text("1\n")
    except OSError as exc:  # not root, or /sys read-only (a container)
        raise OSError(
            f"--merge-pages: the kernel's same-page merging is off ({run} is {state}) and "
            f"this server cannot turn it on ({exc.strerror}): run `echo 1 > {run}` as root "
            "on the host once, or run without --merge-pages"
        ) from None
    log.info("same-page merging turned on (%s was %s) for --merge-pages", run, state)
    log_pace(ksm_dir)
    return True


def pace(ksm_dir: Path = KSM_DIR) -> str:
    """How fast ``ksmd`` goes over marked memory, in words (from ``pages_to_scan`` and
    ``sleep_millisecs``), with the way to change it; "" when the kernel does not say."""
    try:
        pages = int((ksm_dir / "pages_to_scan").read_text())
        sleep_ms = int((ksm_dir / "sleep_millisecs").read_text())
    except (OSError, ValueError):
        return ""
    mb_s = pages * 4096 / 2**20 * 1000 / max(sleep_ms, 1)
    return (
        f"ksmd scans {pages} pages every {sleep_ms} ms (at most ~{mb_s:.0f} MB/s; a live echo "
        f"env maps ~140 MB mergeable, so one scan of 1,000 takes ~{140_000 / mb_s / 60:.0f} "
        f"min at best): raise {ksm_dir / 'pages_to_scan'} to merge sooner, at ksmd's CPU"
    )


def log_pace(ksm_dir: Path = KSM_DIR) -> None:
    if text := pace(ksm_dir):
        log.info("--merge-pages: %s", text)


def stats(ksm_dir: Path = KSM_DIR) -> dict[str, int]:
    """The kernel's counters (pages shared, pages sharing them, full scans, ...) as ints."""
    out: dict[str, int] = {}
    for path in sorted(ksm_dir.iterdir()):
        try:
            out[path.name] = int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):  # write-only or not a number (advisor_mode)
            continue
    return out
