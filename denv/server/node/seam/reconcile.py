"""What a node holds for this server, for reconcile after a restart (``ReconcileCalls``)."""

from __future__ import annotations

from typing import Protocol

from pydantic import Field

from denv.server.records import Record, VolumeSlot


class Owned(Record):
    """What a node holds for this server: containers and networks by env, volume dirs."""

    containers: dict[str, str] = Field(
        default_factory=dict
    )  # container id -> env id ("" for a seed container)
    networks: dict[str, str] = Field(default_factory=dict)  # network name -> env id
    volume_envs: list[str] = Field(default_factory=list)  # env ids with volume dirs


class ReconcileCalls(Protocol):
    """What is here, what to remove, what to thaw."""

    def owned(self) -> Owned: ...

    def remove_owned(self, owned: Owned) -> None: ...

    def recover(
        self,
        env_id: str,
        containers: dict[str, str],
        volumes: list[VolumeSlot],
        states: dict[str, str],
    ) -> str | None:
        """After a restart: thaw what an interrupted snapshot froze; what is lost, if any."""
        ...
