"""A live child's root filesystem, the node's side: what its overlay stands on.

The group's env (the container's own server) writes the container's writable layer, Docker's
overlay2 ``UpperDir``, over the image's layers (``LowerDir``); a live child writes the upper
dir of its own root overlay (``volumes.rootfs``), over its ancestors' captures and those same
image layers. At a fork the parent's upper is captured and each child's overlay is that
capture over the parent's own lowers. A container whose storage driver is not overlay2 has
no layers to stand on: its children share its filesystem, as they did before (logged once).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from denv.server.records import LiveProc, VolumeSlot
from denv.server.volumes.overlay import Volumes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RootSource:
    """A live env's root filesystem: the upper dir it writes, and its lower dirs."""

    upper: Path
    lowers: list[str]


def image_layers(info: dict[str, object]) -> RootSource | None:
    """A container's writable layer and image layers from its inspect; None unless overlay2."""
    graph = info.get("GraphDriver")
    if not isinstance(graph, dict) or graph.get("Name") != "overlay2":
        return None
    data = graph.get("Data") or {}
    upper, lower = data.get("UpperDir"), data.get("LowerDir")
    if not upper or not lower:
        return None
    return RootSource(Path(upper), [_short(x) for x in str(lower).split(":") if x])


def _short(lower: str) -> str:
    """Docker's short name of a layer dir (``overlay2/l/<id>``, a link to it) where it has
    one: a deep image's lowers must fit in one page of mount options, as Docker's do."""
    diff = Path(lower)
    if diff.name != "diff":
        return lower
    try:
        link = (diff.parent / "link").read_text().strip()
    except OSError:
        return lower
    short = diff.parent.parent / "l" / link
    return str(short) if link and short.is_symlink() else lower


class Inspects(Protocol):
    """The engine's one call a live env's root is found with (``Engine.inspect``): typed
    here, since the engine imports this package (the launcher's container settings)."""

    def inspect(self, cid: str) -> dict[str, Any] | None: ...


class LiveRoots:
    """Where each live env's root filesystem stands (asked of the engine once a container)."""

    def __init__(self, engine: Inspects, volumes: Volumes) -> None:
        self.engine, self.volumes = engine, volumes
        self._images: dict[str, RootSource | None] = {}
        self._lock = threading.Lock()

    def base(self, env_id: str, volumes: list[VolumeSlot]) -> Path | None:
        """The volume dir whose filesystem holds a child's root upper (its first)."""
        if not volumes:
            return None
        return self.volumes.envs_dir / env_id / volumes[0].service / str(volumes[0].n)

    def source(self, env_id: str, proc: LiveProc, volumes: list[VolumeSlot]) -> RootSource | None:
        """What a live env's root filesystem is now; None when its children must share it
        (not overlay2, or a child made by a denv that gave children no root of their own)."""
        if not proc.slot:  # the group's own server: the container's layers
            return self._image(proc.container)
        lowers = self.volumes.rootfs.lowers(proc.group, env_id)
        if lowers is None:
            return None
        base = self.base(env_id, volumes)
        return RootSource(self.volumes.rootfs.upper_base(env_id, base) / "upper", lowers)

    def _image(self, container: str) -> RootSource | None:
        with self._lock:
            if container in self._images:
                return self._images[container]
        found = image_layers(self.engine.inspect(container) or {})
        if found is None:
            log.warning(
                "container %s is not on overlay2: its live children share its filesystem "
                "outside /work",
                container[:12],
            )
        with self._lock:
            self._images[container] = found
        return found

    def forget(self, container: str) -> None:
        with self._lock:
            self._images.pop(container, None)
