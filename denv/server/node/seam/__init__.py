"""The node seam: what one machine does for the envs placed on it.

A *node* is a machine that runs envs: it holds images, volume layers and each env's network,
volumes and containers. The server's lifecycle code (``envs``, ``warm``, ``versions``,
``reconcile``) asks a node for everything it needs done there and never touches Docker, the
host's mounts or cgroups itself. ``DockerNode`` (``denv.server.docker.node``) is the first
node: the local Docker Engine; ``RemoteNode`` (``denv.cluster.remote``) is a node agent on
another machine behind the same calls, and ``ClusterNode`` routes each call to one of those.

So every call takes and returns plain values: ids (``env_...``, ``lyr_...``, container ids),
strings, numbers, and *records*, frozen pydantic models that serialise to JSON unchanged
(``ServiceSpec``, ``VolumeSlot`` from ``records``; ``BootSpec``, ``Booted``, ``Owned`` here).
No live object, no callback crosses it; a boot is stopped by an explicit ``cancel``,
and its time limit is a number of seconds. Failures are exceptions holding plain values, of
one tree (``node.errors``), and none names an HTTP status: ``BootFailed`` (the env cannot
boot: a code for its ``error``), ``Cancelled``, ``NodeLost``, and the ``Refused`` ones
(``EngineUnavailable``, ``ImageNotFound``...), which the API answers as they are.

The calls, one protocol per capability, each in its own module with its records::

    images     ImageCalls      engine_version, inspect_image -> ImageFacts
               ImageNode       a cluster member's images: offered, copied, stored, pulled,
                               collected under its budget (streams, never a whole image)
    layers     LayerCalls      seed_layer, snapshot (freeze, capture, thaw), changed_bytes,
                               diff_layers, has_layer, layer_ids, layer_sizes, delete_layers,
                               free_disk_bytes, drop_partial_layers
               TransferCalls   layer_digest, offer_layer -> LayerOffer, copy_layer,
                               upload_layer, fetch_layer (streams, never a whole layer)
    boot       BootCalls       bring_up(BootSpec) -> Booted, wait_healthy, mount_volumes (a
                               spare's late mount), prioritize, cancel, teardown, stop
    watch      WatchCalls      states, logs, logs_after, memory_bytes, usage([Metered]) ->
                               [Usage], exit_reason
    checkpoint CheckpointCalls checkpoint -> Checkpoint (a running sandbox saved), and
                               drop_checkpoint; a fork's children restore from it
                               (BootSpec.restore)
    live       LiveCalls       live_root, live_fork -> LiveForked, live_alive, live_modules,
                               live_preload, live_exit_reason, live_teardown, live_adopt
    cluster    PlacementCalls  room, room_beside, lost, lost_reason, layer_nodes,
                               layer_storage (one machine: no cap, nothing lost)
    reconcile  ReconcileCalls  owned -> Owned, remove_owned, recover

``Node`` is all of them: what the lifecycle is given. A new capability is a protocol in a
module of its own here, added to ``Node``, and implemented on each side.
"""

from __future__ import annotations

import functools
import inspect
from typing import Protocol

# The failures the calls name, kept importable here (their tree: ``node.errors``).
from denv.server.node.errors import BootFailed as BootFailed
from denv.server.node.errors import Cancelled as Cancelled
from denv.server.node.errors import NodeLost as NodeLost

from .boot import BootCalls, Booted, BootSpec
from .checkpoint import Checkpoint, CheckpointCalls
from .cluster import PlacementCalls
from .images import ImageCalls, ImageFacts, ImageNode
from .layers import LayerCalls, LayerOffer, TransferCalls
from .live import LiveCalls, LiveForked
from .reconcile import Owned, ReconcileCalls
from .watch import Metered, Usage, WatchCalls


class Node(
    ImageCalls,
    LayerCalls,
    BootCalls,
    CheckpointCalls,
    WatchCalls,
    LiveCalls,
    PlacementCalls,
    ReconcileCalls,
    TransferCalls,
    Protocol,
):
    """One machine's part in running envs: every capability's calls. Every call blocks;
    callers run them in threads."""


# Computed once (the seam's calls are fixed at import): the names here, and the forwarders
# that check calls against them (node/cluster/routing.py, denv/cluster/remote.py).
@functools.cache
def seam_signatures() -> dict[str, inspect.Signature]:
    """Every call of the seam (``Node``'s capabilities, and ``ImageNode``): its signature.
    What a node agent answers and a remote node forwards (``denv.cluster``)."""
    return {
        name: inspect.signature(getattr(proto, name))
        for proto in (Node, ImageNode)
        for name in dir(proto)
        if not name.startswith("_") and callable(getattr(proto, name))
    }


NODE_CALLS = frozenset(seam_signatures())

__all__ = [
    "NODE_CALLS",
    "BootCalls",
    "BootFailed",
    "BootSpec",
    "Booted",
    "Cancelled",
    "Checkpoint",
    "CheckpointCalls",
    "ImageCalls",
    "ImageFacts",
    "ImageNode",
    "LayerCalls",
    "LayerOffer",
    "LiveCalls",
    "LiveForked",
    "Metered",
    "Node",
    "NodeLost",
    "Owned",
    "PlacementCalls",
    "ReconcileCalls",
    "TransferCalls",
    "Usage",
    "WatchCalls",
    "seam_signatures",
]
