"""Errors raised by the OpenEnv adapter when an env does not become usable.

OpenEnv's provider contract says a failed start raises `RuntimeError` and a
readiness wait that runs out raises `TimeoutError`; these subclasses keep that
contract and add what a caller needs to fix the problem: the env's id and its
last log lines.
"""

from __future__ import annotations

from collections.abc import Sequence

#: How many log lines an error carries; enough for a traceback, short enough to read.
LOG_TAIL_LINES = 40


def _describe(summary: str, env_id: str | None, log_tail: Sequence[str], fix: str) -> str:
    parts = [summary]
    if log_tail:
        parts.append("Last log lines:\n" + "\n".join(f"  | {line}" for line in log_tail))
    elif env_id is not None:
        parts.append("The env wrote no log lines.")
    if fix:
        parts.append(fix)
    return "\n".join(parts)


class _EnvDetails(Exception):
    """The env an error is about, and what it printed last (first base of each error)."""

    def __init__(
        self,
        summary: str,
        *,
        env_id: str | None = None,
        log_tail: Sequence[str] = (),
        fix: str = "",
    ) -> None:
        super().__init__(_describe(summary, env_id, log_tail, fix))
        self.env_id = env_id
        self.log_tail = tuple(log_tail)


class EnvStartError(_EnvDetails, RuntimeError):
    """The env failed while starting: its server exited, or the server could not start it.

    `env_id` names the env (already deleted, so nothing is left behind) and
    `log_tail` holds its last log lines.
    """


class EnvReadyTimeout(_EnvDetails, TimeoutError):
    """The env did not become ready in time; `log_tail` shows how far it got."""


class WarmPoolStalled(RuntimeError):
    """The env's warm pool stopped filling: spare boots keep failing, or no room is left.

    `pool` is the server's last report (`denv.WarmPool`); its `error` says why.
    """

    def __init__(self, message: str, pool: object) -> None:
        super().__init__(message)
        self.pool = pool


class WarmPoolTimeout(TimeoutError):
    """The env's warm pool was not full in time; `pool` is the server's last report."""

    def __init__(self, message: str, pool: object) -> None:
        super().__init__(message)
        self.pool = pool
