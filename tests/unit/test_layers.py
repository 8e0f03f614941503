"""Layer rules the issues rely on, checked on the source: only `denv` itself imports the
facade's private modules (`denv._*`); the adapter, the exporter, the bench and the examples go
through its public modules (`denv`, `denv.errors`, `denv.local`, `denv.types`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE_THE_FACADE = ("adapters", "bench", "examples")


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


@pytest.mark.parametrize("folder", OUTSIDE_THE_FACADE)
def test_no_private_facade_module_is_imported_outside_denv(folder: str) -> None:
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted((ROOT / folder).rglob("*.py"))
        for name in _imports(path)
        if name.startswith("denv._")
    ]
    assert offenders == []
