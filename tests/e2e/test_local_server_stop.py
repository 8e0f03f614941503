"""`denv stop` stops the local server that the provider's embedded default starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from denv.cli import main
from denv.client.local import _alive, ensure_local_server, read_local_server

pytestmark = pytest.mark.e2e


def test_denv_stop_stops_the_local_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state_dir = tmp_path / "state"
    server = ensure_local_server(state_dir)
    assert server.pid is not None
    assert read_local_server(state_dir) is not None

    assert main(["stop", "--state-dir", str(state_dir)]) == 0
    assert f"stopped the local server at {server.url}" in capsys.readouterr().out
    assert read_local_server(state_dir) is None
    assert not _alive(server.pid)

    assert main(["stop", "--state-dir", str(state_dir)]) == 0  # nothing to stop is fine
    assert "no local denv server is running" in capsys.readouterr().out
