"""Images on a node: what the lifecycle reads of one (``ImageCalls``), and how a cluster's
members move them between nodes (``ImageNode``)."""

from __future__ import annotations

from typing import Protocol

from pydantic import Field

from denv.server.config import ObjectStoreConfig
from denv.server.records import Record

from .layers import LayerOffer


class ImageFacts(Record):
    """What an image is, read once per request: its id, its command, its labels."""

    id: str  # sha256:...: what a version pins
    command: list[str]  # Entrypoint and Cmd, as the engine runs them
    labels: dict[str, str] = Field(default_factory=dict)  # LABEL, e.g. ai.denv.fork


class ImageCalls(Protocol):
    """An image as the lifecycle needs it: the engine that holds it, and one look at it."""

    def engine_version(self) -> str: ...

    def inspect_image(self, image: str, pull: bool) -> ImageFacts:
        """Everything the lifecycle needs of an image, in one look (one remote call on a
        cluster): ``ImageNotFound`` when it is not there (pulled first with ``pull``)."""
        ...


class ImageNode(Protocol):
    """What one node of a cluster does with images, beside ``Node`` (a cluster's member:
    ``DockerNode``, ``RemoteNode``). Image ids are the engine's (``sha256:`` of the config),
    so an image is checked by its id wherever it came from. Each move is a stream (a saved
    image goes file to socket or store to file, and is loaded from the file), never the
    whole image in memory."""

    def has_image(self, image_id: str) -> bool: ...

    def offer_image(self, image_id: str) -> LayerOffer:
        """The image saved and offered to one taker (``copy_image`` on another node)."""
        ...

    def copy_image(self, image_id: str, origin: str) -> int:
        """Take node ``origin``'s offer of the image and load it: the bytes copied (0 when
        it is here). NodeLost naming ``origin`` when its stream fails."""
        ...

    def upload_image(self, image_id: str, store: ObjectStoreConfig) -> str:
        """The image saved into object storage (once); the saved tar's digest."""
        ...

    def fetch_image(self, image_id: str, digest: str, store: ObjectStoreConfig) -> None:
        """The image from object storage, its saved tar checked against ``digest``, loaded."""
        ...

    def pull_image(self, ref: str, image_id: str) -> None:
        """``ref`` pulled from its registry; ValueError when it is no longer ``image_id``."""
        ...

    def collect_images(
        self, budget_mb: int | None = None, recent_s: float | None = None
    ) -> list[str]:
        """Remove the images this node brought that no container uses, least recently used
        first, until they fit ``budget_mb`` (default: the node's); the ids removed."""
        ...
