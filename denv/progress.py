"""Progress lines while something slow happens, so a script that waits says on what.

The local server's first start, an env's first boot (a wait for its health check longer than
`SLOW_S`), and spares booting (`DenvProvider.wait_warm`) each write a line such as

    denv: starting the local denv server (state in ~/.local/share/denv) ...

They are records of the `denv.progress` logger at INFO. A program that configured no logging
gets them on stderr as above; one that did gets them through its own handlers. To silence
them: ``logging.getLogger("denv.progress").setLevel(logging.WARNING)``.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["SLOW_S", "logger", "say"]

#: Seconds an env may take to answer its health check before a line says it is awaited.
SLOW_S = 2.0

logger = logging.getLogger("denv.progress")
logger.setLevel(logging.INFO)


class _StderrUntilConfigured(logging.Handler):
    """Writes to stderr while the root logger has no handler (nothing configured logging);
    once something has, its handlers get the record instead (it propagates)."""

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return
        try:
            sys.stderr.write(f"denv: {record.getMessage()}\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


if not any(isinstance(h, _StderrUntilConfigured) for h in logger.handlers):
    logger.addHandler(_StderrUntilConfigured())


def say(message: str, *args: object) -> None:
    """One progress line (`message % args`)."""
    logger.info(message, *args)
