"""The networks of this server's envs on the Docker Engine, their subnets and egress rules.

Each env gets one bridge network, on a subnet of the server's pool (``SubnetPool``), not one
of Docker's ~30 defaults. An allowlist env's bridge, and an allow env's on a server started
with ``--allow-private-egress``, gets its per-env firewall rules (``Firewall``) before
anything runs on it; a restarted server takes those rules back from its networks' labels
(``adopt_egress``), and removing a network removes its rules.
"""

from __future__ import annotations

import ipaddress
import logging
from contextlib import suppress
from typing import Any

import docker
import docker.errors

from denv.server.docker.sdk import DockerApi, engine_errors
from denv.server.net.firewall import Firewall, FirewallError
from denv.server.net.firewall import tools as firewall_tools
from denv.server.net.policy import BRIDGE_NAME_OPTION, bridge_name, network_name
from denv.server.net.subnets import OVERLAP_RETRIES, SubnetPool
from denv.server.node.egress import EGRESS_LABEL, egress_label
from denv.server.node.egress import parse as parse_egress
from denv.server.node.errors import EngineUnavailable, NoCapacity, Unavailable

log = logging.getLogger(__name__)


class EnvNetworks:
    """The env networks of one server instance, and the bridges it holds egress rules for."""

    def __init__(
        self,
        docker_api: DockerApi,
        subnets: SubnetPool,
        firewall: Firewall | None = None,
        allow_private_egress: bool = False,
    ) -> None:
        self.docker = docker_api
        self.subnets = subnets
        # The egress rules of allow and allowlist envs (None: not managed, for tests of parts).
        self.firewall = firewall
        self.allow_private_egress = allow_private_egress
        self._bridge_of: dict[str, str] = {}  # network name -> bridge with per-env rules
        self._subnet_of: dict[str, str] = {}  # network name -> the subnet it was given

    def create(self, env_id: str, egress: str) -> str:
        """The env's network, on a subnet of the server's pool (not Docker's ~30 defaults).

        An allowlist env's bridge gets its rules (its destinations) before anything runs on
        it; so does an allow env's on a server started with ``--allow-private-egress``.
        """
        name = network_name(env_id)
        policy = parse_egress(egress)
        bridge = bridge_name(env_id, deny=policy.internal, allowlist=policy.mode == "allowlist")
        for _ in range(OVERLAP_RETRIES):
            subnet = self.subnets.allocate(self._docker_subnets)
            if subnet is None:
                raise NoCapacity(
                    f"every /{self.subnets.prefix} subnet of the env network pool "
                    f"{self.subnets.network} is in use: delete envs you no longer need, or "
                    "restart denv serve with a larger --subnet-pool"
                )
            gateway = str(next(ipaddress.IPv4Network(subnet).hosts()))  # named, as Docker does
            pool = docker.types.IPAMPool(subnet=subnet, gateway=gateway)
            ipam = docker.types.IPAMConfig(pool_configs=[pool])
            try:
                with engine_errors():
                    self.docker.api.create_network(
                        name,
                        driver="bridge",
                        internal=policy.internal,
                        labels={**self.docker.labels(env_id), **egress_label(egress)},
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
        raise NoCapacity(
            f"no free subnet for network {name} after {OVERLAP_RETRIES} tries: other "
            "networks keep taking them; retry, or give denv serve another --subnet-pool",
        )

    def _docker_subnets(self) -> list[str]:
        with engine_errors():
            found = self.docker.api.networks()
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
                self.remove(name)
            raise Unavailable(
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
        adopted = 0
        for net in self.mine():
            egress = (net.get("Labels") or {}).get(EGRESS_LABEL)
            bridge = (net.get("Options") or {}).get(BRIDGE_NAME_OPTION)
            if not egress or not bridge:
                continue
            policy = parse_egress(egress)
            try:
                name = str(net["Name"])
                self._open_egress(name, bridge, policy.mode, list(policy.rules), made_now=False)
            except Unavailable as exc:
                log.error("egress rules of %s not restored: %s", net["Name"], exc.message)
                continue
            adopted += int(str(net["Name"]) in self._bridge_of)
        return adopted

    def remove(self, name: str) -> None:
        bridge = self._bridge_of.pop(name, None) or self._bridge(name)
        with engine_errors(), suppress(docker.errors.NotFound):
            self.docker.api.remove_network(name)
        self.subnets.release(self._subnet_of.pop(name, None))
        if self.firewall is not None and bridge and not bridge.startswith("dvd"):
            self.firewall.remove_env(firewall_tools(), bridge)

    def _bridge(self, name: str) -> str | None:
        """The bridge of a network made before this server started (its rules may be left)."""
        try:
            with engine_errors():
                info = self.docker.api.inspect_network(name)
        except (docker.errors.NotFound, EngineUnavailable):
            return None
        return (info.get("Options") or {}).get(BRIDGE_NAME_OPTION)

    def mine(self) -> list[dict[str, Any]]:
        """This server's networks (for reconcile and ``adopt_egress``)."""
        with engine_errors():
            found = self.docker.api.networks(
                filters={"label": [f"denv.instance={self.docker.instance_id}"]}
            )
        return list(found)
