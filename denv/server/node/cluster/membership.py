"""Who is in the cluster, how each member is doing, and the map of what each holds.

Losing a member must rewrite the map at once (its envs become lost, its layers held nowhere
else), so the map (env, container, network and layer -> member) lives with the membership
and every call to a member goes through ``Members.call``, where a ``NodeLost`` makes the
membership decide whether the member is gone. The map's one lock (``Members.lock``) is the
lock of the whole cluster node: the parts that read or write the map (placement, layers,
images, routing) take it, never one of their own, so a step that reads a member's load and
counts an env on it is one step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple, TypeVar

from denv.server.node.errors import Refused, Unavailable
from denv.server.node.seam import Node, NodeLost, Owned

log = logging.getLogger(__name__)

T = TypeVar("T")
MEMBERS_REFRESH_S = 2.0  # how often the membership callback is asked (node joins and deaths)
ENGINE_DOWN_S = 30.0  # placement passes over a member this long after its engine failed


class Load(NamedTuple):
    """What a member carries: envs placed there, and bytes its envs used, last measured."""

    envs: int
    memory: int


class Members:
    """The members by name, the dead among them, and where each env, container, network and
    layer is. Thread-safe; its ``lock`` guards the maps below and is the cluster node's."""

    def __init__(self, members: Callable[[], Mapping[str, Node]]) -> None:
        self._members_fn = members
        self.lock = threading.RLock()
        self.nodes: dict[str, Node] = {}  # every member listed once, the dead among them
        self._members_at = 0.0
        self.dead: dict[str, str] = {}  # member name -> why it was found dead
        self.env: dict[str, str] = {}  # env id -> member
        self.cid: dict[str, str] = {}  # container id -> member
        self.net: dict[str, str] = {}  # network name -> member
        self.layers: defaultdict[str, set[str]] = defaultdict(set)  # layer -> members
        self.lost_envs: dict[str, str] = {}  # env id -> reason, until lost() hands it out
        self.memory: dict[str, int] = {}  # member -> bytes its envs used, last measured
        self._engine_down: dict[str, float] = {}  # member -> when its engine last did not answer

    def refresh(self, force: bool = False) -> None:
        """Ask the membership callback who is in (at most every ``MEMBERS_REFRESH_S``
        unless ``force``): a member no longer listed is dead, one listed again is back."""
        now = time.monotonic()
        with self.lock:
            if not force and now - self._members_at < MEMBERS_REFRESH_S:
                return
            self._members_at = now
        try:
            found = dict(self._members_fn())
        except Exception:
            log.exception("cluster: listing the nodes failed; keeping the last list")
            return
        returned = []
        with self.lock:
            for name in list(self.nodes):
                if name not in found and name not in self.dead:
                    self._mark_dead(name, f"node {name} left the cluster")
            for name, node in found.items():
                self.nodes[name] = node
                if name in self.dead:
                    self.dead.pop(name)
                    returned.append(name)
                    log.info("cluster: node %s is back", name)
        for name in returned:
            self._clean_returned(name)

    def _mark_dead(self, name: str, why: str) -> None:
        with self.lock:
            if name in self.dead:
                return
            self.dead[name] = why
            gone = [e for e, m in self.env.items() if m == name]
            for env_id in gone:
                self.lost_envs[env_id] = why
            for holders in self.layers.values():
                holders.discard(name)
            log.warning("cluster: %s; %d env(s) on it are lost", why, len(gone))

    def _clean_returned(self, name: str) -> None:
        """A member back from the dead keeps nothing of the envs it had (they were failed)."""
        node = self.nodes.get(name)
        if node is None:
            return
        try:
            owned = node.owned()
        except (NodeLost, Exception):
            return
        with self.lock:
            mine = {e for e, m in self.env.items() if m == name}
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

    def live(self) -> dict[str, Node]:
        """The members not found dead, by name (the list asked for again when it is old)."""
        self.refresh()
        with self.lock:
            return {n: m for n, m in self.nodes.items() if n not in self.dead}

    def call(self, name: str, fn: Callable[[Node], T]) -> T:
        """``fn`` of member ``name``; NodeLost when it is dead or does not answer."""
        with self.lock:
            node = self.nodes.get(name)
            dead = self.dead.get(name)
        if node is None or dead is not None:
            raise NodeLost(name)
        try:
            return fn(node)
        except NodeLost:
            # The membership decides: a member still listed had a passing failure (its
            # agent restarting); one no longer listed is dead, and its envs are lost.
            self.refresh(force=True)
            raise

    def member_of(self, env_id: str) -> str | None:
        with self.lock:
            return self.env.get(env_id)

    def on_env(self, env_id: str, fn: Callable[[Node], T]) -> T:
        """``fn`` of the member the env is on; NodeLost when no member holds it."""
        name = self.member_of(env_id)
        if name is None:
            raise NodeLost("(none)", f"no node holds {env_id}")
        return self.call(name, fn)

    def forget(self, env_id: str, containers: Iterable[str]) -> None:
        """The env and its containers are gone: they count on no member."""
        with self.lock:
            self.env.pop(env_id, None)
            self.lost_envs.pop(env_id, None)
            for cid in containers:
                self.cid.pop(cid, None)

    # load
    def loads(self) -> dict[str, Load]:
        """The live members' loads (as last known: no member is asked)."""
        with self.lock:
            envs = Counter(self.env.values())
            return {
                n: Load(envs[n], self.memory.get(n, 0)) for n in self.nodes if n not in self.dead
            }

    def layer_counts(self, layers: Iterable[str], names: Iterable[str]) -> dict[str, int]:
        """How many of ``layers`` each of the members ``names`` is known to hold."""
        wanted = set(layers)
        with self.lock:
            return {n: sum(1 for x in wanted if n in self.layers.get(x, ())) for n in names}

    def measure_memory(self) -> None:
        """Ask each member what its envs' containers use (placement weighs it)."""
        with self.lock:
            by_member: defaultdict[str, list[str]] = defaultdict(list)
            for cid, name in self.cid.items():
                by_member[name].append(cid)
        for name, cids in by_member.items():
            try:
                used = self.call(name, lambda n, c=cids: n.memory_bytes(c))  # type: ignore[misc]
            except Exception:
                continue
            with self.lock:
                self.memory[name] = used

    # A member whose Docker Engine does not answer (killed, restarting) while its agent does:
    # placement passes it over for a while, and calls any member answers try it last.
    def engine_failed(self, name: str) -> None:
        with self.lock:
            self._engine_down[name] = time.monotonic()

    def engines_down(self) -> frozenset[str]:
        now = time.monotonic()
        with self.lock:
            return frozenset(n for n, t in self._engine_down.items() if now - t < ENGINE_DOWN_S)

    def answering_first(self) -> list[str]:
        """The live members, those whose engine did not answer lately last."""
        down = self.engines_down()
        return sorted(self.live(), key=lambda n: n in down)

    def unanswered(self, name: str, exc: NodeLost | Refused) -> bool:
        """Whether `exc` from member `name` means that it did not answer (its agent is lost,
        or its agent answers and its engine does not, which is noted), so the next member
        is asked."""
        if isinstance(exc, NodeLost):
            return True
        if isinstance(exc, Unavailable):
            self.engine_failed(name)
            return True
        return False

    def first(self, fn: Callable[[Node], T]) -> T:
        """``fn`` of the first member that answers (a call any member answers)."""
        last: Exception | None = None
        for name in self.answering_first():
            try:
                return self.call(name, fn)
            except (NodeLost, Refused) as exc:
                if not self.unanswered(name, exc):
                    raise
                last = exc
        raise no_member_answers(last)

    # loss
    def lost(self) -> dict[str, str]:
        self.refresh()
        for name in list(self.live()):
            try:  # a cheap call: a member whose agent died raises NodeLost here
                self.call(name, lambda n: n.room())
            except NodeLost:
                continue
            except Exception:
                continue
        with self.lock:
            out, self.lost_envs = self.lost_envs, {}
        return out

    def lost_reason(self, env_id: str) -> str | None:
        name = self.member_of(env_id)
        with self.lock:
            return self.dead.get(name) if name is not None else None


def no_member_answers(last: Exception | None) -> Unavailable:
    """A call that no member of the cluster answered (`last`: the last failure)."""
    return Unavailable(
        "no node of the cluster answers"
        + (f" (last: {last})" if last else "")
        + ": check `denv cluster status` and the Ray cluster",
    )
