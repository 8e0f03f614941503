"""What `denv serve --isolation gvisor` says when gVisor cannot run, and what `denv gvisor
install` keeps of an engine's daemon.json. No engine is touched here: the runtime itself
runs in tests/e2e/test_gvisor.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from denv.server.gvisor import runtime


def test_an_engine_without_the_runtime_is_refused_naming_the_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runtime, "runsc", lambda: "/usr/bin/runsc")
    with pytest.raises(runtime.GvisorUnavailable, match="run `denv gvisor install` as root"):
        runtime.check(["runc", "io.containerd.runc.v2"])
    runtime.check(["runc", runtime.RUNTIME])  # both there: no error


def test_a_machine_without_runsc_is_refused_naming_the_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # runsc is installed on the machines that run this suite: its absence is simulated.
    monkeypatch.setattr(runtime, "runsc", lambda: None)
    with pytest.raises(runtime.GvisorUnavailable, match="apt-get install runsc"):
        runtime.check([runtime.RUNTIME])


def test_install_keeps_the_rest_of_daemon_json(tmp_path: Path) -> None:
    daemon_json, wrapper = tmp_path / "daemon.json", tmp_path / "sbin" / "denv-runsc"
    theirs = {"log-driver": "local", "runtimes": {"other": {"path": "/opt/other"}}}
    entry = {"path": str(wrapper)}
    # The engine already lists it and daemon.json names it: nothing to reload.
    daemon_json.write_text(
        json.dumps({**theirs, "runtimes": {**theirs["runtimes"], runtime.RUNTIME: entry}})
    )
    said: list[str] = []
    runtime.install(lambda: [runtime.RUNTIME], daemon_json, wrapper, said.append)
    config = json.loads(daemon_json.read_text())
    assert config["log-driver"] == "local"
    assert config["runtimes"] == {"other": {"path": "/opt/other"}, runtime.RUNTIME: entry}
    assert wrapper.read_bytes() == runtime.SCRIPT.read_bytes()
    assert wrapper.stat().st_mode & 0o777 == 0o755
    assert said[0] == f"wrote {wrapper}" and len(said) == 2  # no daemon.json change, no reload


def test_a_daemon_json_that_is_not_json_is_named(tmp_path: Path) -> None:
    daemon_json = tmp_path / "daemon.json"
    daemon_json.write_text("{not json")
    with pytest.raises(runtime.GvisorUnavailable, match="is not JSON"):
        runtime.install(lambda: [], daemon_json, tmp_path / "w", lambda _: None)
