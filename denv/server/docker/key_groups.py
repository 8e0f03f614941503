"""Each API key's cgroup on this node, as envs boot and go (the files: ``cgroups``).

Which key each env here was booted for, and how many of each key's envs are booting: a
key's group gets the weight of its boots in flight (``cgroups.boot_shares``), is made only
for a key with an env here, and is removed once the key has none left. Docker's cgroupfs
driver only (asked of the engine once): with the systemd driver keys get no groups.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from denv.server.docker import cgroups
from denv.server.docker.engine import Engine


class KeyGroups:
    """The keys' groups of one node. Safe to call from any thread."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._owners: dict[str, str] = {}  # env id -> the API key it was booted for
        self._owners_lock = threading.Lock()
        self._boots: Counter[str] = Counter()  # API key -> its envs booting here
        self._cgroupfs: bool | None = None  # Docker's cgroup driver is cgroupfs (asked once)

    def add(self, env_id: str, owner: str) -> None:
        """The env is booting for ``owner`` (under the lock ``forget`` removes groups under)."""
        with self._owners_lock:
            self._owners[env_id] = owner

    def owner(self, env_id: str) -> str:
        """The key the env was booted for ("": unknown, e.g. an env from before a restart)."""
        return self._owners.get(env_id, "")

    @contextmanager
    def booting(self, owner: str, parent: str | None) -> Iterator[None]:
        """One more env of ``owner`` booting (made, then waited for): its key's group gets
        the weight of its boots in flight (``cgroups.boot_shares``) until it ends."""
        self._count_boot(owner, parent, 1)
        try:
            yield
        finally:
            self._count_boot(owner, parent, -1)

    def _count_boot(self, owner: str, parent: str | None, step: int) -> None:
        with self._owners_lock:  # the lock ``forget`` removes groups under
            self._boots[owner] += step
            boots = self._boots[owner]
            if boots <= 0:
                del self._boots[owner]
            if parent:  # made only for a key with an env here: a group outlives no env
                held = owner in self._owners.values()
                cgroups.set_key_shares(parent, cgroups.boot_shares(boots), make=held)

    def parent(self, owner: str) -> str | None:
        """The key's cgroup (``cgroups.key_parent``) where Docker's driver is cgroupfs."""
        return cgroups.key_parent(self.engine.instance_id, owner) if self._key_groups() else None

    def _key_groups(self) -> bool:
        """Whether keys get groups here: Docker's cgroup driver is cgroupfs (asked once)."""
        if self._cgroupfs is None:
            self._cgroupfs = self.engine.cgroup_driver() == "cgroupfs"
        return self._cgroupfs

    def forget(self, env_id: str) -> None:
        """The env is gone: remove the groups of keys with no env left on this node. Under
        the lock that ``add`` registers under, so a group a boot is about to use stays (a
        group still holding a container, e.g. of an env from before a restart, stays too:
        rmdir refuses it)."""
        groups = self._key_groups()  # also for an env from before a restart: no boot asked
        with self._owners_lock:
            self._owners.pop(env_id, None)
            if groups:
                busy = {
                    cgroups.key_parent(self.engine.instance_id, o) for o in self._owners.values()
                }
                cgroups.remove_key_parents(self.engine.instance_id, keep={p for p in busy if p})
