"""Version lifetimes: the versions a sandbox or a fork made expire once nothing needs them.

A version made implicitly (``POST /v1/sandboxes``, a fork) is needed while an env not
deleted runs from it or a version not deleted comes from it (its children name it as their
parent). Once neither holds for ``--version-grace`` seconds it is deleted, and with it the
layers no other version names. Snapshots (``POST /v1/envs/{id}/snapshot``) and deployed
versions are kept until deleted by hand. A chain of fork versions goes leaf first: a parent
is idle from the pass that deletes its last child.

The server collects every ``--gc-interval`` seconds (``collect_forever``), and
``POST /v1/gc`` (``denv gc``) collects a key's at once; both report what they freed.
Versions a request in flight is about to start envs from are pinned (``pins``).

    freed = Collector(ctx, versions).collect(owner)   # Freed(versions=3, layers=3, bytes=...)
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from denv.server.lifecycle.context import Context
from denv.server.lifecycle.versions import Versions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    """A version a sandbox or a fork made, not deleted."""

    id: str
    owner: str
    parent_version_id: str | None
    created_at: str


@dataclass(frozen=True)
class Freed:
    versions: int = 0
    layers: int = 0
    bytes: int = 0


def expired(
    candidates: Iterable[Candidate],
    used: set[str],
    parents: dict[str, str | None],
    idle_since: dict[str, float],
    now_s: float,
    grace_s: float,
) -> tuple[list[str], dict[str, float]]:
    """The candidates to delete, children before their parents, and since when each other
    idle candidate has been idle.

    ``used``: versions an env not deleted runs; ``parents``: every version not deleted ->
    its parent version; ``idle_since``: what the last pass returned. A candidate is idle when
    it is not used and no version that stays names it as parent; it goes once it has been
    idle for ``grace_s``. Pure: the caller reads the database and keeps ``idle_since``.
    """
    children = Counter(p for p in parents.values() if p)
    by_id = {c.id: c for c in candidates}
    chosen: list[str] = []
    idle: dict[str, float] = {}
    ready = [c for c in by_id.values() if c.id not in used and children[c.id] == 0]
    while ready:  # each candidate is looked at once, and its parent when it goes
        c = ready.pop()
        since = idle_since.get(c.id, now_s)
        if now_s - since < grace_s:
            idle[c.id] = since
            continue
        chosen.append(c.id)
        parent = by_id.get(c.parent_version_id or "")
        if parent is not None:
            children[parent.id] -= 1
            if children[parent.id] == 0 and parent.id not in used:
                ready.append(parent)
    return chosen, idle


class Collector:
    """Deletes expired versions and their layers; one collection at a time."""

    def __init__(self, ctx: Context, versions: Versions) -> None:
        self.ctx = ctx
        self.versions = versions
        self._lock = threading.Lock()
        self._idle: dict[str, float] = {}  # version id -> time.monotonic() it went idle

    def collect(self, owner: str | None = None) -> Freed:
        """Delete the expired versions (of ``owner``'s, or everyone's) and the layers only
        they named; what was freed."""
        store = self.ctx.store
        with self._lock:
            candidates = [Candidate(*row) for row in store.implicit_versions(owner)]
            chosen, idle = expired(
                candidates,
                store.versions_in_use(),
                store.version_parents(),
                self._idle,
                time.monotonic(),
                self.ctx.config.version_grace_s,
            )
            if owner is None:
                self._idle = idle
            else:
                for c in candidates:
                    self._idle.pop(c.id, None)
                self._idle.update(idle)
            if not chosen:
                return Freed()
            by_id = {c.id: c for c in candidates}
            pins = self.ctx.pins
            with pins.lock:
                chosen = [
                    v for v in chosen if not pins.protects(v, by_id[v].owner, by_id[v].created_at)
                ]
                deleted = store.mark_versions_deleted_if_unused(chosen)
            layers: set[str] = set()
            for vid in deleted:
                rec = store.get_version(vid, include_deleted=True)
                layers |= {x for v in (rec.volumes if rec else []) for x in v.layers}
            count, size = self.versions.collect_layers(layers, keep_seeds=True)
        freed = Freed(versions=len(deleted), layers=count, bytes=size)
        if deleted:
            log.info(
                "collected %d expired version(s): %d layer(s), %d bytes freed",
                freed.versions,
                freed.layers,
                freed.bytes,
            )
        return freed


async def collect_forever(collector: Collector, interval_s: float) -> None:
    """Collect expired versions every ``interval_s`` seconds."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await asyncio.to_thread(collector.collect)
        except Exception:
            log.exception("version collection failed")
