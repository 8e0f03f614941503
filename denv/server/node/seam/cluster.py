"""Placement and loss (``PlacementCalls``): a cluster's room, its dead nodes and where
layers are; one machine has no cap and loses nothing."""

from __future__ import annotations

from typing import Protocol


class PlacementCalls(Protocol):
    """Room, loss and where layers live, as the lifecycle asks before and after it writes."""

    def room(self) -> int | None:
        """How many more envs the node(s) accept now; None: no cap."""
        ...

    def room_beside(self, env_id: str) -> int | None:
        """How many more envs the node running ``env_id`` accepts now (where its live
        children would run; one machine: ``room()``); None: no cap."""
        ...

    def lost(self) -> dict[str, str]:
        """Envs that were on a node found dead since the last call: env id -> reason."""
        ...

    def lost_reason(self, env_id: str) -> str | None:
        """Why the env's node is lost (its envs fail with code ``lost``); None when it is
        not (or the env is unknown). Unlike :meth:`lost`, it hands nothing out."""
        ...

    def layer_nodes(self, layer_ids: list[str]) -> list[str]:
        """The nodes known to hold every one of the layers, least loaded first (a fork's
        spares there need no copy); what the node knows now, without asking around."""
        ...

    def layer_storage(self, layer_ids: list[str]) -> str:
        """Where a version's layers are kept: "node" (only on the node that made them),
        "uploading", "durable" (all in object storage) or "lost" (on no live node and not
        stored)."""
        ...
