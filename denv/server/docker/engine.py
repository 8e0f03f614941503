"""The Docker Engine seam: containers, networks and images, through the ``docker`` SDK.

Every call blocks; callers run them in threads. Every object carries the labels
``denv.managed``, ``denv.instance``, ``denv.env`` and ``denv.service``, and reconcile only ever
touches objects with this server's ``denv.instance``.
"""

from __future__ import annotations

import io
import ipaddress
import logging
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests.exceptions

from denv.server.config import DOCKER_TIMEOUT_S, START_WORKERS
from denv.server.docker import live
from denv.server.errors import ApiError, EngineUnavailable
from denv.server.net.firewall import Firewall, FirewallError
from denv.server.net.firewall import tools as firewall_tools
from denv.server.net.policy import BRIDGE_NAME_OPTION, DENY_DNS, bridge_name, network_name
from denv.server.net.subnets import OVERLAP_RETRIES, SubnetPool
from denv.server.node.egress import EGRESS_LABEL, egress_label
from denv.server.node.egress import parse as parse_egress
from denv.server.records import Limits

log = logging.getLogger(__name__)

NotFound = docker.errors.NotFound
MIB = 1024 * 1024
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


@contextmanager
def engine_errors() -> Iterator[None]:
    """Docker transport failures become 503 ``engine_unavailable``."""
    try:
        yield
    except (requests.exceptions.ConnectionError, docker.errors.DockerException) as exc:
        if isinstance(exc, docker.errors.APIError | docker.errors.ImageNotFound):
            raise
        raise EngineUnavailable(type(exc).__name__) from exc


