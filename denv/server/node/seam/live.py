"""Live forks on a node (``live: true`` envs; see ``denv.server.docker.live``): the
server process of a live env copied into children (``LiveCalls``), and what a fork made
(``LiveForked``)."""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import Field

from denv.server.records import LiveProc, Record, VolumeSlot


class LiveForked(Record):
    """What ``LiveCalls.live_fork`` made: each volume's new stack (the parent's capture,
    which its children start from), each child's process or why it failed (in the order
    asked), and how long the steps took (ms)."""

    stacks: list[list[str]] = Field(default_factory=list)
    children: list[LiveProc | str] = Field(default_factory=list)
    timings_ms: dict[str, float] = Field(default_factory=dict)


class LiveCalls(Protocol):
    """A live env's server process: found, copied, asked, ended."""

    def live_root(self, env_id: str, container: str, port: int) -> LiveProc:
        """The server process of a booted live env."""
        ...

    def live_fork(
        self,
        parent_env: str,
        parent: LiveProc,
        volumes: list[VolumeSlot],
        children: list[tuple[str, int]],
        reseed: bool = True,
    ) -> LiveForked:
        """Copy the parent's process into each (env id, port). ``reseed``: each child draws
        fresh entropy for Python's ``random`` and NumPy's global generator; else it keeps
        the parent's state of both."""
        ...

    def live_alive(self, proc: LiveProc) -> bool: ...

    def live_modules(self, proc: LiveProc) -> list[str]:
        """The modules a live env's server has imported (LiveError when it cannot say)."""
        ...

    def live_preload(self, proc: LiveProc, modules: list[str]) -> dict[str, Any]:
        """Have a live env's server (a zygote) import these modules: its copies then do not
        import them in their first session. Answers what it did and any thread it now runs
        (``unknown_threads``: it cannot be copied any more)."""
        ...

    def live_exit_reason(self, env_id: str, proc: LiveProc) -> str | None:
        """Which limit of its own a live env whose process ended hit (out of memory, its
        pids), if one did."""
        ...

    def live_teardown(self, env_id: str, proc: LiveProc, last: bool) -> None:
        """End one live env's process and volumes; its group's container too when last."""
        ...

    def live_adopt(self, env_id: str, proc: LiveProc) -> None:
        """After a restart: the live env ``env_id`` still runs in its group's container (a
        cluster counts it on that node again; one machine has nothing to do)."""
        ...
