"""A cluster member whose Docker Engine does not answer while its agent does, without Docker
or Ray (issue 27, item 7).

A node's dockerd killed (or restarting) leaves its agent and Ray node alive: every call that
needs the engine raises ``EngineUnavailable`` (the API's 503 ``engine_unavailable``). That
one node must not fail the creates the other nodes could take, nor stall the reaper's view
of the others. The members here are stand-ins whose engine answers or not (the seam that
cannot run here without a Ray cluster); tests/cluster/test_isolated_nodes.py kills a real
node's engine.
"""

from __future__ import annotations

import pytest

from denv.server.node.cluster.node import ClusterNode
from denv.server.node.errors import EngineUnavailable, Unavailable
from denv.server.node.seam import Booted, BootSpec, ImageFacts
from denv.server.records import ServiceSpec, VolumeSlot


class Member:
    """A member whose engine answers until ``engine_down``; it records its boots."""

    def __init__(self, name: str) -> None:
        self.name, self.engine_down, self.boots = name, False, 0

    def _engine(self) -> None:
        if self.engine_down:
            raise EngineUnavailable(f"node {self.name}: the Docker Engine is not reachable")

    def inspect_image(self, image: str, pull: bool) -> ImageFacts:
        self._engine()
        return ImageFacts(id=f"sha256:{self.name}", command=["serve"])

    def has_image(self, image_id: str) -> bool:  # every member has every image here
        self._engine()
        return True

    def bring_up(self, spec: BootSpec) -> Booted:
        self._engine()
        self.boots += 1
        return Booted(
            env_id=spec.env_id, network=f"net-{spec.env_id}", containers={}, agent_ip="10.0.0.2"
        )

    def states(self, env_id: str | None = None) -> dict[str, str]:
        self._engine()
        return {f"cid_{self.name}": "running"}


@pytest.fixture
def nodes() -> tuple[ClusterNode, dict[str, Member]]:
    members = {"a": Member("a"), "b": Member("b")}
    return ClusterNode(lambda: members), members  # type: ignore[arg-type, return-value]


def spec(env_id: str) -> BootSpec:
    svc = ServiceSpec(name="agent", image="x", image_digest="sha256:1", ports=[8000])
    slot = VolumeSlot(service="agent", n=0, path="/work", layers=[])
    return BootSpec(env_id=env_id, services=[svc], agent="agent", egress="deny", volumes=[slot])


def test_an_image_is_read_from_a_member_whose_engine_answers(
    nodes: tuple[ClusterNode, dict[str, Member]],
) -> None:
    node, members = nodes
    members["a"].engine_down = True
    assert node.inspect_image("x", False).id == "sha256:b"


def test_a_create_placed_on_a_member_whose_engine_is_down_starts_on_another(
    nodes: tuple[ClusterNode, dict[str, Member]],
) -> None:
    node, members = nodes
    # the fewest envs, then the name
    assert node.placement.place(node.members, spec("env_1")) == "a"
    members["a"].engine_down = True
    assert node.bring_up(spec("env_1")).node == "b"
    assert node.members.env["env_1"] == "b"
    members["a"].engine_down = False  # back, but passed over for a while: b again
    assert node.bring_up(spec("env_2")).node == "b"
    assert (members["a"].boots, members["b"].boots) == (0, 2)


def test_with_every_engine_down_a_create_says_which_node(
    nodes: tuple[ClusterNode, dict[str, Member]],
) -> None:
    node, members = nodes
    for m in members.values():
        m.engine_down = True
    with pytest.raises(Unavailable) as refused:
        node.bring_up(spec("env_1"))
    assert refused.value.code == "engine_unavailable" and "node " in refused.value.message


def test_a_member_whose_engine_is_down_keeps_its_containers_last_states(
    nodes: tuple[ClusterNode, dict[str, Member]],
) -> None:
    node, members = nodes
    assert node.states() == {"cid_a": "running", "cid_b": "running"}
    members["a"].engine_down = True
    assert node.states() == {"cid_a": "running", "cid_b": "running"}
