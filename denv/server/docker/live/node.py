"""The Docker node's live calls: ``LiveCalls`` of the node seam, on this machine.

``DockerNode`` hands each ``live_*`` call of the seam to its :class:`LiveDocker` (``root``
for ``live_root``, ``fork`` for ``live_fork`` ...), and removes a live group's container
itself, with its last env (``live_teardown``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

from denv.server.docker.live import cgroups, launcher_ctl
from denv.server.docker.live.fork import Fork, LiveParts
from denv.server.docker.live.host_routes import prune_routes
from denv.server.docker.live.netns import NetError
from denv.server.node.live import LiveError
from denv.server.node.seam import LiveForked
from denv.server.records import LiveProc, VolumeSlot


class LiveDocker(LiveParts):
    """Live envs on this node: found, copied, asked, ended. Safe to call from any thread."""

    def root(self, env_id: str, container: str, port: int) -> LiveProc:
        """The server process of a booted ``live`` env, under its container's launcher."""
        pid = self.container_pid(container)
        if not pid:
            raise LiveError("live_fork_failed", "the env's container is not running")
        proc = launcher_ctl.root_process(pid)
        launcher_ctl.trial(proc)  # its copies can serve: else it runs without live forks
        try:  # kept off its live children's ports, as they are off its own and each other's
            group = cgroups.group_of(proc.pid)
            if self.live_netns:  # children in namespaces of their own, behind a bridge
                self.nets.ensure(container, pid)
            else:
                self.rules.guard(group, [(env_id, port)], first=True)
            cgroups.limit(group, None, [env_id])
            cgroups.enter(group, env_id, proc.pid)
        except (cgroups.ApartError, NetError) as exc:
            raise LiveError("live_fork_failed", str(exc)) from exc
        return LiveProc(
            group=env_id, container=container, pid=proc.pid, start=proc.start, port=port
        )

    def fork(
        self,
        parent_env: str,
        parent: LiveProc,
        volumes: list[VolumeSlot],
        children: list[tuple[str, int]],
        reseed: bool = True,
    ) -> LiveForked:
        """Gate the parent, capture its volumes' and its root filesystem's changes, mount
        each child's volumes and root overlay in the group's slot dir, fork, plumb
        (:class:`~denv.server.docker.live.fork.Fork`)."""
        return Fork(self, parent_env, parent, volumes, children).run(reseed)

    def alive(self, proc: LiveProc) -> bool:
        return launcher_ctl.alive(launcher_ctl.Proc(proc.pid, proc.start))

    def modules(self, proc: LiveProc) -> list[str]:
        try:
            return launcher_ctl.modules(launcher_ctl.Proc(proc.pid, proc.start))
        except (OSError, ValueError, LiveError) as exc:
            raise LiveError("live_fork_failed", f"asking its launcher failed: {exc}") from exc

    def preload(self, proc: LiveProc, modules: list[str]) -> dict[str, Any]:
        try:
            return launcher_ctl.preload(launcher_ctl.Proc(proc.pid, proc.start), modules)
        except (OSError, ValueError, LiveError) as exc:
            raise LiveError("live_fork_failed", f"asking its launcher failed: {exc}") from exc

    def exit_reason(self, env_id: str, proc: LiveProc) -> str | None:
        """Which limit of its own a live env whose process ended hit, if one did."""
        group = self._group(proc.container)
        return cgroups.exit_reason(group, env_id) if group else None

    def usage(self, env_id: str, proc: LiveProc) -> tuple[int | None, float | None]:
        """Memory (bytes) and CPU time (s) of a live env's own server (``cgroups.usage``);
        unknown (None) once it has ended."""
        if launcher_ctl.alive(launcher_ctl.Proc(proc.pid, proc.start)):
            return cgroups.usage(proc.pid, proc.group == env_id)
        return None, None

    def end(self, env_id: str, proc: LiveProc, last: bool) -> None:
        """End one live env: its process, its volume slots; with the ``last`` of its group,
        the host route to the group's children (the node then removes the container)."""
        with self.control.lock(env_id):
            group = None if last else self._group(proc.container)
            launcher_ctl.kill(launcher_ctl.Proc(proc.pid, proc.start))
            netns = bool(proc.addr) or (
                self.live_netns and self.nets.known(proc.container) is not None
            )
            if group is not None and not last:
                self.release(group, proc.container, env_id, proc.port, netns)
            self.volumes.detach_live(proc.group, proc.slot, env_id)
            self.volumes.rootfs.release(proc.group, env_id)
        if last:
            self.nets.forget(proc.container)

    def prune_routes(
        self,
        containers: Callable[[], list[dict[str, Any]]],
        networks: Callable[[], list[dict[str, Any]]],
    ) -> None:
        """Host routes to live children's subnets whose container no longer runs (any
        server's: a route names only an address), left by a server that stopped before it
        removed its env's network (which takes the route with it). ``containers``: the
        engine's running containers, asked after the routes are read; ``networks``: the
        engine's networks, whose subnets hold every env container's address (a route via
        an address outside them is not this engine's to remove)."""

        def running() -> set[str]:
            return {
                str(n.get("IPAddress") or "")
                for c in containers()
                for n in ((c.get("NetworkSettings") or {}).get("Networks") or {}).values()
            } - {""}

        try:
            subnets = [
                ipaddress.ip_network(str(cfg["Subnet"]), strict=False)
                for n in networks()
                for cfg in ((n.get("IPAM") or {}).get("Config") or [])
                if cfg.get("Subnet")
            ]
            prune_routes(running, [net for net in subnets if net.version == 4])
        except Exception:  # the engine and `ip` are checked elsewhere: the routes stay
            return

    def _group(self, container: str) -> cgroups.Group | None:
        """The live servers' cgroups of a running container (found from its pid 1, which
        outlives them), or None."""
        pid = self.container_pid(container)
        if not pid:
            return None
        try:
            return cgroups.group_of(pid)
        except cgroups.ApartError:
            return None
