"""``RemoteNode``: the node seam (``denv.server.node.seam.Node``) over a node agent's Ray actor.

Every call of the seam's protocols (``NODE_CALLS``: each capability's, and ``ImageNode``'s)
is forwarded as it is, without restating it here: ``NodeAgent.call(method, *args)`` on the
agent's actor, which blocks until it answers, as ``DockerNode``'s calls do. A new call of
the seam needs nothing here, only its time limit when it is not a quick one
(``LONG_CALLS``, ``time_limit``). Exceptions come back as their own class with all
their fields (``node.errors``: ``BootFailed``, ``Cancelled``, ``ImageNotFound``...; Ray's
``RayTaskError`` is unwrapped). A node that does not answer raises ``NodeLost(name)``: its
Ray node died (Ray's health checks notice within seconds), its agent died, or the call
outlived its time limit: a few seconds past the boot's own limit for ``bring_up`` and
``wait_healthy``, generous ones for layer transfers and pulls, and ``CALL_TIMEOUT_S`` for the
quick calls. A layer's bytes never cross Ray: the node that copies one takes its origin's
``offer_layer`` (a small record) and streams the bytes over a TCP connection of their own
(``layer_stream``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import ray
import ray.exceptions

from denv.server.config import DOCKER_TIMEOUT_S
from denv.server.node.errors import Unavailable
from denv.server.node.seam import NODE_CALLS, NodeLost, seam_signatures

CALL_TIMEOUT_S = float(DOCKER_TIMEOUT_S) + 30.0  # a quick call: a Docker call's limit and some
BOOT_MARGIN_S = 60.0  # past a boot's own time limit (the agent answers BootFailed first)
LONG_TIMEOUT_S = 1800.0  # pulls, image exports, snapshots, layer transfers


def _on_node(name: str, exc: Unavailable) -> Unavailable:
    """``exc`` (a node's engine does not answer) naming the node: on a cluster "start
    dockerd" alone does not say on which machine."""
    return exc.reworded(f"node {name}: {exc.message}", {**(exc.details or {}), "node": name})


class RemoteNode:
    """A node agent (``denv-node-<name>``) behind the ``Node`` calls. Thread-safe."""

    def __init__(self, name: str, handle: Any) -> None:
        self.name = name
        self.handle = handle  # ray.actor.ActorHandle of the NodeAgent

    def __repr__(self) -> str:
        return f"RemoteNode({self.name!r})"

    def _call(self, timeout_s: float, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            ref = self.handle.call.remote(method, *args, **kwargs)
            return ray.get(ref, timeout=timeout_s)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause
            if isinstance(cause, Unavailable):
                raise _on_node(self.name, cause) from None
            if isinstance(cause, Exception) and not isinstance(cause, ray.exceptions.RayError):
                raise cause from None  # BootFailed, Cancelled, ImageNotFound... as raised there
            raise NodeLost(self.name, f"{method} failed in Ray: {cause}") from exc
        except ray.exceptions.GetTimeoutError as exc:
            raise NodeLost(self.name, f"{method} got no answer within {timeout_s:.0f} s") from exc
        except ray.exceptions.RayError as exc:  # the actor or its node died, unschedulable...
            raise NodeLost(self.name, f"{type(exc).__name__} during {method}") from exc

    # the agent itself
    def info(self, timeout_s: float = CALL_TIMEOUT_S) -> dict[str, Any]:
        """The node's load and caps (see ``NodeAgent.info``)."""
        try:
            return cast(dict[str, Any], ray.get(self.handle.info.remote(), timeout=timeout_s))
        except ray.exceptions.RayError as exc:
            raise NodeLost(self.name, f"{type(exc).__name__} during info") from exc

    def ping(self, timeout_s: float = 10.0) -> str:
        """The agent's instance id; NodeLost when it does not answer in ``timeout_s``."""
        try:
            return cast(str, ray.get(self.handle.ping.remote(), timeout=timeout_s))
        except ray.exceptions.RayError as exc:
            raise NodeLost(self.name, f"{type(exc).__name__} during ping") from exc

    def __getattr__(self, method: str) -> Callable[..., Any]:
        """``method`` of the node seam, forwarded to the agent (AttributeError for a name
        that is not one: only the seam's calls cross)."""
        if method not in NODE_CALLS:
            raise AttributeError(f"{type(self).__name__!r} has no call {method!r}")

        def forward(*args: Any, **kwargs: Any) -> Any:
            return self._call(time_limit(method, args, kwargs), method, *args, **kwargs)

        forward.__name__ = method
        return forward


_SIGNATURES = seam_signatures()

# Calls that may take long: pulls, image exports, snapshots, layer transfers, teardowns.
LONG_CALLS = frozenset(
    {
        "seed_layer", "delete_layers", "layer_sizes", "drop_partial_layers",
        "snapshot", "changed_bytes", "diff_layers", "teardown", "live_root", "live_fork",
        "live_preload", "live_teardown", "layer_digest", "offer_layer", "copy_layer",
        "upload_layer", "fetch_layer", "offer_image", "copy_image", "upload_image",
        "fetch_image", "pull_image", "collect_images", "remove_owned", "recover",
        "checkpoint",
    }
)  # fmt: skip


def time_limit(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> float:
    """How long ``RemoteNode`` waits for ``method``'s answer before the node counts as lost:
    a boot's own limit and a margin (the agent answers BootFailed first), a log wait's own
    wait, a pull's long limit; else ``LONG_TIMEOUT_S`` or ``CALL_TIMEOUT_S``."""
    given = _SIGNATURES[method].bind(None, *args, **kwargs)
    given.apply_defaults()
    asked = given.arguments
    if method == "bring_up":
        return float(asked["spec"].timeout_s) + BOOT_MARGIN_S
    if method == "wait_healthy":
        return float(asked["timeout_s"]) + BOOT_MARGIN_S
    if method == "logs_after":
        return CALL_TIMEOUT_S + float(asked["wait_s"])
    if method == "inspect_image" and asked["pull"]:
        return LONG_TIMEOUT_S
    return LONG_TIMEOUT_S if method in LONG_CALLS else CALL_TIMEOUT_S
