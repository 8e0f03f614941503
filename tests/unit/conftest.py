"""Fixtures of the facade's unit tests (no Docker, no network beyond loopback)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _no_ambient_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Tests never pick up the developer's DENV_* settings or running local server."""
    for name in ("DENV_SERVER", "DENV_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DENV_STATE_DIR", str(tmp_path / "state"))


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A real TCP server on loopback that accepts connections and never answers."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept_forever() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            held.append(conn)  # read nothing, answer nothing

    thread = threading.Thread(target=accept_forever, daemon=True)
    thread.start()
    host, port = listener.getsockname()
    try:
        yield f"http://{host}:{port}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


@pytest.fixture
def closed_port_url() -> str:
    """A loopback URL nothing listens on (connection refused)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.bind(("127.0.0.1", 0))
    host, port = probe.getsockname()
    probe.close()
    return f"http://{host}:{port}"


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    """Which facade a test drives: `Denv`, or `AsyncDenv` through tests/unit/async_driver.py."""
    return str(request.param)
