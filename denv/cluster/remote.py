"""``RemoteNode``: the node seam (``denv.server.node.seam.Node``) over a node agent's Ray actor.

Every call is ``NodeAgent.call(method, *args)`` on the agent's actor and blocks until it
answers, as ``DockerNode``'s calls do. Exceptions come back as their own class with all
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

from typing import Any, cast

import ray
import ray.exceptions

from denv.server.config import DOCKER_TIMEOUT_S, StoreConfig
from denv.server.node.errors import Unavailable
from denv.server.node.seam import (
    Booted,
    BootSpec,
    ImageFacts,
    LayerOffer,
    LiveForked,
    Metered,
    NodeLost,
    Owned,
    Usage,
)
from denv.server.records import LiveProc, VolumeSlot

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

    def _call(self, timeout_s: float, method: str, *args: Any) -> Any:
        try:
            ref = self.handle.call.remote(method, *args)
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

    # images and layers
    def engine_version(self) -> str:
        return cast(str, self._call(CALL_TIMEOUT_S, "engine_version"))

    def inspect_image(self, image: str, pull: bool) -> ImageFacts:
        timeout = LONG_TIMEOUT_S if pull else CALL_TIMEOUT_S
        return cast(ImageFacts, self._call(timeout, "inspect_image", image, pull))

    def seed_layer(self, image_id: str, path: str) -> str | None:
        return cast("str | None", self._call(LONG_TIMEOUT_S, "seed_layer", image_id, path))

    def has_layer(self, layer_id: str) -> bool:
        return cast(bool, self._call(CALL_TIMEOUT_S, "has_layer", layer_id))

    def layer_ids(self) -> set[str]:
        return cast(set[str], self._call(CALL_TIMEOUT_S, "layer_ids"))

    def delete_layers(self, layer_ids: list[str]) -> None:
        self._call(LONG_TIMEOUT_S, "delete_layers", layer_ids)

    def layer_sizes(self, layer_ids: list[str]) -> list[int]:
        return cast(list[int], self._call(LONG_TIMEOUT_S, "layer_sizes", layer_ids))

    def free_disk_bytes(self) -> int:
        return cast(int, self._call(CALL_TIMEOUT_S, "free_disk_bytes"))

    def drop_partial_layers(self) -> None:
        self._call(LONG_TIMEOUT_S, "drop_partial_layers")

    # one env
    def bring_up(self, spec: BootSpec) -> Booted:
        return cast(Booted, self._call(spec.timeout_s + BOOT_MARGIN_S, "bring_up", spec))

    def wait_healthy(self, spec: BootSpec, booted: Booted, timeout_s: float) -> None:
        self._call(timeout_s + BOOT_MARGIN_S, "wait_healthy", spec, booted, timeout_s)

    def mount_volumes(self, env_id: str, volumes: list[VolumeSlot]) -> None:
        self._call(CALL_TIMEOUT_S, "mount_volumes", env_id, volumes)

    def prioritize(self, env_id: str, containers: list[str]) -> None:
        self._call(CALL_TIMEOUT_S, "prioritize", env_id, containers)

    def snapshot(
        self, env_id: str, containers: list[str], volumes: list[VolumeSlot]
    ) -> list[list[str]]:
        return cast(
            list[list[str]], self._call(LONG_TIMEOUT_S, "snapshot", env_id, containers, volumes)
        )

    def changed_bytes(self, env_id: str, volumes: list[VolumeSlot], stop_after: int) -> list[int]:
        result = self._call(LONG_TIMEOUT_S, "changed_bytes", env_id, volumes, stop_after)
        return cast(list[int], result)

    def diff_layers(
        self, base: list[str], layers: list[str], limit: int
    ) -> tuple[list[tuple[str, str, int]], bool]:
        result = self._call(LONG_TIMEOUT_S, "diff_layers", base, layers, limit)
        return cast(tuple[list[tuple[str, str, int]], bool], result)

    def cancel(self, env_id: str) -> None:
        self._call(CALL_TIMEOUT_S, "cancel", env_id)

    def teardown(self, env_id: str, containers: list[str]) -> None:
        self._call(LONG_TIMEOUT_S, "teardown", env_id, containers)

    def stop(self) -> None:
        self._call(CALL_TIMEOUT_S, "stop")

    # what runs
    def states(self, env_id: str | None = None) -> dict[str, str]:
        return cast(dict[str, str], self._call(CALL_TIMEOUT_S, "states", env_id))

    def logs(self, env_id: str, service: str, tail: int) -> list[str]:
        return cast(list[str], self._call(CALL_TIMEOUT_S, "logs", env_id, service, tail))

    def memory_bytes(self, containers: list[str]) -> int:
        return cast(int, self._call(CALL_TIMEOUT_S, "memory_bytes", containers))

    def exit_reason(self, env_id: str, service: str) -> str | None:
        return cast("str | None", self._call(CALL_TIMEOUT_S, "exit_reason", env_id, service))

    def logs_after(
        self, env_id: str, service: str, cursor: str | None, tail: int, wait_s: float
    ) -> tuple[list[str], str | None]:
        args = (env_id, service, cursor, tail, wait_s)
        result = self._call(CALL_TIMEOUT_S + wait_s, "logs_after", *args)
        return cast(tuple[list[str], "str | None"], result)

    def usage(self, envs: list[Metered]) -> list[Usage]:
        return cast(list[Usage], self._call(CALL_TIMEOUT_S, "usage", envs))

    # live forks
    def live_root(self, env_id: str, container: str, port: int) -> LiveProc:
        return cast(LiveProc, self._call(LONG_TIMEOUT_S, "live_root", env_id, container, port))

    def live_fork(
        self,
        parent_env: str,
        parent: LiveProc,
        volumes: list[VolumeSlot],
        children: list[tuple[str, int]],
        reseed: bool = True,
    ) -> LiveForked:
        args = (parent_env, parent, volumes, children, reseed)
        result = self._call(LONG_TIMEOUT_S, "live_fork", *args)
        return cast(LiveForked, result)

    def live_alive(self, proc: LiveProc) -> bool:
        return cast(bool, self._call(CALL_TIMEOUT_S, "live_alive", proc))

    def live_modules(self, proc: LiveProc) -> list[str]:
        return cast("list[str]", self._call(CALL_TIMEOUT_S, "live_modules", proc))

    def live_preload(self, proc: LiveProc, modules: list[str]) -> dict[str, Any]:
        return cast("dict[str, Any]", self._call(LONG_TIMEOUT_S, "live_preload", proc, modules))

    def live_exit_reason(self, env_id: str, proc: LiveProc) -> str | None:
        return cast("str | None", self._call(CALL_TIMEOUT_S, "live_exit_reason", env_id, proc))

    def live_teardown(self, env_id: str, proc: LiveProc, last: bool) -> None:
        self._call(LONG_TIMEOUT_S, "live_teardown", env_id, proc, last)

    # placement and loss (what the agent's own DockerNode says: no cap, nothing lost)
    def room(self) -> int | None:
        return cast("int | None", self._call(CALL_TIMEOUT_S, "room"))

    def room_beside(self, env_id: str) -> int | None:
        return cast("int | None", self._call(CALL_TIMEOUT_S, "room_beside", env_id))

    def live_adopt(self, env_id: str, proc: LiveProc) -> None:
        self._call(CALL_TIMEOUT_S, "live_adopt", env_id, proc)

    def lost(self) -> dict[str, str]:
        return cast(dict[str, str], self._call(CALL_TIMEOUT_S, "lost"))

    def layer_nodes(self, layer_ids: list[str]) -> list[str]:
        return cast(list[str], self._call(CALL_TIMEOUT_S, "layer_nodes", layer_ids))

    def lost_reason(self, env_id: str) -> str | None:
        return cast(str | None, self._call(CALL_TIMEOUT_S, "lost_reason", env_id))

    def layer_storage(self, layer_ids: list[str]) -> str:
        return cast(str, self._call(CALL_TIMEOUT_S, "layer_storage", layer_ids))

    # layer transfer
    def layer_digest(self, layer_id: str) -> str:
        return cast(str, self._call(LONG_TIMEOUT_S, "layer_digest", layer_id))

    def offer_layer(self, layer_id: str) -> LayerOffer:
        return cast(LayerOffer, self._call(LONG_TIMEOUT_S, "offer_layer", layer_id))

    def copy_layer(self, layer_id: str, origin: str) -> int:
        return cast(int, self._call(LONG_TIMEOUT_S, "copy_layer", layer_id, origin))

    def upload_layer(self, layer_id: str, store: StoreConfig) -> str:
        return cast(str, self._call(LONG_TIMEOUT_S, "upload_layer", layer_id, store))

    def fetch_layer(self, layer_id: str, digest: str, store: StoreConfig) -> None:
        self._call(LONG_TIMEOUT_S, "fetch_layer", layer_id, digest, store)

    # images (``ImageNode``)
    def has_image(self, image_id: str) -> bool:
        return cast(bool, self._call(CALL_TIMEOUT_S, "has_image", image_id))

    def offer_image(self, image_id: str) -> LayerOffer:
        return cast(LayerOffer, self._call(LONG_TIMEOUT_S, "offer_image", image_id))

    def copy_image(self, image_id: str, origin: str) -> int:
        return cast(int, self._call(LONG_TIMEOUT_S, "copy_image", image_id, origin))

    def upload_image(self, image_id: str, store: StoreConfig) -> str:
        return cast(str, self._call(LONG_TIMEOUT_S, "upload_image", image_id, store))

    def fetch_image(self, image_id: str, digest: str, store: StoreConfig) -> None:
        self._call(LONG_TIMEOUT_S, "fetch_image", image_id, digest, store)

    def pull_image(self, ref: str, image_id: str) -> None:
        self._call(LONG_TIMEOUT_S, "pull_image", ref, image_id)

    def collect_images(
        self, budget_mb: int | None = None, recent_s: float | None = None
    ) -> list[str]:
        return cast(list[str], self._call(LONG_TIMEOUT_S, "collect_images", budget_mb, recent_s))

    # reconcile
    def owned(self) -> Owned:
        return cast(Owned, self._call(CALL_TIMEOUT_S, "owned"))

    def remove_owned(self, owned: Owned) -> None:
        self._call(LONG_TIMEOUT_S, "remove_owned", owned)

    def recover(
        self,
        env_id: str,
        containers: dict[str, str],
        volumes: list[VolumeSlot],
        states: dict[str, str],
    ) -> str | None:
        result = self._call(LONG_TIMEOUT_S, "recover", env_id, containers, volumes, states)
        return cast("str | None", result)
