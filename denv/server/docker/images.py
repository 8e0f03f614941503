"""Images of one node's Docker Engine: brought from another node, the store or a registry,
and collected under a disk budget.

An image moves as what ``docker save`` writes, always as a stream: the engine's save goes
into a file (hashed on the way), which is offered to another node as a layer is
(``layer_stream``: the kernel sends the file, the taker reads it 1 MiB at a time into a
partial file) or uploaded to the store (``ImageStore``, multipart); the taker checks the
file's digest and hands the file to the engine's load, which reads it as a stream too. So
no hop holds the image in memory, whatever its size; the files are deleted once sent or
loaded. The image id is content-addressed (the sha256 of its config, against which the
engine checks every layer it loads), and a load that does not yield that id fails.

The images a node brought this way are recorded (``<state>/images.json``: id -> last use),
and only those are ever collected: an engine shared with other programs (a one-machine
cluster, the operator's own images) keeps everything else. ``collect`` removes, least
recently used first, brought images no container of the engine uses (running or not),
until the brought images' total size is within the budget.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import docker.errors

from denv.server.config import MIB, ObjectStoreConfig
from denv.server.docker import layer_stream
from denv.server.docker.sdk import DockerApi, engine_errors
from denv.server.node.seam import LayerOffer
from denv.server.volumes.image_store import ImageStore
from denv.server.volumes.layerpack import HashingWriter, check_received

log = logging.getLogger(__name__)

DEFAULT_BUDGET_MB = 20 * 1024  # the brought images one node keeps, in MiB (docker's sizes)
RECENT_S = 600.0  # an image used this recently is never collected (a boot may be about to)
SAVE_CHUNK = 1 << 20


class ImageSource(Protocol):
    """A peer node's images, as ``Node``-like agents offer them (``RemoteNode`` on a cluster)."""

    def offer_image(self, image_id: str) -> LayerOffer: ...


