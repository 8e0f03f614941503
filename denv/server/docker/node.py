"""The Docker Engine node: the ``Node`` seam on this machine's Docker Engine and mounts.

Containers through ``Engine`` and networks through its ``networks``, volumes through
``Volumes`` (overlayfs on the host), cgroup files through ``cgroups`` (each API key's group
through ``key_groups``), the boot sequence in ``boot``, layer transfer to other nodes and
object storage in ``layers``, live forks in ``live/`` (each ``live_*`` call is a call of
``self.live``). A lock per env (``boot.BootControl``, which the boot holds too) serialises
what a boot makes with what a teardown removes, and a cancelled boot makes nothing more:
so ``cancel`` then ``teardown`` leaves nothing behind, whatever a boot in flight was doing.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from denv.server.config import CPU_SHARES, MIB
from denv.server.docker import boot, cgroups, logtail
from denv.server.docker.checkpoints import Checkpoints, SandboxSaver
from denv.server.docker.engine import Engine, container_name
from denv.server.docker.engine_queue import EngineQueue
from denv.server.docker.images import NodeImages
from denv.server.docker.key_groups import KeyGroups
from denv.server.docker.layers import LayerTransfer, Peers
from denv.server.docker.live.node import LiveDocker
from denv.server.docker.transfers import Transfers
from denv.server.net.policy import network_name
from denv.server.node.seam import (
    Booted,
    BootSpec,
    Checkpoint,
    ImageFacts,
    LiveForked,
    Metered,
    Owned,
    Usage,
)
from denv.server.records import Limits, LiveProc, VolumeSlot
from denv.server.volumes.layerdiff import diff_stacks
from denv.server.volumes.overlay import Volumes, disk_usage

NO_SANDBOX = (
    "this server runs envs under runc, on this machine's kernel: there is no sandbox to "
    "checkpoint (its forks are live, or boot from a snapshot of /work)"
)


class DockerNode(Transfers):
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
        saver: SandboxSaver | None = None,
    ) -> None:
        """``peers``: the other nodes of its cluster by name (a node agent's), so that
        ``copy_layer`` can reach them; None: a machine of its own, it has none. ``address``:
        where other nodes reach this one (its layer offers listen there). ``live_netns``: each
        live child gets a network namespace of its own (``live/netns.py``). ``merge_pages``: live
        roots mark their memory for the kernel's same-page merging before they fork
        (``denv serve --merge-pages``, ``ksm``). ``saver``: how its runtime saves a sandbox
        (gVisor's); None: no checkpoints (``checkpoints``)."""
        self.engine = engine
        self._peers, self._address = peers, address
        self.volumes = volumes
        self._limits = limits or Limits()
        self.control = boot.BootControl()  # the env locks boots share with teardown and snapshots
        self.layers = LayerTransfer(volumes)
        self.images = NodeImages(engine, volumes.layers_dir.parent)
        self.queue = EngineQueue()  # Docker calls that make or remove: the quietest key first
        self.keys = KeyGroups(engine)  # each API key's cgroup, as its envs boot and go
        self.packed_dir = self.layers.packed_dir  # where tests and benches look for them
        # live envs: their processes found, copied into children, asked, ended
        self.live = LiveDocker(engine, volumes, self.control, live_netns, merge_pages)
        self.checkpoints = Checkpoints(
            engine, volumes.layers_dir.parent / "checkpoints", saver, NO_SANDBOX
        )

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
        if spec.restore:  # its image's path here; gone (a restarted server's): it boots
            path = self.checkpoints.path(spec.restore)
            spec = spec.model_copy(update={"restore": str(path) if path else ""})
        self.keys.add(spec.env_id, spec.owner)
        parent = self.keys.parent(spec.owner)
        self.images.used(s.image_digest for s in spec.services)
        with self.keys.booting(spec.owner, parent), self.queue.active(spec.owner):
            return boot.bring_up(
                self.engine, self.volumes, self.control, self._limits, spec, self.queue, parent
            )

    def wait_healthy(self, spec: BootSpec, booted: Booted, timeout_s: float) -> None:
        with self.keys.booting(spec.owner, self.keys.parent(spec.owner)):
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

    def checkpoint(self, env_id: str, container: str) -> Checkpoint:
        with self.control.lock(env_id):  # not while a snapshot freezes it or it goes
            return self.checkpoints.save(env_id, container)

    def drop_checkpoint(self, env_id: str, image: str) -> None:
        self.checkpoints.drop(image)

    def cancel(self, env_id: str) -> None:
        self.control.cancel(env_id)

    def teardown(self, env_id: str, containers: list[str]) -> None:
        with self.control.lock(env_id):
            owner = self.keys.owner(env_id)
            for cid in containers:  # a live group's: the host route to its children
                self.live.forget(cid)
            for cid in set(containers) | set(self.engine.states(env_id)):
                with self.queue.slot(owner):
                    self.engine.remove(cid)
            with self.queue.slot(owner):
                self.engine.networks.remove(network_name(env_id))
            with self.queue.slot(owner):
                self.volumes.remove_env(env_id)
            self.control.foreground(env_id, False)
            self.keys.forget(env_id)

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
        Docker's, a live server's own (``LiveDocker.usage``)."""
        out = []
        for env in envs:
            mem: int | None = None
            cpu: float | None = None
            if env.live is not None:
                mem, cpu = self.live.usage(env.env_id, env.live)
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
        # the engine asked inside prune_routes' guard, once the routes are read
        self.live.prune_routes(
            lambda: self.engine.api.containers(), lambda: self.engine.api.networks()
        )

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

    # live forks: each a call of ``self.live`` (``denv.server.docker.live``)
    def live_root(self, env_id: str, container: str, port: int) -> LiveProc:
        return self.live.root(env_id, container, port)

    def live_fork(
        self,
        parent_env: str,
        parent: LiveProc,
        volumes: list[VolumeSlot],
        children: list[tuple[str, int]],
        reseed: bool = True,
    ) -> LiveForked:
        return self.live.fork(parent_env, parent, volumes, children, reseed)

    def live_alive(self, proc: LiveProc) -> bool:
        return self.live.alive(proc)

    def live_modules(self, proc: LiveProc) -> list[str]:
        return self.live.modules(proc)

    def live_preload(self, proc: LiveProc, modules: list[str]) -> dict[str, Any]:
        return self.live.preload(proc, modules)

    def live_exit_reason(self, env_id: str, proc: LiveProc) -> str | None:
        return self.live.exit_reason(env_id, proc)

    def live_teardown(self, env_id: str, proc: LiveProc, last: bool) -> None:
        """End one live env (``LiveDocker.end``); the group's container with the last."""
        self.live.end(env_id, proc, last)
        if last:
            self.teardown(proc.group, [proc.container])
            self.live.rules.forget(proc.container)

    def live_adopt(self, env_id: str, proc: LiveProc) -> None:
        return None  # one machine counts nothing per env
