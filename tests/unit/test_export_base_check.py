"""The files digest an export's build checks its base against (templates/denv-base-check.py).

It runs here on folders the test makes; the e2e tests run it in real builds (BuildKit and
the legacy builder) on the version's image and on another image under the same tag.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from types import ModuleType

import pytest
from denv.openenv.export import ExportError
from denv.openenv.export._plan import BASE_CHECK, ImagePin, base_check_script, pin_content


def _check_module(tmp_path: Path) -> ModuleType:
    script = tmp_path / BASE_CHECK
    script.write_bytes(base_check_script())
    spec = importlib.util.spec_from_file_location("denv_base_check", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tree(root: Path) -> Path:
    (root / "usr" / "lib").mkdir(parents=True)
    (root / "usr" / "lib" / "a.py").write_text("print('a')\n")
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    os.symlink("usr/lib", root / "lib")
    return root


def test_the_digest_follows_every_byte_mode_and_link(tmp_path: Path) -> None:
    check = _check_module(tmp_path)
    tree = _tree(tmp_path / "tree")
    first = check.digest(bytes(tree))
    assert first.startswith("sha256:") and len(first) == 71
    copy = tmp_path / "copy"
    shutil.copytree(tree, copy, symlinks=True)
    assert check.digest(bytes(copy)) == first  # same files elsewhere: same digest

    (copy / "usr" / "lib" / "a.py").write_text("print('b')\n")
    changed_bytes = check.digest(bytes(copy))
    (copy / "usr" / "lib" / "a.py").write_text("print('a')\n")
    assert check.digest(bytes(copy)) == first
    (copy / "etc" / "passwd").chmod(0o600)
    changed_mode = check.digest(bytes(copy))
    (copy / "etc" / "passwd").chmod((tree / "etc" / "passwd").stat().st_mode & 0o7777)
    (copy / "lib").unlink()
    os.symlink("etc", copy / "lib")
    changed_link = check.digest(bytes(copy))
    (copy / "new").write_text("")
    added = check.digest(bytes(copy))
    assert len({first, changed_bytes, changed_mode, changed_link, added}) == 5


def test_the_check_exits_1_naming_both_digests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    check = _check_module(tmp_path)
    monkeypatch.setattr(check, "digest", lambda: "sha256:" + "1" * 64)
    assert check.main(["check", "sha256:" + "1" * 64]) == 0
    assert check.main(["check", "sha256:" + "2" * 64]) == 1
    err = capsys.readouterr().err
    assert "not the image the version was exported from" in err
    assert "1" * 64 in err and "2" * 64 in err


def test_an_agent_image_missing_from_the_engine_cannot_be_pinned() -> None:
    pin = ImagePin(
        "agent",
        "x:1",
        "sha256:" + "c" * 64,
        "sha256:" + "c" * 64,
        "image id (not on this Docker Engine)",
    )
    with pytest.raises(ExportError, match=r"not on this Docker Engine.*docker load or pull"):
        pin_content(pin)