class NodeImages:
    """The images of one engine that this node moves and collects. Thread-safe."""

    def __init__(self, api: DockerApi, state_dir: Path, budget_mb: int = DEFAULT_BUDGET_MB):
        self._docker = api
        self.budget_mb = budget_mb
        self._dir = state_dir / "images"  # files being saved, received or fetched
        self._record = state_dir / "images.json"
        self._lock = threading.Lock()  # the record; one image moved at a time per id below
        self._moving: dict[str, threading.Lock] = {}

    # what the engine has
    def has(self, image_id: str) -> bool:
        with engine_errors():
            try:
                self._docker.api.inspect_image(image_id)
                return True
            except docker.errors.ImageNotFound:
                return False
            except docker.errors.APIError as exc:
                if exc.status_code in (400, 404):
                    return False
                raise

    def used(self, image_ids: Iterable[str]) -> None:
        """Images a boot is using: the last to be collected."""
        now = time.time()
        with self._lock:
            record = self._read()
            touched = [i for i in image_ids if i in record]
            for i in touched:
                record[i] = now
            if touched:
                self._write(record)

    # moving
    def offer(self, image_id: str, host: str) -> LayerOffer:
        """The image saved to a file (deleted once open), offered to one taker on ``host``."""
        path, digest, size = self._save(image_id)
        try:
            packed = open(path, "rb")  # noqa: SIM115 - the offer's thread closes it
        finally:
            path.unlink(missing_ok=True)
        port, token = layer_stream.offer(packed, host)
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return LayerOffer(address=address, token=token, digest=digest, size=size)

    def copy_from(self, image_id: str, origin: str, source: ImageSource) -> int:
        """The image from a peer node (``origin``, its name for messages): its offer streamed
        into a file, checked, loaded. The bytes copied (0 when it was here already)."""
        with self._moving_lock(image_id):
            if self.has(image_id):
                return 0
            started = time.monotonic()
            taken = source.offer_image(image_id)
            part = self._part(image_id)
            try:
                with open(part, "wb") as raw:
                    out = HashingWriter(raw)
                    layer_stream.receive(taken, out, origin)
                check_received(out, taken.digest, f"node {origin}")
                self._load(image_id, part)
            finally:
                part.unlink(missing_ok=True)
            log.info(
                "image %s from node %s: %d bytes in %.1f s",
                image_id[:19],
                origin,
                out.size,
                time.monotonic() - started,
            )
            return out.size

    def upload(self, image_id: str, store: ObjectStoreConfig) -> str:
        """The image saved into the store (once: kept when it is there); the saved tar's
        digest."""
        images = ImageStore(store)
        stored = images.digest_of(image_id)
        if stored is not None:
            return stored
        path, digest, _ = self._save(image_id)
        try:
            images.put(image_id, path, digest)
        finally:
            path.unlink(missing_ok=True)
        return digest

    def fetch(self, image_id: str, digest: str, store: ObjectStoreConfig) -> None:
        """The image from the store (``digest``: of its saved tar), checked and loaded."""
        with self._moving_lock(image_id):
            if self.has(image_id):
                return
            part = self._part(image_id)
            try:
                got = ImageStore(store).get(image_id, part)
                if got != digest:
                    raise ValueError(
                        f"the store holds image {image_id} saved with digest {got}, expected "
                        f"{digest}: it was replaced in the store"
                    )
                self._load(image_id, part)
            finally:
                part.unlink(missing_ok=True)

    def pull(self, ref: str, image_id: str, credentials: bool) -> None:
        """``ref`` pulled from its registry; ValueError when it is no longer ``image_id``."""
        with self._moving_lock(image_id), engine_errors():
            auth: dict[str, str] | None = None if credentials else {}
            try:
                self._docker.client.images.pull(ref, auth_config=auth)
                got = str(self._docker.api.inspect_image(ref)["Id"])
            except docker.errors.APIError as exc:  # its response does not cross Ray
                raise ValueError(f"pulling {ref} failed: {exc.explanation}") from None
            if got != image_id:
                raise ValueError(
                    f"{ref} in its registry is now {got}, not the {image_id} this env's "
                    "version pins"
                )
            self._brought(image_id)

    # collecting
    def collect(self, budget_mb: int | None = None, recent_s: float = RECENT_S) -> list[str]:
        """Remove brought images no container uses, least recently used first, until the
        brought images' size is within ``budget_mb`` (default: this node's budget); never
        one used within ``recent_s``. The ids removed."""
        budget = (self.budget_mb if budget_mb is None else budget_mb) * MIB
        with self._lock:
            record = self._read()
        with engine_errors():
            used = {str(c.get("ImageID", "")) for c in self._docker.api.containers(all=True)}
            sizes: dict[str, int] = {}
            for image_id in record:
                try:
                    sizes[image_id] = int(self._docker.api.inspect_image(image_id)["Size"])
                except docker.errors.NotFound:
                    continue  # removed by someone else
        total = sum(sizes.values())
        now, removed = time.time(), []
        for image_id in sorted(sizes, key=lambda i: record[i]):
            if total <= budget:
                break
            if image_id in used or now - record[image_id] < recent_s:
                continue
            try:
                with engine_errors():
                    self._docker.api.remove_image(image_id, force=True)
            except docker.errors.APIError as exc:  # a container made it meanwhile
                log.warning("image %s is kept: %s", image_id[:19], exc)
                continue
            total -= sizes[image_id]
            removed.append(image_id)
        with self._lock:
            record = self._read()
            gone = [i for i in record if i in removed or i not in sizes]
            for i in gone:
                record.pop(i, None)
            self._write(record)
        if removed:
            log.info(
                "images collected: %s (%d MiB kept of a %d MiB budget)",
                ", ".join(i[:19] for i in removed),
                total // MIB,
                budget // MIB,
            )
        return removed

    def drop_partial(self) -> None:
        """Remove what transfers cut short left."""
        if self._dir.is_dir():
            for part in self._dir.iterdir():
                part.unlink(missing_ok=True)

    # the parts
    def _moving_lock(self, image_id: str) -> threading.Lock:
        with self._lock:
            return self._moving.setdefault(image_id, threading.Lock())

    def _part(self, image_id: str) -> Path:
        self._dir.mkdir(parents=True, exist_ok=True)
        name = image_id.replace(":", "-").replace("/", "_")
        return self._dir / f"{name}.part-{os.getpid()}-{threading.get_ident()}"

    def _save(self, image_id: str) -> tuple[Path, str, int]:
        """``docker save`` of the image into a file, hashed on the way: (file, digest, size)."""
        part = self._part(image_id)
        part = part.with_name(part.name + ".save")
        try:
            with engine_errors(), open(part, "wb") as raw:
                out = HashingWriter(raw)
                for chunk in self._docker.api.get_image(image_id, chunk_size=SAVE_CHUNK):
                    out.write(chunk)
        except docker.errors.APIError as exc:  # its response does not cross Ray
            part.unlink(missing_ok=True)
            raise ValueError(f"saving image {image_id} failed: {exc.explanation}") from None
        except BaseException:
            part.unlink(missing_ok=True)
            raise
        return part, out.digest(), out.size

    def _load(self, image_id: str, tar: Path) -> None:
        """``docker load`` of a saved image, streamed from the file; ValueError when the
        engine reports an error or the image is then not there."""
        try:
            with engine_errors(), open(tar, "rb") as data:
                errors = [
                    str(line.get("error") or line.get("errorDetail"))
                    for line in self._docker.api.load_image(data)
                    if isinstance(line, dict) and (line.get("error") or line.get("errorDetail"))
                ]
        except docker.errors.APIError as exc:  # its response does not cross Ray
            errors = [str(exc.explanation)]
        if errors or not self.has(image_id):
            why = "; ".join(errors) or "the engine has no such image after loading"
            raise ValueError(f"loading image {image_id} failed: {why}")
        self._brought(image_id)

    def _brought(self, image_id: str) -> None:
        with self._lock:
            record = self._read()
            record[image_id] = time.time()
            self._write(record)

    def _read(self) -> dict[str, float]:
        try:
            found: Any = json.loads(self._record.read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): float(v) for k, v in found.items()} if isinstance(found, dict) else {}

    def _write(self, record: dict[str, float]) -> None:
        tmp = self._record.with_name(f"{self._record.name}.part-{os.getpid()}")
        tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
        os.replace(tmp, self._record)
