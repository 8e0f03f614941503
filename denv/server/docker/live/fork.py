"""One live fork on the Docker node, step by step, and the parts every fork works with.

A fork (:class:`Fork`) takes its parent env's lock, gives each child its limits (the
container's raised by as much) and lends the parent the pids its clones hold, then asks
the launcher to fork (``launcher_fork``). While the parent waits at its gate the node
captures its volumes and copies its root filesystem's changes, and mounts each child's
volumes and root overlay (:meth:`Fork.capture`, :meth:`Fork.attach`); each child is placed
before its set-up, before it runs env code again: its port rules, its cgroups, its network
(:meth:`Fork.place`). A child that failed, or every child of a fork that failed, is released:
its mounts, cgroups, port rule or address (:meth:`Fork.release`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from denv.server.docker.live import cgroups, launcher_ctl, launcher_fork, port_rules
from denv.server.docker.live.netns import ContainerNet, LiveNet, NetError
from denv.server.docker.live.rootfs import Inspects, LiveRoots, RootSource
from denv.server.node.live import LiveError
from denv.server.node.seam import LiveForked
from denv.server.records import LiveProc, VolumeSlot
from denv.server.volumes.overlay import Volumes
from denv.server.volumes.rootfs import ROOT, RootFsError


class EnvLocks(Protocol):
    """The node's lock per env (``boot.BootControl``), which boots, teardowns and forks
    take: typed here, since the boot imports this package (the launcher's settings)."""

    def lock(self, env_id: str) -> threading.Lock: ...


class LiveParts:
    """What every live fork of this node works with: each live container's pid 1, its
    children's port rules or networks, what their root overlays stand on."""

    def __init__(
        self,
        engine: Inspects,
        volumes: Volumes,
        control: EnvLocks,
        live_netns: bool = False,
        merge_pages: bool = False,
    ) -> None:
        self.engine, self.volumes, self.control = engine, volumes, control
        self.rules = port_rules.Rules()  # live servers' port rules, per container
        # A network namespace per live child (``denv serve --live-netns on``), in place of
        # the port rules: the children's networks, per container.
        self.live_netns = live_netns
        self.nets = LiveNet()
        # A live container's pid 1 (with its start time), so that a delete of one of its
        # live envs does not ask the engine again: a live group's pid 1 outlives its envs.
        self._pids: dict[str, launcher_ctl.Proc] = {}
        self.merge_pages = merge_pages
        self.roots = LiveRoots(engine, volumes)  # what live children's root overlays stand on

    def container_pid(self, container: str) -> int:
        """The host pid of a container's pid 1; 0 when it does not run. The engine is asked
        once while that process lives (its start time tells a reused pid apart)."""
        known = self._pids.get(container)
        if known is not None and launcher_ctl.alive(known):
            return known.pid
        info = self.engine.inspect(container)
        pid = int(((info or {}).get("State") or {}).get("Pid") or 0)
        start = launcher_ctl.start_time(pid) if pid else None
        if start is None:
            self._pids.pop(container, None)
            return 0
        self._pids[container] = launcher_ctl.Proc(pid, start)
        return pid

    def container_net(self, container: str) -> ContainerNet:
        """The children's network of a container (found again after a restart)."""
        net = self.nets.known(container)
        if net is not None:
            return net
        pid = self.container_pid(container)
        if not pid:
            raise NetError("the env's container is not running")
        return self.nets.ensure(container, pid)

    def release(
        self, group: cgroups.Group, container: str, env_id: str, port: int, netns: bool
    ) -> None:
        """What a live server that is gone held: its cgroups, its port rule or address."""
        if netns:
            cgroups.release_cgroups(group, env_id)
            self.nets.release(container, env_id)
        else:
            self.rules.release(group, env_id, port)

    def forget(self, container: str) -> None:
        """The container is being removed: the host route to its children, its pid 1, its
        root's layers."""
        self.nets.forget(container)
        self._pids.pop(container, None)
        self.roots.forget(container)


class Fork:
    """One fork of ``parent`` (the live env ``parent_env``) into ``children`` (env id, port).

    Made before the fork's lock is taken: what the parent's root filesystem is (the engine
    asked once a container), so that only the copy of its changes is made while the parent
    waits at its gate.
    """

    # Set once the children's limits are made (``_limit``), before the launcher is asked.
    group: cgroups.Group
    net: ContainerNet | None  # the container's children's network (--live-netns on)

    def __init__(
        self,
        parts: LiveParts,
        parent_env: str,
        parent: LiveProc,
        slots: list[VolumeSlot],
        children: list[tuple[str, int]],
    ) -> None:
        self.parts, self.parent_env, self.parent, self.slots = parts, parent_env, parent, slots
        self.root: RootSource | None = parts.roots.source(parent_env, parent, slots)
        if parts.live_netns:  # each child serves the env's own port at an address of its own
            children = [(env_id, parent.port) for env_id, _ in children]
        self.children = children
        self.ids = [env_id for env_id, _ in children]
        self.stacks: list[list[str]] = []  # each volume's new stack: the parent's capture
        self.spent: dict[str, float] = {}  # ms of the node's own steps, for the fork's log line
        self.addrs: dict[str, str] = {}  # each child's address (--live-netns on)
        self.guarded: Future[None] | None = None  # the children's port rules, being made
        self.copy: Future[Path] | None = None  # the parent's root changes, being copied

    def run(self, reseed: bool) -> LiveForked:
        """Fork under the parent env's lock; then each child's process, or why it failed
        (released: nothing of it is left)."""
        specs = self.specs(reseed)
        with (
            self.parts.control.lock(self.parent_env),
            ThreadPoolExecutor(1, "denv-live-apart") as apart,
        ):
            procs, timings = self.fork(specs, apart)
        out = [
            self.result(env_id, port, proc)
            for (env_id, port), proc in zip(self.children, procs, strict=True)
        ]
        return LiveForked(stacks=self.stacks, children=out, timings_ms={**timings, **self.spent})

    def specs(self, reseed: bool) -> list[launcher_fork.ChildSpec]:
        """What the launcher is told of each child: its port, slots, root overlay."""
        work = launcher_ctl.WORK_DIR
        return [
            launcher_fork.ChildSpec(
                env_id,
                port,
                [(f"{work}/{env_id}/work-{s.n}", s.path) for s in self.slots],
                f"{work}/{env_id}/kids",
                reseed,
                self.parts.live_netns,
                f"{work}/{env_id}/{ROOT}" if self.root else "",
            )
            for env_id, port in self.children
        ]

    def fork(
        self, specs: list[launcher_fork.ChildSpec], apart: ThreadPoolExecutor
    ) -> tuple[list[launcher_ctl.Proc | LiveError], dict[str, float]]:
        """The launcher's fork, the port rules made meanwhile on ``apart``; every child is
        released when the fork fails as a whole."""
        group = self._limit()
        # The port rules, made while the parent gates and clones; each child enters its
        # cgroups before it is set up (before env code runs again).
        if not self.parts.live_netns:
            self.guarded = apart.submit(self.parts.rules.guard, group, self.children, False)
        parent = self.parent
        try:
            return launcher_fork.fork(
                launcher_ctl.forker(launcher_ctl.Proc(parent.pid, parent.start)),
                specs,
                self.capture,
                parent.depth,
                self.place,
                merge=self.parts.merge_pages,
            )
        except BaseException:  # no child: their cgroups, rules, addresses, limits, mounts go
            if self.guarded is not None:
                self.guarded.exception()
            for env_id, port in self.children:
                self._unplace(env_id, port)
                self._unmount(env_id)
            raise
        finally:
            with contextlib.suppress(cgroups.ApartError):
                cgroups.lend_pids(group, self.parent_env, -len(self.ids))

    def _limit(self) -> cgroups.Group:
        """Each child's limits (the root's), and the container's raised by as much, before
        the clones count there; the forker may hold its clones meanwhile."""
        try:
            self.group = group = cgroups.group_of(self.parent.pid)
            cgroups.limit(group, self.parent.group, self.ids)
            cgroups.lend_pids(group, self.parent_env, len(self.ids))
            live_netns = self.parts.live_netns
            self.net = self.parts.container_net(self.parent.container) if live_netns else None
        except (cgroups.ApartError, NetError) as exc:
            raise LiveError("live_fork_failed", str(exc)) from exc
        return group

    def slot_of(self, env_id: str) -> str:
        """Where a child's volumes and root overlay are mounted in its group's slot dir."""
        return f"{self.parent.slot}/kids/{env_id}" if self.parent.slot else env_id

    def capture(self) -> None:
        """The launcher's ``snapshot``: the parent waits at its gate meanwhile. Its root
        filesystem's changes are copied (by a process of its own) while /work is captured
        and the children's volumes are mounted, all at once."""
        volumes, rootfs = self.parts.volumes, self.parts.volumes.rootfs
        t0 = time.perf_counter()
        try:
            with ThreadPoolExecutor(max(1, min(len(self.ids), 8)), "denv-live-mount") as pool:
                if self.root is not None:
                    self.copy = pool.submit(self._copied, self.root.upper)
                new = [
                    volumes.capture(volumes.upper(self.parent_env, s.service, s.n))
                    for s in self.slots
                ]
                self.stacks.extend(
                    volumes.stack(layer, slot.layers)
                    for slot, layer in zip(self.slots, new, strict=True)
                )
                list(pool.map(self.attach, self.ids))
        except (RootFsError, OSError) as exc:
            raise LiveError("live_fork_failed", f"mounting the children failed: {exc}") from exc
        finally:
            copy = self.copy
            if copy is not None and copy.done() and copy.exception() is None:
                rootfs.done(self.parent.group, copy.result())
            self.spent["mount_ms"] = (time.perf_counter() - t0) * 1e3

    def _copied(self, upper: Path) -> Path:
        t0 = time.perf_counter()
        try:
            return self.parts.volumes.rootfs.capture(self.parent.group, self.parent_env, upper)
        finally:
            self.spent["rootfs_copy_ms"] = (time.perf_counter() - t0) * 1e3

    def attach(self, env_id: str) -> None:
        """Mount one child's volumes (the parent's new stacks) and its root overlay."""
        group, slot_dir = self.parent.group, self.slot_of(env_id)
        for slot, layers in zip(self.slots, self.stacks, strict=True):
            self.parts.volumes.attach_live(group, slot_dir, env_id, slot.service, slot.n, layers)
        if self.copy is not None and self.root is not None:  # on its volume's fs: after
            lowers = [str(self.copy.result()), *self.root.lowers]
            base = self.parts.roots.base(env_id, self.slots)
            self.parts.volumes.rootfs.attach(group, slot_dir, env_id, base, lowers)

    def place(self, env_id: str, pid: int) -> dict[str, Any] | None:
        """The launcher's ``placed``, for each child before its set-up: its port rules made,
        its process in its cgroups, its network connected (what its ``setup`` is told)."""
        if self.guarded is not None:
            self.guarded.result()
        cgroups.enter(self.group, env_id, pid)
        if self.net is None:
            return None
        cfg = self.parts.nets.attach(self.net, env_id, pid)
        self.addrs[env_id] = str(cfg["addr"]).split("/")[0]
        return cfg

    def release(self, env_id: str, port: int) -> None:
        """A child that failed: its mounts, then its cgroups, port rule or address."""
        self._unmount(env_id)
        self._unplace(env_id, port)

    def _unmount(self, env_id: str) -> None:
        self.parts.volumes.detach_live(self.parent.group, self.slot_of(env_id), env_id)
        self.parts.volumes.rootfs.release(self.parent.group, env_id)

    def _unplace(self, env_id: str, port: int) -> None:
        netns = self.parts.live_netns
        self.parts.release(self.group, self.parent.container, env_id, port, netns)

    def result(self, env_id: str, port: int, proc: launcher_ctl.Proc | LiveError) -> LiveProc | str:
        """A child's process (a copy of its parent's record), or why it failed."""
        if isinstance(proc, LiveError):
            self.release(env_id, port)
            return proc.message
        return self.parent.model_copy(
            update={
                "pid": proc.pid,
                "start": proc.start,
                "port": port,
                "depth": self.parent.depth + 1,
                "slot": self.slot_of(env_id),
                "addr": self.addrs.get(env_id, ""),
            }
        )
