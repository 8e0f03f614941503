"""What the sandboxes of a server's node cannot do, each with why (``Abilities``).

A runtime that takes something away (gVisor: no live launcher, no late mounts) says so here,
chosen by the composition root, and the lifecycle's admission refuses what it asks for up
front, naming the reason, without knowing which runtime it is.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Abilities:
    """Each field is why the node cannot do that thing, or None when it can."""

    # Why no env can run under the live launcher (its envs then start for volume forks).
    live: str | None = None
    # Why no warm spare can be kept (a spare's /work is mounted after it boots).
    spares: str | None = None
    # Why a fork's children cannot resume from a checkpoint of their parent's sandbox
    # (``CheckpointCalls``) and boot instead. Given, not taken away: runc has no sandbox.
    checkpoint: str | None = (
        "envs run under runc, on this machine's kernel: there is no sandbox to checkpoint"
    )


EVERYTHING = Abilities()  # runc's: nothing taken away (and no sandbox checkpoints)
