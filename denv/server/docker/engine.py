"""The Docker SDK wrapper the Docker node uses: images and containers, with denv's labels.

``DockerNode`` (``node``) and the boot sequence (``boot``) call Docker through it; it is no
seam of its own (the node seam is ``denv.server.node.seam``). The connection and labels are
``DockerApi``'s (``sdk``); env networks, with their subnets and egress rules, are
``EnvNetworks``' (``networks``), which ``Engine.networks`` holds. Every call blocks; callers
run them in threads.
"""

from __future__ import annotations

import io
import logging
import tarfile
from contextlib import suppress
from pathlib import Path
from typing import Any

import docker
import docker.errors

from denv.server.config import MIB
from denv.server.docker.live import launcher_ctl
from denv.server.docker.networks import EnvNetworks
from denv.server.docker.sdk import DockerApi, engine_errors
from denv.server.net.firewall import Firewall
from denv.server.net.policy import DENY_DNS
from denv.server.net.subnets import SubnetPool
from denv.server.node.errors import ImageNotFound
from denv.server.node.seam import ImageFacts
from denv.server.records import Limits

log = logging.getLogger(__name__)

# Every capability dropped but one (Limits.capabilities; `denv serve --env-cap-add` grants
# more): a process in an env cannot make device nodes, open raw
# sockets, mount, chown files or change its uid; no-new-privileges stops setuid binaries
# from gaining any back. DAC_OVERRIDE (in Docker's default set too) stays, because images
# run as root and read files of their own service users: Debian's redis reads its config
# through /etc/redis (redis:redis, 2770). Not DAC_READ_SEARCH: it would allow
# open_by_handle_at, a known way out of a container. Docker's default seccomp profile stays
# on (nothing here turns it off).
CAP_DROP = ["ALL"]
SECURITY_OPT = ["no-new-privileges"]


def limit_options(limits: Limits) -> dict[str, Any]:
    """Docker's host-config options for ``limits`` (0 leaves that one unlimited)."""
    opts: dict[str, Any] = {}
    if limits.memory_mb > 0:
        # Swap limited to the same: past the limit the OOM killer acts, nothing swaps.
        opts["mem_limit"] = opts["memswap_limit"] = limits.memory_mb * MIB
    if limits.pids > 0:
        opts["pids_limit"] = limits.pids
    if limits.cpus > 0:
        opts["nano_cpus"] = int(limits.cpus * 1e9)
    return opts