class Engine:
    """The Docker calls denv makes, with its labels applied."""

    # Off: a pull sends an empty registry auth, whatever ~/.docker/config.json (or its
    # credential helper) holds: a key's `pull: true` never borrows the operator's identity.
    # `denv serve --pull-credentials` turns it on.
    pull_credentials = False

    def __init__(
        self,
        instance_id: str,
        subnets: SubnetPool | None = None,
        firewall: Firewall | None = None,
        allow_private_egress: bool = False,
    ) -> None:
        self.instance_id = instance_id
        self.subnets = subnets or SubnetPool()
        # The egress rules of allow and allowlist envs (None: not managed, for tests of parts).
        self.firewall = firewall
        self.allow_private_egress = allow_private_egress
        self._bridge_of: dict[str, str] = {}  # network name -> bridge with per-env rules
        self._subnet_of: dict[str, str] = {}  # network name -> the subnet it was given
        self._client: docker.DockerClient | None = None

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            with engine_errors():
                self._client = docker.from_env(
                    timeout=DOCKER_TIMEOUT_S, max_pool_size=START_WORKERS
                )
        return self._client

    @property
    def api(self) -> Any:
        return self.client.api

    def labels(self, env_id: str, service: str = "") -> dict[str, str]:
        return {
            "denv.managed": "true",
            "denv.instance": self.instance_id,
            "denv.env": env_id,
            "denv.service": service,
        }

    def version(self) -> str:
        try:
            return str(self.api.version().get("Version", "unknown"))
        except Exception:
            return "unavailable"

    # images
    def resolve_image(self, image: str, pull: bool) -> str:
        """The image's id (``sha256:...``); 422 ``image_not_found`` when it is not there."""
        with engine_errors():
            try:
                return str(self.api.inspect_image(image)["Id"])
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                if exc.status_code == 400:  # a malformed reference
                    raise _image_missing(image, "it is not a valid image reference") from exc
                raise
            if not pull:
                raise _image_missing(image)
            try:
                # None: the SDK reads the operator's config; {}: an empty registry auth
                auth: dict[str, str] | None = None if self.pull_credentials else {}
                self.client.images.pull(image, auth_config=auth)
                return str(self.api.inspect_image(image)["Id"])
            except docker.errors.APIError as exc:
                raise _image_missing(image, f"pulling it failed: {exc.explanation}") from exc

    def image_command(self, image_id: str) -> list[str]:
        """The image's Entrypoint and Cmd, as the engine would run them."""
        with engine_errors():
            config = self.api.inspect_image(image_id).get("Config") or {}
        return [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]

    def image_labels(self, image_id: str) -> dict[str, str]:
        """The labels an image was built with (``LABEL``), {} when it has none."""
        with engine_errors():
            info = self.api.inspect_image(image_id)
        return dict((info.get("Config") or {}).get("Labels") or {})

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

    # networks
    def create_network(self, env_id: str, egress: str) -> str:
        """The env's network, on a subnet of the server's pool (not Docker's ~30 defaults).

        An allowlist env's bridge gets its rules (its destinations) before anything runs on
        it; so does an allow env's on a server started with ``--allow-private-egress``.
        """
        name = network_name(env_id)
        policy = parse_egress(egress)
        bridge = bridge_name(env_id, deny=policy.internal, allowlist=policy.mode == "allowlist")
        for _ in range(OVERLAP_RETRIES):
            subnet = self.subnets.allocate(self._docker_subnets)
            gateway = str(next(ipaddress.IPv4Network(subnet).hosts()))  # named, as Docker does
            pool = docker.types.IPAMPool(subnet=subnet, gateway=gateway)
            ipam = docker.types.IPAMConfig(pool_configs=[pool])
            try:
                with engine_errors():
                    self.api.create_network(
                        name,
                        driver="bridge",
                        internal=policy.internal,
                        labels={**self.labels(env_id), **egress_label(egress)},
                        ipam=ipam,
                        options={BRIDGE_NAME_OPTION: bridge},
                    )
            except docker.errors.APIError as exc:
                if "overlaps" not in str(exc.explanation or exc):
                    self.subnets.release(subnet)
                    raise
                self.subnets.overlapped(subnet)  # another server took it a moment ago
                continue
            self._subnet_of[name] = subnet
            self._open_egress(name, bridge, policy.mode, list(policy.rules))
            return name
        raise ApiError(
            503,
            "engine_unavailable",
            f"no free subnet for network {name} after {OVERLAP_RETRIES} tries: other "
            "networks keep taking them; retry, or give denv serve another --subnet-pool",
        )

    def _docker_subnets(self) -> list[str]:
        with engine_errors():
            found = self.api.networks()
        return [
            str(cfg.get("Subnet"))
            for net in found
            for cfg in ((net.get("IPAM") or {}).get("Config") or [])
            if cfg.get("Subnet")
        ]

    def _open_egress(
        self, name: str, bridge: str, mode: str, rules: list[Any], *, made_now: bool = True
    ) -> None:
        """Per-env firewall rules of a network; a failure removes a network ``made_now``."""
        wanted = mode == "allowlist" or (mode == "allow" and self.allow_private_egress)
        if self.firewall is None or not wanted:
            return
        try:
            self.firewall.add_env(firewall_tools(), bridge, rules, fresh=made_now)
        except FirewallError as exc:
            if made_now:
                self.remove_network(name)
            raise ApiError(
                503,
                "engine_unavailable",
                f"the egress rules of network {name} could not be installed ({exc}): the "
                "server needs root or CAP_NET_ADMIN; GET /v1/health shows host_guard",
            ) from exc
        self._bridge_of[name] = bridge

    def adopt_egress(self) -> int:
        """At start: take back the per-env egress rules of this server's networks.

        Their rules outlive a server restart in the kernel, but the new process must know
        them to put them back after a firewall reload; each network carries its env's
        egress in its ``denv.egress`` label. Returns how many networks have rules.
        """
        with engine_errors():
            found = self.api.networks(filters={"label": [f"denv.instance={self.instance_id}"]})
        adopted = 0
        for net in found:
            egress = (net.get("Labels") or {}).get(EGRESS_LABEL)
            bridge = (net.get("Options") or {}).get(BRIDGE_NAME_OPTION)
            if not egress or not bridge:
                continue
            policy = parse_egress(egress)
            try:
                name = str(net["Name"])
                self._open_egress(name, bridge, policy.mode, list(policy.rules), made_now=False)
            except ApiError as exc:
                log.error("egress rules of %s not restored: %s", net["Name"], exc.message)
                continue
            adopted += int(str(net["Name"]) in self._bridge_of)
        return adopted

    def remove_network(self, name: str) -> None:
        bridge = self._bridge_of.pop(name, None) or self._bridge(name)
        with engine_errors(), suppress(docker.errors.NotFound):
            self.api.remove_network(name)
        self.subnets.release(self._subnet_of.pop(name, None))
        if self.firewall is not None and bridge and not bridge.startswith("dvd"):
            self.firewall.remove_env(firewall_tools(), bridge)

    def _bridge(self, name: str) -> str | None:
        """The bridge of a network made before this server started (its rules may be left)."""
        try:
            with engine_errors():
                info = self.api.inspect_network(name)
        except (docker.errors.NotFound, ApiError):
            return None
        return (info.get("Options") or {}).get(BRIDGE_NAME_OPTION)

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
    ) -> str:
        """Create (not start) a service's container; ``binds`` are (host mnt, container path).

        ``live_dir``: the agent of a ``live`` env: the launcher's mounts, its control tmpfs and
        the capability its pid 1 drops for good (``live.container_settings``).

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
            extra = live.container_settings(Path(live_dir))
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

    def states(self, env_id: str | None = None) -> dict[str, str]:
        """Container id → state of this instance's containers (one Docker call)."""
        label = [f"denv.instance={self.instance_id}"]
        if env_id:
            label.append(f"denv.env={env_id}")
        with engine_errors():
            found = self.api.containers(all=True, filters={"label": label})
        return {c["Id"]: _state(c.get("State", "exited")) for c in found}

    def pause(self, cid: str) -> None:
        with engine_errors():
            self.api.pause(cid)

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

    def my_networks(self) -> list[dict[str, Any]]:
        with engine_errors():
            found = self.api.networks(filters={"label": [f"denv.instance={self.instance_id}"]})
        return list(found)


def container_name(env_id: str, service: str) -> str:
    return f"denv-{env_id.lower()}-{service}"


def _state(status: str) -> str:
    if status in ("created", "running", "paused", "exited"):
        return status
    if status == "restarting":
        return "running"
    return "exited"


def _image_missing(image: str, why: str = "") -> ApiError:
    reason = f" ({why})" if why else ""
    return ApiError(
        422,
        "image_not_found",
        f"image '{image}' is not on the Docker Engine{reason}: build or load it first "
        "(docker build / docker load; see docker images), or pass pull: true",
        {"image": image},
    )
