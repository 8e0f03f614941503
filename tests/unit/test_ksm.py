"""``denv serve --merge-pages`` turns the kernel's same-page merging on, or says why it
cannot, before serving (denv/server/docker/ksm.py). A folder stands in for
/sys/kernel/mm/ksm: the real one is the host's, and e2e (tests/e2e/test_live_merge.py)
uses it."""

from __future__ import annotations

from pathlib import Path

import pytest

from denv.server.docker import ksm


def _ksm_dir(tmp_path: Path, run: str) -> Path:
    (tmp_path / "run").write_text(f"{run}\n")
    (tmp_path / "pages_sharing").write_text("12\n")
    (tmp_path / "full_scans").write_text("3\n")
    (tmp_path / "advisor_mode").write_text("none [scan-time]\n")
    return tmp_path


def test_turns_merging_on_when_it_is_off(tmp_path: Path) -> None:
    ksm_dir = _ksm_dir(tmp_path, "0")
    assert ksm.enable(ksm_dir) is True
    assert (ksm_dir / "run").read_text() == "1\n"


def test_leaves_merging_alone_when_it_is_on(tmp_path: Path) -> None:
    ksm_dir = _ksm_dir(tmp_path, "1")
    assert ksm.enable(ksm_dir) is False
    assert (ksm_dir / "run").read_text() == "1\n"


def test_a_kernel_without_merging_is_named_with_the_way_out(tmp_path: Path) -> None:
    with pytest.raises(OSError, match=r"CONFIG_KSM.*run without --merge-pages"):
        ksm.enable(tmp_path / "absent")


def test_a_run_file_it_cannot_write_is_named_with_the_fix(tmp_path: Path) -> None:
    # /proc/version refuses writes even to root: a stand-in for a read-only /sys (a
    # container) or a user without the right to write it.
    (tmp_path / "run").symlink_to("/proc/version")
    with pytest.raises(OSError) as caught:
        ksm.enable(tmp_path)
    message = str(caught.value)
    assert "cannot turn it on" in message
    assert f"echo 1 > {tmp_path / 'run'}" in message and "without --merge-pages" in message


def test_stats_reads_the_counters_and_skips_what_is_not_a_number(tmp_path: Path) -> None:
    ksm_dir = _ksm_dir(tmp_path, "1")
    assert ksm.stats(ksm_dir) == {"full_scans": 3, "pages_sharing": 12, "run": 1}


def test_the_pace_is_said_with_the_way_to_change_it(tmp_path: Path) -> None:
    ksm_dir = _ksm_dir(tmp_path, "1")
    (ksm_dir / "pages_to_scan").write_text("100\n")
    (ksm_dir / "sleep_millisecs").write_text("20\n")
    text = ksm.pace(ksm_dir)
    assert text.startswith("ksmd scans 100 pages every 20 ms (at most ~20 MB/s")
    assert "one scan of 1,000 takes ~119 min" in text
    assert f"raise {ksm_dir / 'pages_to_scan'}" in text
    assert ksm.pace(tmp_path / "absent") == ""
