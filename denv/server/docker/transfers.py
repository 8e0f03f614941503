"""The Docker node's transfers to and from other nodes and object storage: volume layers
(``TransferCalls``, through ``layers``) and images (``ImageNode``, through ``images``), each a
call of the part that does it. A part of ``DockerNode`` (``node.py``)."""

from __future__ import annotations

from typing import cast

from denv.server.config import ObjectStoreConfig
from denv.server.docker.engine import Engine
from denv.server.docker.images import ImageSource, NodeImages
from denv.server.docker.layers import LayerTransfer, Peers
from denv.server.node.seam import LayerOffer, NodeLost


class Transfers:
    """``DockerNode``'s layer and image transfers (a base class: it has what they use)."""

    engine: Engine
    layers: LayerTransfer
    images: NodeImages
    _peers: Peers | None
    _address: str

    # layer transfer (denv.server.docker.layers)
    def layer_digest(self, layer_id: str) -> str:
        return self.layers.layer_digest(layer_id)

    def offer_layer(self, layer_id: str) -> LayerOffer:
        return self.layers.offer(layer_id, self._address)

    def copy_layer(self, layer_id: str, origin: str) -> int:
        if self._peers is None:
            raise NodeLost(origin, "this node is in no cluster: it reaches no other node")
        return self.layers.copy_from(layer_id, origin, self._peers(origin))

    def upload_layer(self, layer_id: str, store: ObjectStoreConfig) -> str:
        return self.layers.upload_layer(layer_id, store)

    def fetch_layer(self, layer_id: str, digest: str, store: ObjectStoreConfig) -> None:
        self.layers.fetch_layer(layer_id, digest, store)

    # images moved between nodes (``ImageNode``; ``images``)
    def has_image(self, image_id: str) -> bool:
        return self.images.has(image_id)

    def offer_image(self, image_id: str) -> LayerOffer:
        return self.images.offer(image_id, self._address)

    def copy_image(self, image_id: str, origin: str) -> int:
        if self._peers is None:
            raise NodeLost(origin, "this node is in no cluster: it reaches no other node")
        return self.images.copy_from(image_id, origin, cast(ImageSource, self._peers(origin)))

    def upload_image(self, image_id: str, store: ObjectStoreConfig) -> str:
        return self.images.upload(image_id, store)

    def fetch_image(self, image_id: str, digest: str, store: ObjectStoreConfig) -> None:
        self.images.fetch(image_id, digest, store)

    def pull_image(self, ref: str, image_id: str) -> None:
        self.images.pull(ref, image_id, self.engine.pull_credentials)

    def collect_images(
        self, budget_mb: int | None = None, recent_s: float | None = None
    ) -> list[str]:
        if recent_s is None:
            return self.images.collect(budget_mb)
        return self.images.collect(budget_mb, recent_s)
