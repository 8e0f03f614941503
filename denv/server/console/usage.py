"""What each key's envs use, memory and CPU, for the console's env list.

Sampled only while a console of the key is open (a stream of ``/ui/api/events`` watches it):
every ``SAMPLE_S`` the key's running envs are asked of the node (``Node.usage``: cgroup
files, a live env's own), and the streams are woken when what they show changed. CPU is the
share of one core used since the sample before. The page is sent only what changed, so it
never polls.

    meter = Meter(store, node)
    meter.watch(owner, event)       # from a stream; event set when the owner's usage moved
    gen, shown = meter.latest(owner)  # env id -> [memory MiB, CPU %]
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from denv.server.db import Store
from denv.server.node.seam import Metered, Node
from denv.server.records import FINAL, EnvRecord

log = logging.getLogger(__name__)

#: How often a watched key's envs are sampled; the second sample comes sooner, so CPU shows
#: soon after a page opens.
SAMPLE_S = 3.0
FIRST_S = 1.0
#: Keys whose last values are kept (a reload shows them at once).
MAX_KEPT = 32
ALL = 1_000_000
MIB = 1 << 20

Shown = dict[str, list[float | None]]  # env id -> [memory MiB, CPU % of one core]


def metered(rec: EnvRecord) -> Metered | None:
    """What to ask the node about ``rec`` (None: nothing of it runs)."""
    if rec.status in FINAL:
        return None
    if rec.runtime.live is not None:
        return Metered(env_id=rec.id, live=rec.runtime.live)
    if rec.runtime.containers:
        return Metered(env_id=rec.id, containers=list(rec.runtime.containers.values()))
    return None


@dataclass
class _Key:
    gen: int = 0
    shown: Shown = field(default_factory=dict)
    cpu: dict[str, tuple[float, float]] = field(default_factory=dict)  # id -> (when, CPU s)
    events: set[asyncio.Event] = field(default_factory=set)
    task: asyncio.Task[None] | None = None


class Meter:
    """Each watched key's sampling task and the values it last saw. Event loop only."""

    def __init__(self, store: Store, node: Node, interval_s: float = SAMPLE_S) -> None:
        self.store = store
        self.node = node
        self.interval_s = interval_s
        self._keys: OrderedDict[str, _Key] = OrderedDict()

    def watch(self, owner: str, event: asyncio.Event) -> None:
        key = self._key(owner)
        key.events.add(event)
        if key.task is None:
            key.task = asyncio.create_task(self._run(owner, key))

    def unwatch(self, owner: str, event: asyncio.Event) -> None:
        key = self._keys.get(owner)
        if key is None:
            return
        key.events.discard(event)
        if not key.events and key.task is not None:
            key.task.cancel()
            key.task = None

    def latest(self, owner: str) -> tuple[int, Shown]:
        key = self._keys.get(owner)
        return (key.gen, dict(key.shown)) if key is not None else (0, {})

    def close(self) -> None:
        for key in self._keys.values():
            if key.task is not None:
                key.task.cancel()

    def _key(self, owner: str) -> _Key:
        key = self._keys.get(owner)
        if key is None:
            key = self._keys[owner] = _Key()
            idle = [o for o, k in self._keys.items() if not k.events and o != owner]
            for o in idle[: max(0, len(self._keys) - MAX_KEPT)]:
                del self._keys[o]
        self._keys.move_to_end(owner)
        return key

    async def _run(self, owner: str, key: _Key) -> None:
        wait = FIRST_S
        while True:
            try:
                shown = await asyncio.to_thread(self._sample, owner, key)
            except asyncio.CancelledError:
                raise
            except Exception:  # the engine or a node is down: try again later
                log.debug("console: usage of %s not read", owner[:12], exc_info=True)
            else:
                if shown != key.shown:
                    key.shown = shown
                    key.gen += 1
                    for event in key.events:
                        event.set()
            await asyncio.sleep(wait)
            wait = self.interval_s

    def _sample(self, owner: str, key: _Key) -> Shown:
        recs = self.store.list_envs(owner, ALL, None, None, None, False)
        asked = [m for m in map(metered, recs) if m is not None]
        now = time.monotonic()
        found = self.node.usage(asked) if asked else []
        shown: Shown = {}
        cpu: dict[str, tuple[float, float]] = {}
        for u in found:
            mem = None if u.memory_bytes is None else _mib(u.memory_bytes)
            pct = None
            if u.cpu_s is not None:
                cpu[u.env_id] = (now, u.cpu_s)
                before = key.cpu.get(u.env_id)
                if before is not None and now > before[0]:
                    pct = max(0.0, round(100 * (u.cpu_s - before[1]) / (now - before[0])))
            shown[u.env_id] = [mem, pct]
        key.cpu = cpu
        return shown


def _mib(n: int) -> float:
    """MiB, whole past 10 (what changes by less is not sent again)."""
    mib = n / MIB
    return round(mib, 1) if mib < 10 else float(round(mib))


def diff(before: Shown, after: Shown) -> dict[str, object]:
    """What turns ``before`` into ``after``: entries new or changed, ids gone."""
    return {
        "set": {i: v for i, v in after.items() if before.get(i) != v},
        "remove": [i for i in before if i not in after],
    }
