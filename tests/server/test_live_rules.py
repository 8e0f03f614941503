"""Rules of live forks and warm pools that need no engine: which commands the launcher can
run (and why not), how it reads uvicorn's options, and the warm pools' back-off."""

from __future__ import annotations

import itertools

import pytest

from denv.server.docker.launcher import launcher
from denv.server.lifecycle.warm import retry_delay
from denv.server.node import live


@pytest.mark.parametrize(
    "argv",
    [
        ["uvicorn", "echo_env.app:app", "--host", "0.0.0.0", "--port", "8000"],
        ["/opt/venv/bin/uvicorn", "app:app"],
        ["python3", "-m", "uvicorn", "server.app:app", "--port", "9000"],
    ],
)
def test_uvicorn_commands_can_run_live(argv: list[str]) -> None:
    assert live.unsupported_reason(argv, 1) is None


@pytest.mark.parametrize(
    ("argv", "services", "words"),
    [
        (["python", "-m", "http.server"], 1, "not a Python ASGI server"),
        (["node", "server.js"], 1, "not a Python ASGI server"),
        (["uvicorn", "a:app", "--workers", "4"], 1, "--workers"),
        (["uvicorn", "a:app", "--reload"], 1, "--reload"),
        (["uvicorn", "a:app"], 2, "compose project"),
        ([], 1, "no command"),
        (None, 1, "no command"),
    ],
)
def test_other_commands_are_refused_with_the_reason(
    argv: list[str] | None, services: int, words: str
) -> None:
    reason = live.unsupported_reason(argv, services)
    assert reason is not None and words in reason


def test_the_launcher_reads_uvicorns_own_options() -> None:
    kwargs, app, why = launcher.uvicorn_config(
        ["uvicorn", "pkg.mod:app", "--host", "0.0.0.0", "--port", "8123", "--log-level", "debug"]
    )
    assert why is None and app == "pkg.mod:app"
    assert kwargs["host"] == "0.0.0.0" and kwargs["port"] == 8123
    assert kwargs["log_level"] == "debug"
    _, _, why = launcher.uvicorn_config(["uvicorn", "pkg.mod:app", "--workers", "2"])
    assert why is not None and "--workers" in why
    _, _, why = launcher.uvicorn_config(["gunicorn", "pkg.mod:app"])
    assert why == "the command does not start uvicorn"


def test_a_failing_warm_pool_backs_off_and_never_gives_up() -> None:
    delays = [retry_delay(n) for n in range(3, 12)]
    assert delays[0] == 15.0
    assert all(b == min(600.0, 2 * a) for a, b in itertools.pairwise(delays))
    assert delays[-1] == 600.0  # bounded, and still a retry
