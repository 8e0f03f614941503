"""Containers' states on a cluster while a member does not answer, without Docker or Ray.

A node just killed stays among Ray's live nodes for seconds, and calls to its agent fail
meanwhile. Reading that silence as "its containers are gone" failed its envs as ``exited``
before the reaper could say ``lost`` (tests/cluster/test_cluster_api.py saw it on isolated
nodes). The members here are stand-ins that answer or do not (the seam that cannot run here
without a Ray cluster); the cluster tests kill real nodes.
"""

from __future__ import annotations

import pytest

from denv.server.errors import from_node
from denv.server.node.cluster.node import ClusterNode
from denv.server.node.errors import Unavailable
from denv.server.node.seam import NodeLost


class Member:
    """A member whose agent answers ``states`` until ``silent``."""

    def __init__(self, name: str, states: dict[str, str]) -> None:
        self.name, self._states, self.silent = name, states, False

    def states(self, env_id: str | None = None) -> dict[str, str]:
        if self.silent:
            raise NodeLost(self.name, "its agent does not answer")
        return dict(self._states)


@pytest.fixture
def nodes() -> tuple[ClusterNode, dict[str, Member]]:
    members = {"a": Member("a", {"cid_a": "running"}), "b": Member("b", {"cid_b": "running"})}
    node = ClusterNode(lambda: members)  # type: ignore[arg-type, return-value]
    node.members.env.update({"env_a": "a", "env_b": "b"})
    return node, members


def test_a_silent_members_containers_keep_their_last_known_states(
    nodes: tuple[ClusterNode, dict[str, Member]],
) -> None:
    node, members = nodes
    assert node.states() == {"cid_a": "running", "cid_b": "running"}
    members["b"].silent = True
    assert node.states() == {"cid_a": "running", "cid_b": "running"}  # not "missing"


def test_one_env_on_a_silent_member_has_no_state_to_read(
    nodes: tuple[ClusterNode, dict[str, Member]],
) -> None:
    node, members = nodes
    assert node.states("env_b") == {"cid_b": "running"}
    members["b"].silent = True
    with pytest.raises(Unavailable) as refused:  # the API then shows the env as it was
        node.states("env_b")
    assert from_node(refused.value).status == 503 and "state is unknown" in refused.value.message
    assert node.states("env_a") == {"cid_a": "running"}
