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


EVERYTHING = Abilities()  # runc's: nothing taken away
