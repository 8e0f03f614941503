"""The Docker Engine node: the ``Node`` seam on this machine's Docker Engine and mounts.

Containers through ``Engine`` and networks through its ``networks``, volumes through
``Volumes`` (overlayfs on the host), cgroup files through ``cgroups``, the boot sequence in
``boot``, layer transfer to other nodes and object storage in ``layers``. A lock per env
(``boot.BootControl``, which the boot holds too) serialises what a boot makes with what a teardown
removes, and a cancelled boot makes nothing more: so ``cancel`` then ``teardown`` leaves
nothing behind, whatever a boot in flight was doing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

from denv.server.config import CPU_SHARES, MIB, ObjectStoreConfig
from denv.server.docker import boot, cgroups, logtail
from denv.server.docker.engine import Engine, container_name
from denv.server.docker.engine_queue import EngineQueue
from denv.server.docker.images import ImageSource, NodeImages
from denv.server.docker.layers import LayerTransfer, Peers
from denv.server.docker.live import cgroups as live_cgroups
from denv.server.docker.live import launcher_ctl as live
from denv.server.docker.live import launcher_fork, port_rules
from denv.server.docker.live import netns as live_net
from denv.server.docker.live.rootfs import LiveRoots
from denv.server.net.policy import network_name
from denv.server.node.live import LiveError
from denv.server.node.seam import (
    Booted,
    BootSpec,
    ImageFacts,
    LayerOffer,
    LiveForked,
    Metered,
    NodeLost,
    Owned,
    Usage,
)
from denv.server.records import Limits, LiveProc, VolumeSlot
from denv.server.volumes.layerdiff import diff_stacks
from denv.server.volumes.overlay import Volumes, disk_usage
from denv.server.volumes.rootfs import ROOT, RootFsError


class DockerNode:
    """This machine, through the Docker Engine. Safe to call from any thread."""

    def __init__(
        self,
        engine: Engine,
        volumes: Volumes,
        limits: Limits | None = None,
        peers: Peers | None = None,
        address: str = "127.0.0.1",
        live_netns: bool = False,
        merge_pages: bool = False,
    ) -> None:
        """``peers``: the other nodes of its cluster by name (a node agent's), so that
        ``copy_layer`` can reach them; None: a machine of its own, it has none. ``address``:
        where other nodes reach this one (its layer offers listen there). ``live_netns``: each
        live child gets a network namespace of its own (``live.netns``). ``merge_pages``: live
        roots mark their memory for the kernel's same-page merging before they fork
        (``denv serve --merge-pages``, ``ksm``)."""
        self.engine = engine
        self._peers, self._address = peers, address
        self.volumes = volumes
        self._limits = limits or Limits()
        self.control = boot.BootControl()  # the env locks boots share with teardown and snapshots
        self.layers = LayerTransfer(volumes)
        self.images = NodeImages(engine, volumes.layers_dir.parent)
        self.queue = EngineQueue()  # Docker calls that make or remove: the quietest key first
        self._owners: dict[str, str] = {}  # env id -> the API key it was booted for
        self._owners_lock = threading.Lock()
        self._boots: Counter[str] = Counter()  # API key -> its envs booting here
        self._cgroupfs: bool | None = None  # Docker's cgroup driver is cgroupfs (asked once)
        self.packed_dir = self.layers.packed_dir  # where tests and benches look for them
        self.rules = port_rules.Rules()  # live servers' port rules, per container
        # A network namespace per live child (``denv serve --live-netns on``), in place of
        # the port rules: the children's networks, per container.
        self.live_netns = live_netns
        self.net = live_net.LiveNet()
        # A live container's pid 1 (with its start time), so that a delete of one of its
        # live envs does not ask the engine again: a live group's pid 1 outlives its envs.
        self._pids: dict[str, live.Proc] = {}
        self.merge_pages = merge_pages
        self.roots = LiveRoots(engine, volumes)  # what live children's root overlays stand on

    # placement and loss: one machine, no cap of its own, nothing remote to lose
    def room(self) -> int | None:
        return None

    def room_beside(self, env_id: str) -> int | None:
        return self.room()

    def lost(self) -> dict[str, str]:
        return {}

    def layer_storage(self, layer_ids: list[str]) -> str:
        return "node"

    def layer_nodes(self, layer_ids: list[str]) -> list[str]:
        return ["local"]

    def lost_reason(self, env_id: str) -> str | None:
        return None

    # images and layers
    def engine_version(self) -> str:
        return self.engine.version()

    def inspect_image(self, image: str, pull: bool) -> ImageFacts:
        return self.engine.inspect_image(image, pull)

    def seed_layer(self, image_id: str, path: str) -> str | None:
        layer_id, tmp = self.volumes.new_layer_dir()
        try:
            has = self.engine.export_path(image_id, path, tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if not has:
            shutil.rmtree(tmp, ignore_errors=True)
            return None
        self.volumes.publish(layer_id, tmp)
        return layer_id

    def has_layer(self, layer_id: str) -> bool:
        return self.volumes.layer_path(layer_id).is_dir()

    def layer_ids(self) -> set[str]:
        return self.volumes.layer_ids()

    def delete_layers(self, layer_ids: list[str]) -> None:
        self.volumes.delete_layers(set(layer_ids))
        self.layers.forget(layer_ids)

    def layer_sizes(self, layer_ids: list[str]) -> list[int]:
        return [self.volumes.layer_size(x) for x in layer_ids]

    def free_disk_bytes(self) -> int:
        return self.volumes.free_bytes()

    def drop_partial_layers(self) -> None:
        self.volumes.clean_tmp()
        self.layers.drop_partial()
        self.images.drop_partial()

    # one env
    def bring_up(self, spec: BootSpec) -> Booted:
        with self._owners_lock:
            self._owners[spec.env_id] = spec.owner
        parent = self._key_parent(spec.owner)
        self.images.used(s.image_digest for s in spec.services)
        with self._booting(spec.owner, parent), self.queue.active(spec.owner):
            return boot.bring_up(
                self.engine, self.volumes, self.control, self._limits, spec, self.queue, parent
            )

    @contextlib.contextmanager
    def _booting(self, owner: str, parent: str | None) -> Iterator[None]:
        """One more env of ``owner`` booting (made, then waited for): its key's group gets
        the weight of its boots in flight (``cgroups.boot_shares``) until it ends."""
        self._count_boot(owner, parent, 1)
        try:
            yield
        finally:
            self._count_boot(owner, parent, -1)

    def _count_boot(self, owner: str, parent: str | None, step: int) -> None:
        with self._owners_lock:  # the lock ``_forget_owner`` removes groups under
            self._boots[owner] += step
            boots = self._boots[owner]
            if boots <= 0:
                del self._boots[owner]
            if parent:  # made only for a key with an env here: a group outlives no env
                held = owner in self._owners.values()
                cgroups.set_key_shares(parent, cgroups.boot_shares(boots), make=held)

    def _key_parent(self, owner: str) -> str | None:
        """The key's cgroup (``cgroups.key_parent``) where Docker's driver is cgroupfs."""
        return cgroups.key_parent(self.engine.instance_id, owner) if self._key_groups() else None

    def _key_groups(self) -> bool:
        """Whether keys get groups here: Docker's cgroup driver is cgroupfs (asked once)."""
        if self._cgroupfs is None:
            self._cgroupfs = self.engine.cgroup_driver() == "cgroupfs"
        return self._cgroupfs

    def _forget_owner(self, env_id: str) -> None:
        """The env is gone: remove the groups of keys with no env left on this node. Under
        the lock that ``bring_up`` registers under, so a group a boot is about to use stays
        (a group still holding a container, e.g. of an env from before a restart, stays too:
        rmdir refuses it)."""
        groups = self._key_groups()  # also for an env from before a restart: no boot asked
        with self._owners_lock:
            self._owners.pop(env_id, None)
            if groups:
                busy = {
                    cgroups.key_parent(self.engine.instance_id, o) for o in self._owners.values()
                }
                cgroups.remove_key_parents(self.engine.instance_id, keep={p for p in busy if p})

    def wait_healthy(self, spec: BootSpec, booted: Booted, timeout_s: float) -> None:
        with self._booting(spec.owner, self._key_parent(spec.owner)):
            boot.wait_healthy(self.engine, self.control, spec, booted, timeout_s)

    def mount_volumes(self, env_id: str, volumes: list[VolumeSlot]) -> None:
        with self.control.step(env_id):
            for slot in volumes:
                self.volumes.attach(env_id, slot.service, slot.n, slot.layers)

    def prioritize(self, env_id: str, containers: list[str]) -> None:
        with self.control.lock(env_id):
            self.control.foreground(env_id, True)
            for cid in containers or list(self.engine.states(env_id)):
                cgroups.set_cpu_shares(self.engine, cid, CPU_SHARES)

    def snapshot(
        self, env_id: str, containers: list[str], volumes: list[VolumeSlot]
    ) -> list[list[str]]:
        new_layers: list[str | None] = []
        with self.control.lock(env_id):
            frozen: list[tuple[str, str]] = []
            try:
                for cid in containers:  # no inspect first: freezing what does not run is a no-op
                    if how := cgroups.freeze(self.engine, cid):
                        frozen.append((cid, how))
                for slot in volumes:
                    upper = self.volumes.upper(env_id, slot.service, slot.n)
                    new_layers.append(self.volumes.capture(upper))
            finally:
                for cid, how in frozen:
                    cgroups.thaw(self.engine, cid, how)
        return [
            self.volumes.stack(layer, slot.layers)
            for slot, layer in zip(volumes, new_layers, strict=True)
        ]

    def changed_bytes(self, env_id: str, volumes: list[VolumeSlot], stop_after: int) -> list[int]:
        return [
            disk_usage(self.volumes.upper(env_id, slot.service, slot.n), stop_after)
            for slot in volumes
        ]

    def diff_layers(
        self, base: list[str], layers: list[str], limit: int
    ) -> tuple[list[tuple[str, str, int]], bool]:
        def stack(ids: list[str]) -> list[Path]:
            return [self.volumes.layer_path(x) for x in ids]

        changes, truncated = diff_stacks(stack(base), stack(layers), limit)
        return [(c.path, c.change, c.size) for c in changes], truncated

    def cancel(self, env_id: str) -> None:
        self.control.cancel(env_id)

    def teardown(self, env_id: str, containers: list[str]) -> None:
        with self.control.lock(env_id):
            owner = self._owners.get(env_id, "")
            for cid in containers:  # a live group's: the host route to its children
                self.net.forget(cid)
                self._pids.pop(cid, None)
                self.roots.forget(cid)
            for cid in set(containers) | set(self.engine.states(env_id)):
                with self.queue.slot(owner):
                    self.engine.remove(cid)
            with self.queue.slot(owner):
                self.engine.networks.remove(network_name(env_id))
            with self.queue.slot(owner):
                self.volumes.remove_env(env_id)
            self.control.foreground(env_id, False)
            self._forget_owner(env_id)

    def stop(self) -> None:
        self.control.stop()
        cgroups.remove_key_parents(self.engine.instance_id)
        if self.volumes.fs is not None:
            self.volumes.fs.drain()  # pooled volume filesystems: nothing of them outlives us

    # what runs
    def states(self, env_id: str | None = None) -> dict[str, str]:
        return self.engine.states(env_id)

    def logs(self, env_id: str, service: str, tail: int) -> list[str]:
        return self.engine.logs(container_name(env_id, service), tail)

    def memory_bytes(self, containers: list[str]) -> int:
        return sum(cgroups.memory_bytes(self.engine, cid) or 0 for cid in containers)

    def logs_after(
        self, env_id: str, service: str, cursor: str | None, tail: int, wait_s: float
    ) -> tuple[list[str], str | None]:
        cid = container_name(env_id, service)
        if cursor is None:
            got = logtail.last_lines(self.engine.api, cid, tail)
        else:
            got = logtail.lines_after(self.engine.api, cid, cursor, tail, wait_s)
        return ([], None) if got is None else got

    def usage(self, envs: list[Metered]) -> list[Usage]:
        """Read from cgroup files (no engine call): a container's in its key's group or
        Docker's, a live server's own (``live_cgroups.usage``)."""
        out = []
        for env in envs:
            mem: int | None = None
            cpu: float | None = None
            if env.live is not None:
                if live.alive(live.Proc(env.live.pid, env.live.start)):
                    mem, cpu = live_cgroups.usage(env.live.pid, env.live.group == env.env_id)
            elif env.containers:
                mems = [cgroups.cgroup_memory(cid) for cid in env.containers]
                cpus = [cgroups.cpu_seconds(cid) for cid in env.containers]
                mem = None if None in mems else sum(m or 0 for m in mems)
                cpu = None if None in cpus else sum(c or 0.0 for c in cpus)
            out.append(Usage(env_id=env.env_id, memory_bytes=mem, cpu_s=cpu))
        return out

    def exit_reason(self, env_id: str, service: str) -> str | None:
        info = self.engine.inspect(container_name(env_id, service))
        if not info or not (info.get("State") or {}).get("OOMKilled"):
            return None
        limit = int((info.get("HostConfig") or {}).get("Memory") or 0)
        return f"out of memory (limit {limit // MIB} MiB)" if limit else "out of memory"

    # reconcile
    def owned(self) -> Owned:
        return Owned(
            containers={
                c["Id"]: (c.get("Labels") or {}).get("denv.env", "")
                for c in self.engine.my_containers()
            },
            networks={
                n["Name"]: (n.get("Labels") or {}).get("denv.env", "")
                for n in self.engine.networks.mine()
            },
            volume_envs=[d.name for d in self.volumes.envs_dir.iterdir()],
        )

    def remove_owned(self, owned: Owned) -> None:
        for cid in owned.containers:
            self.engine.remove(cid)
        for name in owned.networks:
            self.engine.networks.remove(name)
        for env_id in owned.volume_envs:
            self.volumes.remove_env(env_id)
        cgroups.remove_key_parents(self.engine.instance_id)  # a stopped server's, emptied now
        self._prune_live_routes()

    def _prune_live_routes(self) -> None:
        """Host routes to live children's subnets whose container no longer runs (any
        server's: a route names only an address), left by a server that stopped before it
        removed its env's network (which takes the route with it)."""

        def running() -> set[str]:
            return {
                str(n.get("IPAddress") or "")
                for c in self.engine.api.containers()
                for n in ((c.get("NetworkSettings") or {}).get("Networks") or {}).values()
            } - {""}

        try:
            live_net.prune_routes(running)
        except Exception:  # the engine and `ip` are checked elsewhere: the routes stay
            return

    def recover(
        self,
        env_id: str,
        containers: dict[str, str],
        volumes: list[VolumeSlot],
        states: dict[str, str],
    ) -> str | None:
        for service, cid in containers.items():
            state = states.get(cid, "missing")
            cgroups.thaw(self.engine, cid)  # frozen by a snapshot that was interrupted
            if state == "paused":  # paused by one through docker
                self.engine.unpause(cid)
            elif state != "running":
                return f"the container of service '{service}' is {state}"
        for slot in volumes:
            mnt = self.volumes.mnt(env_id, slot.service, slot.n)
            if not os.path.ismount(mnt):
                return f"the volume {slot.path} of service '{slot.service}' is not mounted"
        return None

    # live forks (denv.server.docker.live)
    def live_root(self, env_id: str, container: str, port: int) -> LiveProc:
        """The server process of a booted ``live`` env, under its container's launcher."""
        pid = self._container_pid(container)
        if not pid:
            raise LiveError("live_fork_failed", "the env's container is not running")
        proc = live.root_process(pid)
        live.trial(proc)  # its copies can serve: else it runs without live forks
        try:  # kept off its live children's ports, as they are off its own and each other's
            group = live_cgroups.group_of(proc.pid)
            if self.live_netns:  # children in namespaces of their own, behind a bridge
                self.net.ensure(container, pid)
            else:
                self.rules.guard(group, [(env_id, port)], first=True)
            live_cgroups.limit(group, None, [env_id])
            live_cgroups.enter(group, env_id, proc.pid)
        except (live_cgroups.ApartError, live_net.NetError) as exc:
            raise LiveError("live_fork_failed", str(exc)) from exc
        return LiveProc(
            group=env_id, container=container, pid=proc.pid, start=proc.start, port=port
        )

    def live_fork(
        self,
        parent_env: str,
        parent: LiveProc,
        volumes: list[VolumeSlot],
        children: list[tuple[str, int]],
        reseed: bool = True,
    ) -> LiveForked:
        """Gate the parent, capture its volumes' and its root filesystem's changes, mount
        each child's volumes and root overlay in the group's slot dir, fork, plumb."""
        stacks: list[list[str]] = []
        rootfs = self.volumes.rootfs
        # What the parent's root filesystem is (the engine asked once a container), before
        # the gate: only the copy of its changes is made while the parent waits.
        root = self.roots.source(parent_env, parent, volumes)

        def slot_of(env_id: str) -> str:
            return f"{parent.slot}/kids/{env_id}" if parent.slot else env_id

        spent: dict[str, float] = {}  # ms of the node's own steps, for the fork's log line

        def copied(upper: Path) -> Path:
            t0 = time.perf_counter()
            try:
                return rootfs.capture(parent.group, parent_env, upper)
            finally:
                spent["rootfs_copy_ms"] = (time.perf_counter() - t0) * 1e3

        def capture() -> None:
            t0 = time.perf_counter()
            ids = [env_id for env_id, _ in children]
            copy: Future[Path] | None = None
            try:
                with ThreadPoolExecutor(max(1, min(len(ids), 8)), "denv-live-mount") as pool:
                    # The parent waits at its gate meanwhile. Its root filesystem's changes
                    # are copied (by a process of its own) while /work is captured and the
                    # children's volumes are mounted, all at once.
                    if root is not None:
                        copy = pool.submit(copied, root.upper)
                    new = [
                        self.volumes.capture(self.volumes.upper(parent_env, s.service, s.n))
                        for s in volumes
                    ]
                    stacks.extend(
                        self.volumes.stack(layer, slot.layers)
                        for slot, layer in zip(volumes, new, strict=True)
                    )

                    def attach(env_id: str) -> None:
                        for slot, layers in zip(volumes, stacks, strict=True):
                            self.volumes.attach_live(
                                parent.group, slot_of(env_id), env_id, slot.service, slot.n, layers
                            )
                        if copy is not None and root is not None:  # on its volume's fs: after
                            lowers = [str(copy.result()), *root.lowers]
                            base = self.roots.base(env_id, volumes)
                            rootfs.attach(parent.group, slot_of(env_id), env_id, base, lowers)

                    list(pool.map(attach, ids))
            except (RootFsError, OSError) as exc:
                raise LiveError("live_fork_failed", f"mounting the children failed: {exc}") from exc
            finally:
                if copy is not None and copy.done() and copy.exception() is None:
                    rootfs.done(parent.group, copy.result())
                spent["mount_ms"] = (time.perf_counter() - t0) * 1e3

        netns = self.live_netns
        if netns:  # each child serves the env's own port at an address of its own
            children = [(env_id, parent.port) for env_id, _ in children]
        specs = [
            launcher_fork.ChildSpec(
                env_id,
                port,
                [(f"{live.WORK_DIR}/{env_id}/work-{s.n}", s.path) for s in volumes],
                f"{live.WORK_DIR}/{env_id}/kids",
                reseed,
                netns,
                f"{live.WORK_DIR}/{env_id}/{ROOT}" if root else "",
            )
            for env_id, port in children
        ]
        addrs: dict[str, str] = {}
        with (
            self.control.lock(parent_env),
            ThreadPoolExecutor(1, "denv-live-apart") as apart,
        ):
            try:
                # Each child's limits (the root's), and the container's raised by as much,
                # before the clones count there; the forker may hold its clones meanwhile.
                group = live_cgroups.group_of(parent.pid)
                ids = [env_id for env_id, _ in children]
                live_cgroups.limit(group, parent.group, ids)
                live_cgroups.lend_pids(group, parent_env, len(ids))
                net = self._live_net(parent.container) if netns else None
            except (live_cgroups.ApartError, live_net.NetError) as exc:
                raise LiveError("live_fork_failed", str(exc)) from exc
            # The port rules, made while the parent gates and clones; each child enters its
            # cgroups before it is set up (before env code runs again).
            guarded = apart.submit(self.rules.guard, group, children, False) if not netns else None

            def placed(env_id: str, pid: int) -> dict[str, Any] | None:
                if guarded is not None:
                    guarded.result()
                live_cgroups.enter(group, env_id, pid)
                if net is None:
                    return None
                cfg = self.net.attach(net, env_id, pid)
                addrs[env_id] = str(cfg["addr"]).split("/")[0]
                return cfg

            try:
                procs, timings = launcher_fork.fork(
                    live.forker(live.Proc(parent.pid, parent.start)),
                    specs,
                    capture,
                    parent.depth,
                    placed,
                    merge=self.merge_pages,
                )
            except BaseException:  # no child: their cgroups, rules, addresses, limits, mounts go
                if guarded is not None:
                    guarded.exception()
                for env_id, port in children:
                    self._release_live(group, parent.container, env_id, port, netns)
                    self.volumes.detach_live(parent.group, slot_of(env_id), env_id)
                    rootfs.release(parent.group, env_id)
                raise
            finally:
                with contextlib.suppress(live_cgroups.ApartError):
                    live_cgroups.lend_pids(group, parent_env, -len(ids))
        out: list[LiveProc | str] = []
        for (env_id, port), proc in zip(children, procs, strict=True):
            if isinstance(proc, LiveError):
                self.volumes.detach_live(parent.group, slot_of(env_id), env_id)
                rootfs.release(parent.group, env_id)
                self._release_live(group, parent.container, env_id, port, netns)
                out.append(proc.message)
            else:
                out.append(
                    parent.model_copy(
                        update={
                            "pid": proc.pid,
                            "start": proc.start,
                            "port": port,
                            "depth": parent.depth + 1,
                            "slot": slot_of(env_id),
                            "addr": addrs.get(env_id, ""),
                        }
                    )
                )
        return LiveForked(stacks=stacks, children=out, timings_ms={**timings, **spent})

    def _live_net(self, container: str) -> live_net.ContainerNet:
        """The children's network of a container (found again after a restart)."""
        net = self.net.known(container)
        if net is not None:
            return net
        pid = self._container_pid(container)
        if not pid:
            raise live_net.NetError("the env's container is not running")
        return self.net.ensure(container, pid)

    def _release_live(
        self, group: live_cgroups.Group, container: str, env_id: str, port: int, netns: bool
    ) -> None:
        """What a live server that is gone held: its cgroups, its port rule or address."""
        if netns:
            live_cgroups.release_cgroups(group, env_id)
            self.net.release(container, env_id)
        else:
            self.rules.release(group, env_id, port)

    def live_exit_reason(self, env_id: str, proc: LiveProc) -> str | None:
        """Which limit of its own a live env whose process ended hit, if one did."""
        group = self._live_group(proc.container)
        return live_cgroups.exit_reason(group, env_id) if group else None

    def _container_pid(self, container: str) -> int:
        """The host pid of a container's pid 1; 0 when it does not run. The engine is asked
        once while that process lives (its start time tells a reused pid apart)."""
        known = self._pids.get(container)
        if known is not None and live.alive(known):
            return known.pid
        info = self.engine.inspect(container)
        pid = int(((info or {}).get("State") or {}).get("Pid") or 0)
        start = live.start_time(pid) if pid else None
        if start is None:
            self._pids.pop(container, None)
            return 0
        self._pids[container] = live.Proc(pid, start)
        return pid

    def _live_group(self, container: str) -> live_cgroups.Group | None:
        """The live servers' cgroups of a running container (found from its pid 1, which
        outlives them), or None."""
        pid = self._container_pid(container)
        if not pid:
            return None
        try:
            return live_cgroups.group_of(pid)
        except live_cgroups.ApartError:
            return None

    def live_alive(self, proc: LiveProc) -> bool:
        return live.alive(live.Proc(proc.pid, proc.start))

    def live_modules(self, proc: LiveProc) -> list[str]:
        try:
            return live.modules(live.Proc(proc.pid, proc.start))
        except (OSError, ValueError, LiveError) as exc:
            raise LiveError("live_fork_failed", f"asking its launcher failed: {exc}") from exc

    def live_preload(self, proc: LiveProc, modules: list[str]) -> dict[str, Any]:
        try:
            return live.preload(live.Proc(proc.pid, proc.start), modules)
        except (OSError, ValueError, LiveError) as exc:
            raise LiveError("live_fork_failed", f"asking its launcher failed: {exc}") from exc

    def live_teardown(self, env_id: str, proc: LiveProc, last: bool) -> None:
        """End one live env: its process, its volume slots; the container with the last."""
        with self.control.lock(env_id):
            group = None if last else self._live_group(proc.container)
            live.kill(live.Proc(proc.pid, proc.start))
            netns = bool(proc.addr) or (
                self.live_netns and self.net.known(proc.container) is not None
            )
            if group is not None and not last:
                self._release_live(group, proc.container, env_id, proc.port, netns)
            self.volumes.detach_live(proc.group, proc.slot, env_id)
            self.volumes.rootfs.release(proc.group, env_id)
        if last:
            self.net.forget(proc.container)
            self.teardown(proc.group, [proc.container])
            self.rules.forget(proc.container)

    def live_adopt(self, env_id: str, proc: LiveProc) -> None:
        return None  # one machine counts nothing per env

    # layer transfer (denv.server.docker.layers)
    def layer_digest(self, layer_id: str) -> str:
        return self.layers.layer_digest(layer_id)

    def offer_layer(self, layer_id: str) -> LayerOffer:
        return self.layers.offer(layer_id, self._address)

    def copy_layer(self, layer_id: str, origin: str) -> int:
        if self._peers is None:
            raise NodeLost(origin, "this node is in no cluster: it reaches no other node")
        return self.layers.copy_from(layer_id, origin, self._peers(origin))

    def upload_layer(self, layer_id: str, store: ObjectStoreConfig) -> str:
        return self.layers.upload_layer(layer_id, store)

    def fetch_layer(self, layer_id: str, digest: str, store: ObjectStoreConfig) -> None:
        self.layers.fetch_layer(layer_id, digest, store)

    # images moved between nodes (``ImageNode``; ``images``)
    def has_image(self, image_id: str) -> bool:
        return self.images.has(image_id)

    def offer_image(self, image_id: str) -> LayerOffer:
        return self.images.offer(image_id, self._address)

    def copy_image(self, image_id: str, origin: str) -> int:
        if self._peers is None:
            raise NodeLost(origin, "this node is in no cluster: it reaches no other node")
        return self.images.copy_from(image_id, origin, cast(ImageSource, self._peers(origin)))

    def upload_image(self, image_id: str, store: ObjectStoreConfig) -> str:
        return self.images.upload(image_id, store)

    def fetch_image(self, image_id: str, digest: str, store: ObjectStoreConfig) -> None:
        self.images.fetch(image_id, digest, store)

    def pull_image(self, ref: str, image_id: str) -> None:
        self.images.pull(ref, image_id, self.engine.pull_credentials)

    def collect_images(
        self, budget_mb: int | None = None, recent_s: float | None = None
    ) -> list[str]:
        if recent_s is None:
            return self.images.collect(budget_mb)
        return self.images.collect(budget_mb, recent_s)
