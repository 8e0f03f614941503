"""Where `make test`'s time goes: seconds per test module from its JUnit report, most first.

.venv/bin/python scripts/test_times.py [REPORT ...] [--top 40]

With no report, every .cache/test-report*.xml (`make test` writes one per pytest run).
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def _module(classname: str) -> str:
    """``tests.e2e.test_x`` of ``tests.e2e.test_x`` or ``tests.e2e.test_x.TestY``."""
    parts = classname.split(".")
    for i, part in enumerate(parts):
        if part.startswith("test_"):
            return ".".join(parts[: i + 1])
    return classname


def main() -> int:
    parser = argparse.ArgumentParser(prog="scripts/test_times.py")
    parser.add_argument("reports", nargs="*", type=Path)
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    reports = args.reports or sorted(Path(".cache").glob("test-report*.xml"))
    if not reports:
        parser.error("no .cache/test-report*.xml: `make test` writes them")
    for report in reports:
        if not report.is_file():
            parser.error(f"{report} does not exist: `make test` writes it")
    per_module: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for report in reports:
        for case in ET.parse(report).iter("testcase"):
            module = _module(case.get("classname") or "?")
            per_module[module] += float(case.get("time") or 0)
            count[module] += 1
    total = sum(per_module.values())
    for module, secs in sorted(per_module.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"{secs:8.1f} s {100 * secs / total:5.1f}%  {count[module]:4d}  {module}")
    print(f"{total:8.1f} s in all, {sum(count.values())} tests")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
