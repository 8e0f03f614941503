"""Bringing one env up on a node and taking it down (``BootCalls``), and what a boot is
given (``BootSpec``) and makes (``Booted``)."""

from __future__ import annotations

from typing import Protocol

from pydantic import Field

from denv.server.records import Record, ServiceSpec, VolumeSlot


class BootSpec(Record):
    """What to bring up for one env (or a warm spare, which carries its future env id)."""

    env_id: str
    services: list[ServiceSpec]  # in start order: dependencies first
    agent: str  # the service that serves OpenEnv
    egress: str  # "deny": an internal network; "allow": the agent's ports published
    env: dict[str, str] = Field(default_factory=dict)  # the agent's env overrides
    volumes: list[VolumeSlot] = Field(default_factory=list)
    late_mount: bool = False  # mount points stay empty until mount_volumes (a spare)
    live: bool = False  # the agent runs under the live-fork launcher (denv.server.docker.live)
    # A checkpoint's image on this node (CheckpointCalls): the agent resumes from it, its
    # server's memory as it was saved, instead of booting. Empty: it boots.
    restore: str = ""
    warm_pool: str | None = None  # a spare's pool: it boots at low CPU weight, primed
    owner: str = ""  # the API key it is booted for: its CPU share and its turn at the engine
    timeout_s: float = 120.0
    timeout_name: str = "wait_timeout_s"  # how failure messages name the time limit

    def agent_service(self) -> ServiceSpec:
        return next(s for s in self.services if s.name == self.agent)


class Booted(Record):
    """What ``bring_up`` made: the network, containers (service -> id), the agent's address."""

    env_id: str
    network: str
    containers: dict[str, str]
    agent_ip: str
    host_ports: dict[int, int] = Field(
        default_factory=dict
    )  # container port -> published host port (egress allow)
    node: str = "local"  # the node it runs on (a cluster's node name)
    restored: bool = False  # the agent resumed from spec.restore (its image was on the node)


class BootCalls(Protocol):
    """One env's containers, network and volumes: up, healthy, late volumes, CPU weight,
    down."""

    def bring_up(self, spec: BootSpec) -> Booted:
        """Network, volumes and started containers, dependencies' healthchecks passed first."""
        ...

    def wait_healthy(self, spec: BootSpec, booted: Booted, timeout_s: float) -> None:
        """Until the agent answers 200 on its health path; BootFailed, Cancelled."""
        ...

    def mount_volumes(self, env_id: str, volumes: list[VolumeSlot]) -> None:
        """Mount volumes on the empty mount points of a spare: its containers see them."""
        ...

    def prioritize(self, env_id: str, containers: list[str]) -> None:
        """Full CPU weight for ``containers`` (every container of the env when empty) and
        for the containers its boot creates from now on."""
        ...

    def cancel(self, env_id: str) -> None:
        """Stop a boot of ``env_id`` in flight or to come (Cancelled)."""
        ...

    def teardown(self, env_id: str, containers: list[str]) -> None:
        """Remove the env's containers, network and volumes (idempotent)."""
        ...

    def stop(self) -> None:
        """The server is stopping: every boot in flight ends with Cancelled."""
        ...
