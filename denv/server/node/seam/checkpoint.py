"""Sandbox checkpoints on a node (``CheckpointCalls``): an env's running sandbox saved while
it keeps running (its memory, its processes, their open files and sockets' server side), so
that a fork's children resume from it instead of booting (``BootSpec.restore``), and what a
checkpoint made (``Checkpoint``).

A node whose runtime has no sandbox to save (runc: the env's processes run on this machine's
kernel) refuses ``checkpoint`` with ``CheckpointUnsupported``, and forks boot from the
snapshot of ``/work`` instead."""

from __future__ import annotations

from typing import Protocol

from denv.server.records import Record


class Checkpoint(Record):
    """What ``checkpoint`` saved: where on the node (``image``, the name children restore
    from), its size, and how long the save took (the parent was paused that long)."""

    env_id: str
    image: str
    bytes: int
    seconds: float


class CheckpointCalls(Protocol):
    """A running sandbox saved for its fork's children, and its image let go."""

    def checkpoint(self, env_id: str, container: str) -> Checkpoint:
        """Save the sandbox of ``container`` (the env's agent) while it keeps running.
        ``CheckpointUnsupported`` when the node's runtime cannot (the message says why)."""
        ...

    def drop_checkpoint(self, env_id: str, image: str) -> None:
        """Let go of a checkpoint's image once no child is left to restore from it
        (idempotent). Images a server never let go (it stopped) go at the next checkpoint
        once they are old."""
        ...
