"""Images across members: found by name on any member or in the store, brought to the member
an env is placed on, saved once into the store.

An env's services name their images by id (``ServiceSpec.image_digest``, the engine's
content-addressed id), so any copy is checked by it. A member that lacks one gets it, before
the env boots there: pulled from its registry when the image's name names one (a pull that
fails falls through to the rest), else copied from a live member that has it (a stream,
node to node), else fetched from the store. An image nowhere to be found fails the env with
the image's name and the member's. With a store, an image is saved into it once, in the
background, the first time the cluster finds it on a member, and its name is recorded
there (``ImageStore``), so it outlives every member that held it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from typing import cast

from denv.server.config import ObjectStoreConfig
from denv.server.node.errors import ImageNotFound, Refused
from denv.server.node.seam import BootFailed, ImageFacts, ImageNode, Node, NodeLost
from denv.server.records import ServiceSpec
from denv.server.volumes.image_store import ImageStore

from .membership import Members, no_member_answers
from .uploads import Uploads

log = logging.getLogger(__name__)

UPLOAD_ATTEMPTS = 3  # a store that closed a connection mid-upload (a busy SeaweedFS) is tried again
UPLOAD_RETRY_S = 5.0  # then 10 s


def names_registry(ref: str) -> bool:
    """Whether an image name names its registry (``ghcr.io/a/b``, ``localhost:5000/b``), as
    Docker reads it: a first path part with a dot or a port, or ``localhost``."""
    first, slash, _ = ref.partition("/")
    return bool(slash) and ("." in first or ":" in first or first == "localhost")


class Images:
    """The images of the members: where each is, bringing it, storing it; the seam's image
    calls (``ImageCalls``) for the cluster as a whole."""

    def __init__(self, members: Members, store: ObjectStoreConfig | None, uploads: Uploads) -> None:
        self._members = members
        self._uploads = uploads
        self._store_cfg = store
        self._image_store = ImageStore(store) if store is not None else None
        self._images_stored: dict[str, str] = {}  # image id -> its saved tar's digest
        self._image_uploads: set[str] = set()
        self._bringing: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)

    def engine_version(self) -> str:
        return self._members.first(lambda n: n.engine_version())

    def inspect_image(self, image: str, pull: bool) -> ImageFacts:
        """The image's facts from the first live member that has it, else from the store's
        record of its name, else pulled by a member (``pull``); ``ImageNotFound`` naming the
        image and the members asked."""
        asked: list[str] = []
        lost: Exception | None = None
        for name in self._members.answering_first():
            try:
                facts = self._members.call(name, lambda n: n.inspect_image(image, False))
            except (NodeLost, Refused) as exc:
                if self._members.unanswered(name, exc):
                    lost = exc
                elif isinstance(exc, ImageNotFound):
                    asked.append(name)
                else:
                    raise
                continue
            self._found_image(name, image, facts)
            return facts
        if not asked:  # no member answered: nothing could boot it anyway
            raise no_member_answers(lost)
        stored = self._stored_facts(image)
        if stored is not None:
            return stored
        if pull:
            facts = self._members.call(asked[0], lambda n: n.inspect_image(image, True))
            self._found_image(asked[0], image, facts)
            return facts
        where = f"any node of the cluster ({', '.join(asked)})"
        store = " nor in object storage" if self._image_store is not None else ""
        fix = "load it into a node's Docker Engine (docker load) or denv cluster up --image"
        raise ImageNotFound(
            f"image '{image}' is not on {where}{store}: {fix}"
            + ("" if pull else ", or pass pull: true"),
            image,
            asked,
        )

    def _found_image(self, name: str, ref: str, facts: ImageFacts) -> None:
        self._store_image_soon(name, ref, facts)

    def _stored_facts(self, ref: str) -> ImageFacts | None:
        if self._image_store is None:
            return None
        try:
            found = self._image_store.ref(ref)
        except Exception as exc:
            log.warning("cluster: looking up image %s in object storage failed: %s", ref, exc)
            return None
        if found is None:
            return None
        return ImageFacts.model_validate(found)

    def _store_image_soon(self, name: str, ref: str, facts: ImageFacts) -> None:
        """Save the image into the store once (in the background), with its name."""
        if self._store_cfg is None:
            return
        cfg = self._store_cfg
        with self._members.lock:
            if facts.id in self._images_stored or facts.id in self._image_uploads:
                return
            if self._uploads.stopped:
                return
            self._image_uploads.add(facts.id)
        self._uploads.submit(self._upload_image, name, ref, facts, cfg)

    def _upload_image(self, name: str, ref: str, facts: ImageFacts, cfg: ObjectStoreConfig) -> None:
        started = time.monotonic()
        for attempt in range(1, UPLOAD_ATTEMPTS + 1):
            try:
                digest = self._members.call(name, lambda n: _images(n).upload_image(facts.id, cfg))
                assert self._image_store is not None
                self._image_store.put_ref(ref, facts.model_dump(mode="json"))
                break
            except Exception as exc:
                log.warning(
                    "cluster: storing image %s from %s failed (attempt %d of %d): %s",
                    ref,
                    name,
                    attempt,
                    UPLOAD_ATTEMPTS,
                    exc,
                )
                with self._members.lock:
                    stopped = self._uploads.stopped
                if stopped or attempt == UPLOAD_ATTEMPTS or isinstance(exc, NodeLost):
                    with self._members.lock:  # the next create of it tries again
                        self._image_uploads.discard(facts.id)
                    return
                time.sleep(UPLOAD_RETRY_S * attempt)
        with self._members.lock:
            self._images_stored[facts.id] = digest
            self._image_uploads.discard(facts.id)
        log.info(
            "cluster: image %s (%s) stored from %s in %.1f s",
            ref,
            facts.id[:19],
            name,
            time.monotonic() - started,
        )

    def ensure(self, name: str, services: list[ServiceSpec]) -> None:
        """Every service's image on member ``name``; BootFailed naming the image and the
        member when it is nowhere to be found."""
        for svc in services:
            self.ensure_image(name, svc.image, svc.image_digest)

    def ensure_image(self, name: str, ref: str, image_id: str) -> None:
        with self._members.lock:
            bringing = self._bringing[(name, image_id)]
        # Asked each time (one call): the member may have collected it since.
        with bringing:  # envs of one image on one member: one copy, the others wait
            if not self._members.call(name, lambda n: _images(n).has_image(image_id)):
                self._bring_image(name, ref or image_id, image_id)

    def _bring_image(self, name: str, ref: str, image_id: str) -> None:
        started, tried = time.monotonic(), []
        if names_registry(ref):
            try:
                self._members.call(name, lambda n: _images(n).pull_image(ref, image_id))
                log.info("cluster: image %s pulled by %s", ref, name)
                return
            except (ValueError, Refused) as exc:
                tried.append(f"pulling it failed: {exc}")
        for origin in self._image_holders(image_id, exclude=name):
            try:
                size = self._members.call(
                    name,
                    lambda n, o=origin: _images(n).copy_image(image_id, o),  # type: ignore[misc]
                )
            except NodeLost as exc:
                if exc.node != origin:
                    raise
                tried.append(f"copying it from {origin} failed: {exc}")
                continue
            except Exception as exc:  # it collected the image meanwhile, a load failed...
                tried.append(f"copying it from {origin} failed: {exc}")
                continue
            log.info(
                "cluster: image %s copied from %s to %s (%d bytes, %.1f s)",
                ref,
                origin,
                name,
                size,
                time.monotonic() - started,
            )
            return
        digest = self._stored_image(image_id)
        if digest is not None and self._store_cfg is not None:
            cfg = self._store_cfg
            try:
                self._members.call(name, lambda n: _images(n).fetch_image(image_id, digest, cfg))
            except NodeLost:
                raise
            except Exception as exc:  # ObjectStoreError, a digest or load that failed
                tried.append(f"fetching it from object storage failed: {exc}")
            else:
                log.info(
                    "cluster: image %s fetched from object storage to %s (%.1f s)",
                    ref,
                    name,
                    time.monotonic() - started,
                )
                return
        why = "; ".join(tried) or "no live node has it and object storage does not hold it"
        raise BootFailed(
            "start_failed",
            f"image '{ref}' ({image_id[:19]}) is not on node {name} and could not be brought "
            f"there ({why}): load it into a node's Docker Engine (docker load), or make the "
            "version again from an image the cluster has",
        )

    def _image_holders(self, image_id: str, exclude: str) -> list[str]:
        found = []
        for n in self._members.live():
            if n == exclude:
                continue
            try:
                if self._members.call(n, lambda m: _images(m).has_image(image_id)):
                    found.append(n)
            except NodeLost:
                continue
        return found

    def _stored_image(self, image_id: str) -> str | None:
        with self._members.lock:
            if image_id in self._images_stored:
                return self._images_stored[image_id]
        if self._image_store is None:
            return None
        try:
            digest = self._image_store.digest_of(image_id)
        except Exception as exc:
            log.warning("cluster: looking up image %s in object storage failed: %s", image_id, exc)
            return None
        if digest is not None:
            with self._members.lock:
                self._images_stored[image_id] = digest
        return digest


def _images(node: Node) -> ImageNode:
    """A member as what it does with images (every member of a cluster is both)."""
    return cast(ImageNode, node)
