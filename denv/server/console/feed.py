"""What the console's pages are fed: each key's view (``console.tree``), made once per change.

The store says when it was written (``Store.watch``); the feed counts those writes (its
generation) and wakes every open event stream. A key's view is made again only when the
generation moved since it was last made, whoever asks: the page itself (which carries the
view it was rendered with, so it draws without waiting for its stream), each of the key's
streams, a reload. A stream that starts from the generation its page was rendered at sends
only what changed since.

    feed = Feed(store, base_url, keys)
    gen, nodes = feed.view(owner)
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict

from denv.server.console import tree
from denv.server.db import Store
from denv.server.tokens import IngressKeys

#: Views kept (one per key, the most recently used): a view of 1,000 nodes is about 300 KB.
MAX_VIEWS = 32


class Feed:
    """The store's write count, the views made at it, and the streams waiting for a write."""

    def __init__(self, store: Store, base_url: str, keys: IngressKeys | None) -> None:
        self.store = store
        self.base_url = base_url
        self.keys = keys
        self._lock = threading.Lock()
        self._gen = 0
        self._views: OrderedDict[str, tuple[int, dict[str, tree.Node]]] = OrderedDict()
        self._waiting: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        store.watch(self._written)

    def close(self) -> None:
        self.store.unwatch(self._written)

    def _written(self) -> None:
        with self._lock:
            self._gen += 1
            waiting = list(self._waiting)
        for loop, event in waiting:
            loop.call_soon_threadsafe(event.set)

    @property
    def generation(self) -> int:
        with self._lock:
            return self._gen

    def view(self, owner: str) -> tuple[int, dict[str, tree.Node]]:
        """The generation and the owner's view at it (made now only if it moved)."""
        with self._lock:
            gen = self._gen  # read first: a write while the view is made moves it on
            kept = self._views.get(owner)
            if kept is not None and kept[0] == gen:
                self._views.move_to_end(owner)
                return kept
        nodes = tree.view(self.store, owner, self.base_url, self.keys)
        with self._lock:
            self._views[owner] = (gen, nodes)
            self._views.move_to_end(owner)
            while len(self._views) > MAX_VIEWS:
                self._views.popitem(last=False)
        return gen, nodes

    def kept(self, owner: str, gen: int) -> dict[str, tree.Node] | None:
        """The owner's view at ``gen``, if it is the one kept."""
        with self._lock:
            kept = self._views.get(owner)
        return kept[1] if kept is not None and kept[0] == gen else None

    def subscribe(self) -> asyncio.Event:
        """An event set (on the caller's loop) after each write, until ``unsubscribe``."""
        event = asyncio.Event()
        with self._lock:
            self._waiting.add((asyncio.get_running_loop(), event))
        return event

    def unsubscribe(self, event: asyncio.Event) -> None:
        with self._lock:
            self._waiting = {w for w in self._waiting if w[1] is not event}
