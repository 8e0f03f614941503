"""Who is in the cluster, and the map of what each member holds.

Losing a member must rewrite the map at once (its envs become lost, its layers held nowhere
else), so the map (env, container, network and layer -> member) lives with the membership
and every call to a member goes through ``_call``, where a ``NodeLost`` makes the membership
decide whether the member is gone. Placement, layers and routing build on this class, in that
order (``placement``, ``layers``, ``routing``); ``node.ClusterNode`` is the whole.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import TypeVar

from denv.server.node.seam import Node, NodeLost, Owned

log = logging.getLogger(__name__)

T = TypeVar("T")
MEMBERS_REFRESH_S = 2.0  # how often the membership callback is asked (node joins and deaths)


class Membership:
    """The members by name, the dead among them, and where each env, container, network and
    layer is."""

    def __init__(self, members: Callable[[], Mapping[str, Node]]) -> None:
        self._members_fn = members
        self._lock = threading.RLock()
        self._members: dict[str, Node] = {}
        self._members_at = 0.0
        self._dead: dict[str, str] = {}  # member name -> why it was found dead
        self._env: dict[str, str] = {}  # env id -> member
        self._cid: dict[str, str] = {}  # container id -> member
        self._net: dict[str, str] = {}  # network name -> member
        self._layers: defaultdict[str, set[str]] = defaultdict(set)  # layer -> members
        self._lost_envs: dict[str, str] = {}  # env id -> reason, until lost() hands it out

    def _refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            if not force and now - self._members_at < MEMBERS_REFRESH_S:
                return
            self._members_at = now
        try:
            found = dict(self._members_fn())
        except Exception:
            log.exception("cluster: listing the nodes failed; keeping the last list")
            return
        returned = []
        with self._lock:
            for name in list(self._members):
                if name not in found and name not in self._dead:
                    self._mark_dead(name, f"node {name} left the cluster")
            for name, node in found.items():
                self._members[name] = node
                if name in self._dead:
                    self._dead.pop(name)
                    returned.append(name)
                    log.info("cluster: node %s is back", name)
        for name in returned:
            self._clean_returned(name)

    def _mark_dead(self, name: str, why: str) -> None:
        with self._lock:
            if name in self._dead:
                return
            self._dead[name] = why
            gone = [e for e, m in self._env.items() if m == name]
            for env_id in gone:
                self._lost_envs[env_id] = why
            for holders in self._layers.values():
                holders.discard(name)
            log.warning("cluster: %s; %d env(s) on it are lost", why, len(gone))

    def _clean_returned(self, name: str) -> None:
        """A member back from the dead keeps nothing of the envs it had (they were failed)."""
        node = self._members.get(name)
        if node is None:
            return
        try:
            owned = node.owned()
        except (NodeLost, Exception):
            return
        with self._lock:
            mine = {e for e, m in self._env.items() if m == name}
        stale = Owned(
            containers={c: e for c, e in owned.containers.items() if e not in mine},
            networks={n: e for n, e in owned.networks.items() if e not in mine},
            volume_envs=[e for e in owned.volume_envs if e not in mine],
        )
        if stale.containers or stale.networks or stale.volume_envs:
            log.info("cluster: removing what node %s kept from before it was lost", name)
            try:
                node.remove_owned(stale)
            except Exception:
                log.exception("cluster: cleaning node %s failed", name)

    def live_members(self) -> dict[str, Node]:
        self._refresh()
        with self._lock:
            return {n: m for n, m in self._members.items() if n not in self._dead}

    def _call(self, name: str, fn: Callable[[Node], T]) -> T:
        with self._lock:
            node = self._members.get(name)
            dead = self._dead.get(name)
        if node is None or dead is not None:
            raise NodeLost(name)
        try:
            return fn(node)
        except NodeLost:
            # The membership decides: a member still listed had a passing failure (its
            # agent restarting); one no longer listed is dead, and its envs are lost.
            self._refresh(force=True)
            raise

    def _env_member(self, env_id: str) -> str | None:
        with self._lock:
            return self._env.get(env_id)

    # loss
    def lost(self) -> dict[str, str]:
        self._refresh()
        for name in list(self.live_members()):
            try:  # a cheap call: a member whose agent died raises NodeLost here
                self._call(name, lambda n: n.room())
            except NodeLost:
                continue
            except Exception:
                continue
        with self._lock:
            out, self._lost_envs = self._lost_envs, {}
        return out