class Engine(DockerApi):
    """The Docker calls denv makes, with its labels applied."""

    # Off: a pull sends an empty registry auth, whatever ~/.docker/config.json (or its
    # credential helper) holds: a key's `pull: true` never borrows the operator's identity.
    # `denv serve --pull-credentials` turns it on.
    pull_credentials = False
    # The OCI runtime every container is created with; None: the engine's default (runc).
    # `denv serve --isolation gvisor` sets gVisor's (denv.server.gvisor.runtime).
    runtime: str | None = None

    def __init__(
        self,
        instance_id: str,
        subnets: SubnetPool | None = None,
        firewall: Firewall | None = None,
        allow_private_egress: bool = False,
    ) -> None:
        super().__init__(instance_id)
        self.networks = EnvNetworks(self, subnets or SubnetPool(), firewall, allow_private_egress)

    @property
    def embedded_dns(self) -> bool:
        """Whether containers reach Docker's embedded DNS (127.0.0.11, which answers an env's
        service names): not under gVisor, whose network stack is its own and so skips the
        rules Docker sets in each container's namespace to reach it."""
        return self.runtime is None

    def adopt_egress(self) -> int:
        """``EnvNetworks.adopt_egress``, for the composition roots that call it at start."""
        return self.networks.adopt_egress()

    def version(self) -> str:
        try:
            return str(self.api.version().get("Version", "unknown"))
        except Exception:
            return "unavailable"

    # images
    def _inspect(self, image: str, pull: bool) -> dict[str, Any]:
        """The engine's inspect of the image; ``ImageNotFound`` when it is not there."""
        with engine_errors():
            try:
                return dict(self.api.inspect_image(image))
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                if exc.status_code == 400:  # a malformed reference
                    raise _image_missing(image, "it is not a valid image reference", pull) from exc
                raise
            if not pull:
                raise _image_missing(image)
            try:
                # None: the SDK reads the operator's config; {}: an empty registry auth
                auth: dict[str, str] | None = None if self.pull_credentials else {}
                self.client.images.pull(image, auth_config=auth)
                return dict(self.api.inspect_image(image))
            except docker.errors.APIError as exc:
                raise _image_missing(image, f"pulling it failed: {exc.explanation}", pull) from exc

    def image_command(self, image_id: str, cmd: list[str] | None = None) -> list[str]:
        """What the engine would run: the image's Entrypoint, then ``cmd`` (a service's own
        command) or else the image's Cmd."""
        with engine_errors():
            return _command(self.api.inspect_image(image_id), cmd)

    def inspect_image(self, image: str, pull: bool) -> ImageFacts:
        """The image's id, command and labels, from one inspect (two when it is pulled)."""
        info = self._inspect(image, pull)
        labels = dict((info.get("Config") or {}).get("Labels") or {})
        return ImageFacts(id=str(info["Id"]), command=_command(info), labels=labels)

    def export_path(self, image_id: str, path: str, dest: Path) -> bool:
        """Copy what the image has at ``path`` into ``dest``; False when it has nothing there."""
        with engine_errors():
            cid = self.api.create_container(
                image_id, command=["true"], labels=self.labels("", "seed"), entrypoint=[]
            )["Id"]
            try:
                try:
                    stream, _ = self.api.get_archive(cid, path.rstrip("/") + "/.")
                except docker.errors.NotFound:
                    return False
                data = b"".join(stream)
            finally:
                self.api.remove_container(cid, force=True)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            members = [m for m in tar.getmembers() if m.name not in (".", "./")]
            if not members:
                return False
            dest.mkdir(parents=True, exist_ok=True)
            # "tar": owners kept (a seed may belong to the image's user), but no member
            # lands outside dest, and setuid/setgid bits are cleared.
            tar.extractall(dest, members=members, numeric_owner=True, filter="tar")
        return True

    # containers
    def create_container(
        self,
        env_id: str,
        service: str,
        image_id: str,
        command: list[str] | None,
        environment: dict[str, str],
        ports: list[int],
        binds: list[tuple[str, str]],
        network: str,
        publish: bool,
        extra_labels: dict[str, str] | None = None,
        cpu_shares: int | None = None,
        limits: Limits | None = None,
        deny: bool = False,
        extra_hosts: dict[str, str] | None = None,
        live_dir: str | None = None,
        cgroup_parent: str | None = None,
    ) -> str:
        """Create (not start) a service's container; ``binds`` are (host mnt, container path).

        ``cgroup_parent``: the cgroup it runs under (its API key's group,
        ``cgroups.key_parent``); None: Docker's default.

        ``live_dir``: the agent of a ``live`` env: the launcher's mounts, its control tmpfs and
        the capability its pid 1 drops for good (``launcher_ctl.container_settings``).

        ``deny``: a container without the host's resolvers (egress deny or an allowlist),
        whose names resolve only within its env and through ``extra_hosts`` (name -> IPv4,
        or ``host-gateway`` for the server's host), written to its ``/etc/hosts``.
        """
        mounts = [
            docker.types.Mount(target=target, source=source, type="bind", propagation="rslave")
            for source, target in binds
        ]
        port_bindings = {p: ("127.0.0.1", None) for p in ports} if publish else None
        caps = list((limits or Limits()).capabilities)
        tmpfs: dict[str, str] | None = None
        if live_dir is not None:
            extra = launcher_ctl.container_settings(Path(live_dir))
            for source, target, how in extra["binds"]:
                mounts.append(
                    docker.types.Mount(
                        target=target,
                        source=source,
                        type="bind",
                        read_only=how == "ro",
                        propagation=None if how == "ro" else how,
                    )
                )
            tmpfs = extra["tmpfs"]
            caps += [c for c in extra["cap_add"] if c not in caps]
        with engine_errors():
            host_config = self.api.create_host_config(
                mounts=mounts,
                tmpfs=tmpfs,
                port_bindings=port_bindings,
                init=False,
                cpu_shares=cpu_shares,
                cap_drop=CAP_DROP,
                cap_add=caps,
                security_opt=SECURITY_OPT,
                dns=DENY_DNS if deny else None,
                extra_hosts=extra_hosts or None,
                cgroup_parent=cgroup_parent,
                runtime=self.runtime,
                **limit_options(limits or Limits()),
            )
            net = self.api.create_networking_config(
                {network: self.api.create_endpoint_config(aliases=[service])}
            )
            created = self.api.create_container(
                image_id,
                command=command,
                environment=environment,
                labels={**self.labels(env_id, service), **(extra_labels or {})},
                name=container_name(env_id, service),
                ports=ports or None,
                host_config=host_config,
                networking_config=net,
                detach=True,
                # A live agent's command is the launcher with the image's whole command.
                entrypoint=[] if live_dir is not None else None,
            )
        return str(created["Id"])

    def start(self, cid: str) -> None:
        with engine_errors():
            self.api.start(cid)

    def inspect(self, cid: str) -> dict[str, Any] | None:
        with engine_errors():
            try:
                return dict(self.api.inspect_container(cid))
            except docker.errors.NotFound:
                return None

    def state(self, cid: str) -> str:
        """created / running / paused / exited / missing."""
        info = self.inspect(cid)
        if info is None:
            return "missing"
        return _state(info["State"].get("Status", "exited"))

    def exit_code(self, cid: str) -> int | None:
        """The exit code of an exited container; None while it runs or when it is gone."""
        info = self.inspect(cid)
        if info is None or _state(info["State"].get("Status", "exited")) != "exited":
            return None
        code = info["State"].get("ExitCode")
        return int(code) if code is not None else None

    def states(self, env_id: str | None = None) -> dict[str, str]:
        """Container id → state of this instance's containers (one Docker call)."""
        label = [f"denv.instance={self.instance_id}"]
        if env_id:
            label.append(f"denv.env={env_id}")
        with engine_errors():
            found = self.api.containers(all=True, filters={"label": label})
        return {c["Id"]: _state(c.get("State", "exited")) for c in found}

    def try_pause(self, cid: str) -> bool:
        """Pause a running container; False (no error) when it is not running."""
        with engine_errors():
            try:
                self.api.pause(cid)
            except docker.errors.APIError as exc:
                if exc.status_code in (404, 409):  # gone, not running, or already paused
                    return False
                raise
        return True

    def cgroup_driver(self) -> str:
        """``cgroupfs`` or ``systemd``: how Docker names the cgroups of containers."""
        with engine_errors():
            return str(self.api.info().get("CgroupDriver") or "")

    def update_cpu_shares(self, cid: str, shares: int) -> None:
        with engine_errors(), suppress(docker.errors.APIError):
            self.api.update_container(cid, cpu_shares=shares)

    def stats_memory(self, cid: str) -> int | None:
        with engine_errors(), suppress(docker.errors.APIError, KeyError, TypeError, ValueError):
            stats = self.api.stats(cid, stream=False)
            return int(stats["memory_stats"]["usage"])
        return None

    def unpause(self, cid: str) -> None:
        with engine_errors():
            try:
                self.api.unpause(cid)
            except docker.errors.APIError as exc:
                log.warning("unpause %s failed: %s", cid[:12], exc.explanation)

    def remove(self, cid: str) -> None:
        """Fast stop: SIGKILL and remove, no grace period (state lives in volumes)."""
        with engine_errors():
            try:
                self.api.remove_container(cid, force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # 409: removal already in progress
                    raise

    def logs(self, cid: str, tail: int) -> list[str]:
        with engine_errors():
            try:
                raw = self.api.logs(cid, stdout=True, stderr=True, tail=tail)
            except docker.errors.NotFound:
                return []
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        return text.splitlines()

    def exec_ok(self, cid: str, cmd: list[str]) -> bool:
        """Run ``cmd`` in the container; True when it exits 0."""
        with engine_errors():
            try:
                exec_id = self.api.exec_create(cid, cmd, stdout=True, stderr=True)["Id"]
                self.api.exec_start(exec_id)  # returns when the command exits
                return bool(self.api.exec_inspect(exec_id).get("ExitCode") == 0)
            except docker.errors.APIError:
                return False

    # reconcile
    def my_containers(self) -> list[dict[str, Any]]:
        with engine_errors():
            found = self.api.containers(
                all=True, filters={"label": [f"denv.instance={self.instance_id}"]}
            )
        return list(found)


def container_name(env_id: str, service: str) -> str:
    return f"denv-{env_id.lower()}-{service}"


def _state(status: str) -> str:
    if status in ("created", "running", "paused", "exited"):
        return status
    if status == "restarting":
        return "running"
    return "exited"


def _image_missing(image: str, why: str = "", pulled: bool = False) -> ImageNotFound:
    """The image is not here; the advice offers a pull only where none was tried (the CLI
    and the OpenEnv provider reword its last clause in their own terms)."""
    reason = f" ({why})" if why else ""
    fix = "build or load it first (docker build / docker load; see docker images)"
    fix += (
        ", or check its name and the registry's credentials" if pulled else ", or pass pull: true"
    )
    return ImageNotFound(f"image '{image}' is not on the Docker Engine{reason}: {fix}", image)


def _command(info: dict[str, Any], cmd: list[str] | None = None) -> list[str]:
    config = info.get("Config") or {}
    return [*(config.get("Entrypoint") or []), *(cmd or config.get("Cmd") or [])]
