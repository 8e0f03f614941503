"""Packed volume layers in S3-compatible object storage (boto3): where versions become durable.

One object per layer, ``layers/<lyr_id>.tar`` (a :mod:`layerpack` file), its digest in the
object's metadata (``x-amz-meta-digest``), so a node learns what to expect before it
downloads, and checks it after. Transfers are multipart and concurrent (s3transfer), tuned for
a store on the same network: big parts, several in flight, no per-request checksum beyond the
layer's own digest (which covers every byte end to end).

boto3 comes with the ``cluster`` extra; it is imported when a :class:`LayerStore` is made, so
:class:`ObjectStoreConfig` (a plain record crossing the node seam) needs nothing installed.

Errors are :class:`ObjectStoreError`, naming the endpoint and bucket and what to do: the store does
not answer, refuses the credentials, lacks the bucket, or lacks the layer
(:class:`LayerNotInObjectStore`).
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from denv.server.config import ObjectStoreConfig
from denv.server.volumes.layerpack import check_digest

if TYPE_CHECKING:
    from boto3.s3.transfer import TransferConfig
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ObjectIdentifierTypeDef

log = logging.getLogger(__name__)

KEY_PREFIX = "layers/"
DIGEST_META = "digest"  # x-amz-meta-digest
PART_BYTES = 32 << 20  # multipart: parts of 32 MiB, 8 in flight (measured on loopback)
CONCURRENCY = 8
IO_QUEUE = 16  # 4 MiB of downloaded pieces waiting for the disk (s3transfer's default: 100)
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 120.0

_CREDENTIAL_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "InvalidToken",
    "403",
}
_MISSING_BUCKET_CODES = {"NoSuchBucket"}
_MISSING_KEY_CODES = {"NoSuchKey", "404", "NotFound"}


class ObjectStoreError(Exception):
    """The object store cannot do what was asked; the message says why and what to do."""


class LayerNotInObjectStore(ObjectStoreError):
    """The store holds no object for this layer."""


class LayerStore:
    """Packed layers in one bucket. Thread-safe (one boto3 client, shared)."""

    def __init__(self, cfg: ObjectStoreConfig) -> None:
        try:
            import boto3
            from boto3.s3.transfer import TransferConfig
            from botocore.config import Config
        except ImportError as e:  # pragma: no cover - the extra is installed in dev and CI
            raise ObjectStoreError("storing layers needs boto3: pip install 'denv[cluster]'") from e
        self.cfg = cfg
        self._where = f"object store {cfg.endpoint}, bucket {cfg.bucket!r}"
        config = Config(
            region_name=cfg.region,
            signature_version="s3v4",
            s3={"addressing_style": "path", "payload_signing_enabled": False},
            max_pool_connections=2 * CONCURRENCY,
            connect_timeout=CONNECT_TIMEOUT_S,
            read_timeout=READ_TIMEOUT_S,
            retries={"max_attempts": 3, "mode": "standard"},
            # The layer's sha256 covers every byte end to end; a CRC per part only costs CPU.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        self._s3: S3Client = boto3.session.Session().client(
            "s3",
            endpoint_url=cfg.endpoint,
            aws_access_key_id=cfg.access_key,
            aws_secret_access_key=cfg.secret_key,
            config=config,
        )
        self._transfer: TransferConfig = TransferConfig(
            multipart_threshold=PART_BYTES,
            multipart_chunksize=PART_BYTES,
            max_concurrency=CONCURRENCY,
            use_threads=True,
            # Downloads: what the threads read waits for the file's writer in a queue of
            # io_chunksize (256 KiB) pieces; bounded, so memory stays small when the disk lags.
            max_io_queue=IO_QUEUE,
        )

    @staticmethod
    def key(layer_id: str) -> str:
        return f"{KEY_PREFIX}{layer_id}.tar"

    def ensure_bucket(self) -> None:
        """Create the bucket unless it exists (idempotent)."""
        try:
            self._s3.head_bucket(Bucket=self.cfg.bucket)
            return
        except Exception as e:
            if _code(e) not in _MISSING_KEY_CODES | _MISSING_BUCKET_CODES:
                raise self._error(e, "checking the bucket") from e
        try:
            self._s3.create_bucket(Bucket=self.cfg.bucket)
        except Exception as e:
            if _code(e) not in {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}:
                raise self._error(e, "creating the bucket") from e

    def probe(self, key: str = ".denv-probe") -> None:
        """Write and delete a small object: the store answers, takes these credentials,
        has the bucket and can store (a fresh SeaweedFS needs a moment for that)."""
        try:
            self._s3.put_object(Bucket=self.cfg.bucket, Key=key, Body=b"denv")
            self._s3.delete_object(Bucket=self.cfg.bucket, Key=key)
        except Exception as e:
            raise self._error(e, "writing a probe object") from e

    def put(self, layer_id: str, packed: Path, digest: str) -> None:
        """Upload a packed layer with its digest (replaces any object of the same layer)."""
        try:
            self._s3.upload_file(
                str(packed),
                self.cfg.bucket,
                self.key(layer_id),
                ExtraArgs={"Metadata": {DIGEST_META: digest}},
                Config=self._transfer,
            )
        except Exception as e:
            raise self._error(e, f"uploading layer {layer_id}") from e

    def digest_of(self, layer_id: str) -> str | None:
        """The stored layer's digest; None when the store holds no such layer."""
        try:
            head = self._s3.head_object(Bucket=self.cfg.bucket, Key=self.key(layer_id))
        except Exception as e:
            if _code(e) in _MISSING_KEY_CODES:
                return None
            raise self._error(e, f"looking up layer {layer_id}") from e
        return head.get("Metadata", {}).get(DIGEST_META)

    def get(self, layer_id: str, dest: Path) -> str:
        """Download a layer into ``dest`` and check it has its stored digest; the digest.

        LayerNotInObjectStore when the store lacks it; LayerDigestMismatch (and no ``dest``) when
        the bytes are not what the digest says.
        """
        digest = self.digest_of(layer_id)
        if digest is None:
            raise LayerNotInObjectStore(
                f"layer {layer_id} is not in the {self._where}: it was never uploaded or was "
                "deleted; fetch it from its origin node instead"
            )
        part = dest.with_name(f"{dest.name}.part-{secrets.token_hex(4)}")
        try:
            try:
                self._s3.download_file(
                    self.cfg.bucket, self.key(layer_id), str(part), Config=self._transfer
                )
            except Exception as e:
                raise self._error(e, f"downloading layer {layer_id}") from e
            check_digest(part, digest)
            os.replace(part, dest)
        finally:
            part.unlink(missing_ok=True)
        return digest

    def delete(self, layer_ids: Iterable[str]) -> None:
        """Delete layers' objects (those already gone are fine)."""
        keys: list[ObjectIdentifierTypeDef] = [{"Key": self.key(x)} for x in layer_ids]
        for i in range(0, len(keys), 1000):  # the most one request deletes
            try:
                res = self._s3.delete_objects(
                    Bucket=self.cfg.bucket, Delete={"Objects": keys[i : i + 1000], "Quiet": True}
                )
            except Exception as e:
                raise self._error(e, "deleting layers") from e
            failed = [f"{x.get('Key')}: {x.get('Message')}" for x in res.get("Errors", [])]
            if failed:
                raise ObjectStoreError(f"{self._where} did not delete {', '.join(failed)}")

    def _error(self, e: BaseException, doing: str) -> ObjectStoreError:
        """The error to raise for ``e``, naming the store and the fix."""
        code = _code(e)
        if _unreachable(e):
            return ObjectStoreError(
                f"{doing}: the {self._where} does not answer ({e}); start it (denv cluster "
                "up starts SeaweedFS) or fix the endpoint"
            )
        if code in _CREDENTIAL_CODES:
            return ObjectStoreError(
                f"{doing}: the {self._where} refused the credentials (access key "
                f"{self.cfg.access_key!r}, {code}); use the access and secret key the store "
                "was set up with"
            )
        if code in _MISSING_BUCKET_CODES:
            return ObjectStoreError(
                f"{doing}: the {self._where} has no such bucket; create it "
                "(LayerStore.ensure_bucket, or the store's own tools)"
            )
        return ObjectStoreError(f"{doing}: the {self._where} failed: {e}")


def _causes(e: BaseException) -> Iterable[BaseException]:
    """``e`` and what it was raised from (boto3 wraps client errors of uploads)."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _code(e: BaseException) -> str | None:
    """The S3 error code (``NoSuchBucket``, ``403`` ...) of a client error, if any."""
    for err in _causes(e):
        response: Any = getattr(err, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            if code:
                return str(code)
    return None


def _unreachable(e: BaseException) -> bool:
    from botocore.exceptions import ConnectionClosedError, EndpointConnectionError

    unreachable = (EndpointConnectionError, ConnectionClosedError, ConnectionError)
    return any(isinstance(err, unreachable) for err in _causes(e))
