"""Docker images in the object store, beside the layers: saved once, fetched by digest.

An image is stored as what ``docker save`` writes, one object ``images/<id>.tar`` keyed by
its image id (``sha256:...`` of its config, so content-addressed: ``docker load`` checks
every layer against the config), with the tar's own sha256 in its metadata as a layer's is
(``LayerStore``: multipart, ranged downloads, the digest checked after). A small JSON object
``image-refs/<name>.json`` per name an image was asked by (``denv-echo-env:latest``) holds
its id and facts, so a cluster whose nodes have all lost an image still knows it by name.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from denv.server.volumes.object_store import (
    _MISSING_KEY_CODES,
    LayerNotInObjectStore,
    LayerStore,
    _code,
)

IMAGE_PREFIX = "images/"
REF_PREFIX = "image-refs/"


def _check_image_id(image_id: str) -> str:
    algo, _, hexpart = image_id.partition(":")
    if algo != "sha256" or len(hexpart) != 64 or not all(c in "0123456789abcdef" for c in hexpart):
        raise ValueError(f"not an image id (sha256:<64 hex>): {image_id!r}")
    return hexpart


class ImageStore(LayerStore):
    """Saved images (and the names they were asked by) in the layers' bucket."""

    @staticmethod
    def key(layer_id: str) -> str:
        return f"{IMAGE_PREFIX}sha256-{_check_image_id(layer_id)}.tar"

    @staticmethod
    def ref_key(ref: str) -> str:
        return f"{REF_PREFIX}{base64.urlsafe_b64encode(ref.encode()).decode()}.json"

    def get(self, layer_id: str, dest: Path) -> str:
        """Download the saved image ``layer_id`` (its id) into ``dest``: ``LayerStore.get``."""
        try:
            return super().get(layer_id, dest)
        except LayerNotInObjectStore:
            raise LayerNotInObjectStore(
                f"image {layer_id} is not in the object store {self.cfg.endpoint}, bucket "
                f"{self.cfg.bucket!r}: it was never saved there or was deleted"
            ) from None

    def put_ref(self, ref: str, facts: dict[str, Any]) -> None:
        """Remember that the name ``ref`` is the image ``facts["id"]`` (replaces the last)."""
        body = json.dumps(facts).encode()
        try:
            self._s3.put_object(Bucket=self.cfg.bucket, Key=self.ref_key(ref), Body=body)
        except Exception as e:
            raise self._error(e, f"recording image {ref!r}") from e

    def ref(self, ref: str) -> dict[str, Any] | None:
        """The facts of the image stored under the name ``ref``; None when none is."""
        try:
            got = self._s3.get_object(Bucket=self.cfg.bucket, Key=self.ref_key(ref))
        except Exception as e:
            if _code(e) in _MISSING_KEY_CODES:
                return None
            raise self._error(e, f"looking up image {ref!r}") from e
        facts = json.loads(got["Body"].read())
        return facts if isinstance(facts, dict) else None

    def delete_ref(self, ref: str) -> None:
        """Forget the name ``ref`` (gone already: fine)."""
        try:
            self._s3.delete_object(Bucket=self.cfg.bucket, Key=self.ref_key(ref))
        except Exception as e:
            if _code(e) not in _MISSING_KEY_CODES:
                raise self._error(e, f"forgetting image {ref!r}") from e
