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
from collections.abc import Callable, Mapping
from typing import cast

from denv.server.config import StoreConfig
from denv.server.node.errors import ImageNotFound, Refused, Unavailable
from denv.server.node.seam import BootFailed, ImageFacts, ImageNode, Node, NodeLost
from denv.server.records import ServiceSpec
from denv.server.volumes.image_store import ImageStore

from .layers import Layers
from .placement import NodeCaps

log = logging.getLogger(__name__)

UPLOAD_ATTEMPTS = 3  # a store that closed a connection mid-upload (a busy SeaweedFS) is tried again
UPLOAD_RETRY_S = 5.0  # then 10 s


def names_registry(ref: str) -> bool:
    """Whether an image name names its registry (``ghcr.io/a/b``, ``localhost:5000/b``), as
    Docker reads it: a first path part with a dot or a port, or ``localhost``."""
    first, slash, _ = ref.partition("/")
    return bool(slash) and ("." in first or ":" in first or first == "localhost")


ENGINE_DOWN_S = 30.0  # placement passes over a member this long after its engine failed


class Images(Layers):
    """Layers plus the images of the members: where each is, bringing it, storing it."""

    def __init__(
        self,
        members: Callable[[], Mapping[str, Node]],
        caps: NodeCaps | None = None,
        store: StoreConfig | None = None,
    ) -> None:
        super().__init__(members, caps, store)
        self._image_store = ImageStore(store) if store is not None else None
        self._images_stored: dict[str, str] = {}  # image id -> its saved tar's digest
        self._image_uploads: set[str] = set()
        self._bringing: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
        self._engine_down: dict[str, float] = {}  # member -> when its engine last did not answer

    # A member whose Docker Engine does not answer (killed, restarting) while its agent does:
    # placement passes it over for a while, and calls any member answers try it last.
    def _engine_failed(self, name: str) -> None:
        with self._lock:
            self._engine_down[name] = time.monotonic()

    def _engines_down(self) -> frozenset[str]:
        now = time.monotonic()
        with self._lock:
            return frozenset(n for n, t in self._engine_down.items() if now - t < ENGINE_DOWN_S)

    def _answering_first(self) -> list[str]:
        """The live members, those whose engine did not answer lately last."""
        down = self._engines_down()
        return sorted(self.live_members(), key=lambda n: n in down)

    def _unanswered(self, name: str, exc: NodeLost | Refused) -> bool:
        """Whether `exc` from member `name` means that it did not answer (its agent is lost,
        or its agent answers and its engine does not, which is noted), so the next member
        is asked."""
        if isinstance(exc, NodeLost):
            return True
        if isinstance(exc, Unavailable):
            self._engine_failed(name)
            return True
        return False

    def inspect_image(self, image: str, pull: bool) -> ImageFacts:
        """The image's facts from the first live member that has it, else from the store's
        record of its name, else pulled by a member (``pull``); ``ImageNotFound`` naming the
        image and the members asked."""
        asked: list[str] = []
        lost: Exception | None = None
        for name in self._answering_first():
            try:
                facts = self._call(name, lambda n: n.inspect_image(image, False))
            except (NodeLost, Refused) as exc:
                if self._unanswered(name, exc):
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
            facts = self._call(asked[0], lambda n: n.inspect_image(image, True))
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
        with self._lock:
            if facts.id in self._images_stored or facts.id in self._image_uploads:
                return
            if self._stopped:
                return
            self._image_uploads.add(facts.id)
        self._pool.submit(self._upload_image, name, ref, facts, cfg)

    def _upload_image(self, name: str, ref: str, facts: ImageFacts, cfg: StoreConfig) -> None:
        started = time.monotonic()
        for attempt in range(1, UPLOAD_ATTEMPTS + 1):
            try:
                digest = self._call(name, lambda n: _images(n).upload_image(facts.id, cfg))
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
                with self._lock:
                    stopped = self._stopped
                if stopped or attempt == UPLOAD_ATTEMPTS or isinstance(exc, NodeLost):
                    with self._lock:  # the next create of it tries again
                        self._image_uploads.discard(facts.id)
                    return
                time.sleep(UPLOAD_RETRY_S * attempt)
        with self._lock:
            self._images_stored[facts.id] = digest
            self._image_uploads.discard(facts.id)
        log.info(
            "cluster: image %s (%s) stored from %s in %.1f s",
            ref,
            facts.id[:19],
            name,
            time.monotonic() - started,
        )

    def _ensure_images(self, name: str, services: list[ServiceSpec]) -> None:
        """Every service's image on member ``name``; BootFailed naming the image and the
        member when it is nowhere to be found."""
        for svc in services:
            self._ensure_image(name, svc.image, svc.image_digest)

    def _ensure_image(self, name: str, ref: str, image_id: str) -> None:
        with self._lock:
            bringing = self._bringing[(name, image_id)]
        # Asked each time (one call): the member may have collected it since.
        with bringing:  # envs of one image on one member: one copy, the others wait
            if not self._call(name, lambda n: _images(n).has_image(image_id)):
                self._bring_image(name, ref or image_id, image_id)

    def seed_layer(self, image_id: str, path: str) -> str | None:
        """What the image has at ``path``, as a layer made on the least loaded member (the
        image brought there first)."""
        name = self._least_loaded()
        self._ensure_image(name, "", image_id)
        layer = self._call(name, lambda n: n.seed_layer(image_id, path))
        if layer:
            self._made(name, [layer])
        return layer

    def _bring_image(self, name: str, ref: str, image_id: str) -> None:
        started, tried = time.monotonic(), []
        if names_registry(ref):
            try:
                self._call(name, lambda n: _images(n).pull_image(ref, image_id))
                log.info("cluster: image %s pulled by %s", ref, name)
                return
            except (ValueError, Refused) as exc:
                tried.append(f"pulling it failed: {exc}")
        for origin in self._image_holders(image_id, exclude=name):
            try:
                size = self._call(name, lambda n, o=origin: _images(n).copy_image(image_id, o))  # type: ignore[misc]
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
                self._call(name, lambda n: _images(n).fetch_image(image_id, digest, cfg))
            except NodeLost:
                raise
            except Exception as exc:  # StoreError, a digest or load that failed
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
        for n in self.live_members():
            if n == exclude:
                continue
            try:
                if self._call(n, lambda m: _images(m).has_image(image_id)):
                    found.append(n)
            except NodeLost:
                continue
        return found

    def _stored_image(self, image_id: str) -> str | None:
        with self._lock:
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
            with self._lock:
                self._images_stored[image_id] = digest
        return digest


def no_member_answers(last: Exception | None) -> Unavailable:
    """A call that no member of the cluster answered (`last`: the last failure)."""
    return Unavailable(
        "no node of the cluster answers"
        + (f" (last: {last})" if last else "")
        + ": check `denv cluster status` and the Ray cluster",
    )


def _images(node: Node) -> ImageNode:
    """A member as what it does with images (every member of a cluster is both)."""
    return cast(ImageNode, node)
