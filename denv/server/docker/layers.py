"""Layer transfer of the Docker node: its volume layers packed, sent and fetched.

A layer leaves a node packed (a tar and its digest, made once and kept under
``<state>/packed/``), to another node or through object storage (``upload_layer``/
``fetch_layer``). Always as a stream, so memory stays bounded whatever the layer's size: a
node copies a layer from a peer (``copy_from``) by taking the peer's offer (``offer``: a
port that sends the packed file, see ``layer_stream``) and writing what arrives to a partial
file, hashed on the way; the store's transfers go file to file (``LayerStore``). What arrives
is checked against its digest before it becomes a layer (a partial file is removed when
anything fails, and ``drop_partial`` removes what a crash left), and stays packed for the
next node that asks. Each layer has its own lock, so one is packed or unpacked once however
many ask at the same time.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from denv.server.config import ObjectStoreConfig
from denv.server.docker import layer_stream
from denv.server.locks import NamedLocks
from denv.server.node.seam import LayerOffer
from denv.server.volumes.layerpack import (
    HashingWriter,
    LayerDigestMismatch,
    check_received,
    pack_layer,
    unpack_layer,
)
from denv.server.volumes.object_store import LayerStore
from denv.server.volumes.overlay import Volumes

log = logging.getLogger(__name__)


class LayerSource(Protocol):
    """A peer node's packed layers, as the node seam offers them (``Node.offer_layer``): a
    ``RemoteNode`` on a cluster, another ``DockerNode`` in tests."""

    def offer_layer(self, layer_id: str) -> LayerOffer: ...


Peers = Callable[[str], LayerSource]  # node name -> that node's layers (NodeLost if none)


class LayerTransfer:
    """The packed layers of one node's ``Volumes``. Safe to call from any thread."""

    def __init__(self, volumes: Volumes) -> None:
        self.volumes = volumes
        # packed layers: <state>/packed/<lyr_id>.{tar,digest}
        self.packed_dir = volumes.layers_dir.parent / "packed"
        self._locks = NamedLocks()
        self._guard = threading.Lock()  # over the dicts, never across a transfer
        self._stores: dict[ObjectStoreConfig, LayerStore] = {}

    def _lock(self, layer_id: str) -> threading.Lock:
        return self._locks(layer_id)

    def _packed(self, layer_id: str) -> tuple[Path, Path]:
        if not layer_id.startswith("lyr_") or "/" in layer_id:
            raise ValueError(f"not a layer id: {layer_id!r}")
        return self.packed_dir / f"{layer_id}.tar", self.packed_dir / f"{layer_id}.digest"

    def forget(self, layer_ids: list[str]) -> None:
        """Drop the packed copies of deleted layers (ids that are no layer ids: none)."""
        for layer_id in layer_ids:
            if layer_id.startswith("lyr_") and "/" not in layer_id:
                for path in self._packed(layer_id):
                    path.unlink(missing_ok=True)

    def drop_partial(self) -> None:
        """Remove what transfers cut short left (``*.part-*``)."""
        for part in self.packed_dir.glob("*.part-*"):
            part.unlink(missing_ok=True)

    def _pack(self, layer_id: str) -> tuple[str, Path]:
        """The packed layer (made once, kept) and its digest; under the layer's lock."""
        tar, digest_file = self._packed(layer_id)
        if tar.exists() and digest_file.exists():
            return digest_file.read_text(), tar
        layer = self.volumes.layer_path(layer_id)
        if not layer.is_dir():
            raise FileNotFoundError(f"layer {layer_id} is not on this node ({layer})")
        self.packed_dir.mkdir(parents=True, exist_ok=True)
        digest, _ = pack_layer(layer, tar)
        _write_atomic(digest_file, digest)
        return digest, tar

    def layer_digest(self, layer_id: str) -> str:
        with self._lock(layer_id):
            return self._pack(layer_id)[0]

    def offer(self, layer_id: str, host: str) -> LayerOffer:
        """The packed layer (packed first if need be) offered to one taker on ``host``."""
        with self._lock(layer_id):
            digest, tar = self._pack(layer_id)
            # Open now (a delete meanwhile cannot cut the stream); the offer's thread closes it.
            packed = open(tar, "rb")  # noqa: SIM115
        size = os.fstat(packed.fileno()).st_size
        port, token = layer_stream.offer(packed, host)
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return LayerOffer(address=address, token=token, digest=digest, size=size)

    def copy_from(self, layer_id: str, origin: str, source: LayerSource) -> int:
        """Copy the layer from a peer node (``origin``, its name for messages) as a stream:
        its offer's bytes into a partial file, hashed on the way, checked, unpacked and
        published. The bytes copied (0 when the layer is here already). Whatever fails (the
        peer stops answering: its NodeLost; a digest mismatch) leaves no partial file and no
        layer."""
        with self._lock(layer_id):
            tar, _ = self._packed(layer_id)  # checks it is a layer id, first
            if self._has(layer_id):
                return 0
            started = time.monotonic()
            taken = source.offer_layer(layer_id)  # packs it there, if it was not yet
            self.packed_dir.mkdir(parents=True, exist_ok=True)
            part = tar.with_name(f"{tar.name}.part-{os.getpid()}")
            try:
                streamed = time.monotonic()
                with open(part, "wb") as raw:
                    out = HashingWriter(raw)
                    layer_stream.receive(taken, out, origin)
                check_received(out, taken.digest, f"node {origin}")
                unpacked = time.monotonic()
                self._publish_packed(layer_id, taken.digest, part, checked=True)
            finally:
                part.unlink(missing_ok=True)
            log.info(
                "layer %s from node %s: %d bytes; offer %.2f s, stream %.2f s, unpack %.2f s",
                layer_id,
                origin,
                out.size,
                streamed - started,
                unpacked - streamed,
                time.monotonic() - unpacked,
            )
            return out.size

    def upload_layer(self, layer_id: str, store: ObjectStoreConfig) -> str:
        with self._lock(layer_id):
            digest, tar = self._pack(layer_id)
            layers = self._store(store)
            if layers.digest_of(layer_id) != digest:
                layers.put(layer_id, tar, digest)
            return digest

    def fetch_layer(self, layer_id: str, digest: str, store: ObjectStoreConfig) -> None:
        with self._lock(layer_id):
            tar, _ = self._packed(layer_id)  # checks it is a layer id, first
            if self._has(layer_id):
                return
            self.packed_dir.mkdir(parents=True, exist_ok=True)
            part = tar.with_name(f"{tar.name}.part-{os.getpid()}")
            try:
                stored = self._store(store).get(layer_id, part)
                if stored != digest:
                    raise LayerDigestMismatch(
                        f"the store holds layer {layer_id} with digest {stored}, expected "
                        f"{digest}: it was replaced in the store; upload it again from its "
                        "origin node"
                    )
                self._publish_packed(layer_id, digest, part, checked=True)
            finally:
                part.unlink(missing_ok=True)

    def _has(self, layer_id: str) -> bool:
        return self.volumes.layer_path(layer_id).is_dir()

    def _publish_packed(
        self, layer_id: str, digest: str, part: Path, checked: bool = False
    ) -> None:
        """Unpack a packed layer (its digest checked) as the layer, and keep it packed for
        other nodes."""
        unpack_layer(part, digest, self.volumes.layer_path(layer_id), checked=checked)
        tar, digest_file = self._packed(layer_id)
        os.replace(part, tar)
        _write_atomic(digest_file, digest)

    def _store(self, cfg: ObjectStoreConfig) -> LayerStore:
        with self._guard:
            found = self._stores.get(cfg)
        if found is None:  # made outside the guard: a boto3 client takes ~0.1 s to make
            made = LayerStore(cfg)
            with self._guard:
                found = self._stores.setdefault(cfg, made)
        return found


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.part-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
