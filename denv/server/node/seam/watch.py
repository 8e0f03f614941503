"""What runs on a node, as the lifecycle watches it: states, logs, memory and CPU
(``WatchCalls``)."""

from __future__ import annotations

from typing import Protocol

from pydantic import Field

from denv.server.records import LiveProc, Record


class Metered(Record):
    """An env whose use of its node is asked for: its containers, or (a live env) its server
    process, which runs in cgroups of its own inside its group's container."""

    env_id: str
    containers: list[str] = Field(default_factory=list)
    live: LiveProc | None = None


class Usage(Record):
    """What an env uses now: memory in bytes, CPU time used so far in seconds (None: not
    known, e.g. it no longer runs)."""

    env_id: str
    memory_bytes: int | None = None
    cpu_s: float | None = None


class WatchCalls(Protocol):
    """Reads of what runs: nothing here changes an env."""

    def states(self, env_id: str | None = None) -> dict[str, str]:
        """Container id -> created / running / paused / exited, of one env or all."""
        ...

    def logs(self, env_id: str, service: str, tail: int) -> list[str]: ...

    def memory_bytes(self, containers: list[str]) -> int: ...

    def logs_after(
        self, env_id: str, service: str, cursor: str | None, tail: int, wait_s: float
    ) -> tuple[list[str], str | None]:
        """A service's log as it is written: with no ``cursor``, its last ``tail`` lines at
        once; else the lines written after ``cursor`` (at most the last ``tail``), waiting up
        to ``wait_s`` seconds for the first. And the cursor after them (the node's own
        string), or None when the service has no log (its container is gone)."""
        ...

    def usage(self, envs: list[Metered]) -> list[Usage]:
        """Each env's memory and CPU time, read from its cgroups: its containers' for an env
        of its own containers, its server's own for a live env. In the order asked."""
        ...

    def exit_reason(self, env_id: str, service: str) -> str | None:
        """Why a service's container ended, when the node knows more than its exit: "out of
        memory (limit 2048 MiB)" after the OOM killer; None otherwise."""
        ...
