"""pid 1 of a live env's container: ``python /.denv/bin/launcher.py <the image's command>``.

It drops CAP_SYS_ADMIN for good (see ``_denv_live``'s doc for why the container has it), then
runs the image's own command, unchanged, with ``/.denv/bin`` first on ``PYTHONPATH`` so that
the Python process in which uvicorn serves the app takes the live launcher on
(``sitecustomize.py``). It reaps every orphan (live children whose forker ended) and exits
with the command's status once no process is left. Any Python of the image runs it: it needs
the standard library only.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
from typing import Any

# A sibling module of this script (its directory is sys.path[0]), not a package of denv.
_live: Any = importlib.import_module("_denv_live")

BIN = os.path.dirname(os.path.abspath(__file__))
NOT_FOUND = 127


def command_environment() -> dict[str, str]:
    """The container's environment, with the start-up hook first on PYTHONPATH."""
    env = dict(os.environ)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = f"{BIN}:{path}" if path else BIN
    env["DENV_LIVE_HOOK"] = "1"
    return env


def supervise(argv: list[str]) -> int:
    _live.drop_caps(keep=_live.current_caps() - {_live.CAP_SYS_ADMIN})
    if not argv:
        print("denv-live: the image has no command to run", file=sys.stderr, flush=True)
        return NOT_FOUND
    env = command_environment()
    command = os.fork()
    if command == 0:
        try:
            os.execvpe(argv[0], argv, env)
        except OSError as exc:
            print(f"denv-live: cannot run {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
        os._exit(NOT_FOUND)

    def stop(signum: int, _frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)  # every process of the container but pid 1

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    status = 0
    while True:
        try:
            pid, raw = os.wait()
        except ChildProcessError:
            return status
        except InterruptedError:
            continue
        if pid == command:
            status = os.waitstatus_to_exitcode(raw)
            status = status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(supervise(sys.argv[1:]))
