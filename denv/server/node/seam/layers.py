"""Volume layers on a node: captures of volumes (snapshot), their sizes and differences
(``LayerCalls``), and packed layers moved between nodes and object storage
(``TransferCalls``; see ``volumes.layerpack`` and ``volumes.object_store``)."""

from __future__ import annotations

from typing import Protocol

from pydantic import Field

from denv.server.config import ObjectStoreConfig
from denv.server.records import Record, VolumeSlot


class LayerOffer(Record):
    """A packed layer a node offers to one other node (``Node.offer_layer``): a TCP port on
    the offering node's address that sends the layer's bytes to the first connection that
    presents ``token``, for a short while. The taker checks ``digest`` over what it read."""

    address: str  # "host:port" on the offering node
    token: str = Field(repr=False)  # hex: random, one offer's, never logged
    digest: str  # "sha256:<hex>" of the packed layer
    size: int  # its bytes


class LayerCalls(Protocol):
    """A node's layers: made from an image or a running env's volumes, counted, compared,
    deleted."""

    def seed_layer(self, image_id: str, path: str) -> str | None:
        """A new layer with what the image has at ``path``; None when it has nothing."""
        ...

    def has_layer(self, layer_id: str) -> bool: ...

    def layer_ids(self) -> set[str]: ...

    def delete_layers(self, layer_ids: list[str]) -> None: ...

    def layer_sizes(self, layer_ids: list[str]) -> list[int]:
        """Bytes of disk each layer holds (0 for one not here); counted by walking its files,
        so the lifecycle asks once per layer and records the answer."""
        ...

    def free_disk_bytes(self) -> int:
        """Bytes free to the server on the disk its layers and volumes live on (a
        cluster: the fullest node's)."""
        ...

    def drop_partial_layers(self) -> None:
        """Remove half-made layers of a server that died mid-snapshot."""
        ...

    def snapshot(
        self, env_id: str, containers: list[str], volumes: list[VolumeSlot]
    ) -> list[list[str]]:
        """Freeze, turn each volume's changes into a layer, thaw: each volume's new stack."""
        ...

    def changed_bytes(self, env_id: str, volumes: list[VolumeSlot], stop_after: int) -> list[int]:
        """Disk each volume's changes use; counting stops past ``stop_after``."""
        ...

    def diff_layers(
        self, base: list[str], layers: list[str], limit: int
    ) -> tuple[list[tuple[str, str, int]], bool]:
        """Files that differ from one layer stack (newest first) to another, read from the
        layers: (path in the volume, added/modified/deleted, bytes), at most ``limit``, and
        whether more differ."""
        ...


class TransferCalls(Protocol):
    """Packed layers with a content digest, between nodes and to and from object storage."""

    def layer_digest(self, layer_id: str) -> str:
        """The digest ("sha256:<hex>") of the layer packed (once, then cached on the node)."""
        ...

    def offer_layer(self, layer_id: str) -> LayerOffer:
        """Offer the packed layer (packed first if need be) to one other node: a port that
        streams it to whoever presents the offer's token first (``copy_layer`` on that
        node), withdrawn unless taken within a minute."""
        ...

    def copy_layer(self, layer_id: str, origin: str) -> int:
        """Copy the layer from node ``origin`` of the same cluster: take its
        ``offer_layer``, stream the bytes into a partial file (hashed on the way), check the
        digest, unpack and publish (a no-op when the node has it); the bytes copied.
        NodeLost naming ``origin`` when that node does not answer or its stream breaks off,
        LayerDigestMismatch when the digest differs; either way no partial layer is left."""
        ...

    def upload_layer(self, layer_id: str, store: ObjectStoreConfig) -> str:
        """Store the packed layer in object storage unless stored already; its digest."""
        ...

    def fetch_layer(self, layer_id: str, digest: str, store: ObjectStoreConfig) -> None:
        """Download the layer from object storage, check ``digest``, unpack and publish it
        (a no-op when the node has it); ObjectStoreError, LayerNotInObjectStore,
        LayerDigestMismatch."""
        ...
