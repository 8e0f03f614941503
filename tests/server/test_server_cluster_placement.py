"""The cluster's placement rules for live envs (issue 27, item 5), without Docker or Ray.

``ClusterNode`` decides where an env goes and whether a live fork fits from its own map of
what each member holds; it asks a member only to do the work. So these members are
stand-ins that record the calls made to them (the seam that cannot run here without a Ray
cluster); tests/cluster/test_cluster_live.py runs the same rules on real node agents.
"""

from __future__ import annotations

from typing import Any

import pytest

from denv.server.node.cluster.node import ClusterNode
from denv.server.node.cluster.placement import NodeCaps
from denv.server.node.live import LiveError
from denv.server.node.seam import BootSpec, LiveForked
from denv.server.records import LiveProc, ServiceSpec, VolumeSlot


class Member:
    """A member that answers the two calls these rules lead to, and records them."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def live_fork(self, parent_env: str, parent: LiveProc, *args: Any) -> Any:
        self.calls.append("live_fork")
        return LiveForked()

    def live_teardown(self, env_id: str, proc: LiveProc, last: bool) -> None:
        self.calls.append(f"live_teardown {env_id}")


def cluster(loads: dict[str, int], caps: NodeCaps) -> tuple[ClusterNode, dict[str, Member]]:
    """Members a, b, c... holding ``loads[name]`` envs each (env ids ``env_<name><i>``)."""
    members = {name: Member() for name in loads}
    node = ClusterNode(lambda: members, caps=caps)  # type: ignore[arg-type, return-value]
    for name, n in loads.items():
        for i in range(n):
            node.members.env[f"env_{name}{i}"] = name
    return node, members


def spec(live: bool, layers: list[str]) -> BootSpec:
    svc = ServiceSpec(name="agent", image="x", image_digest="sha256:1", ports=[8000])
    slot = VolumeSlot(service="agent", n=0, path="/work", layers=layers)
    return BootSpec(
        env_id="env_new", services=[svc], agent="agent", egress="deny", volumes=[slot], live=live
    )


@pytest.mark.parametrize(
    ("reserve", "live_goes_to"),
    [
        (2, "b"),  # b (room 3) fits the root and 2 children, and holds the layer
        (3, "c"),  # only c (room 4) fits the root and 3 children
        (8, "c"),  # none fits: the most room
        (0, "b"),  # no reserve: as any env
    ],
)
def test_a_live_root_goes_where_its_children_fit(reserve: int, live_goes_to: str) -> None:
    node, _ = cluster({"a": 3, "b": 1, "c": 0}, NodeCaps(max_envs=4, live_reserve=reserve))
    node.members.layers["lyr_v"] = {"a", "b"}
    # the layers, then the fewest envs
    assert node.placement.place(node.members, spec(live=False, layers=["lyr_v"])) == "b"
    node.members.env["env_a3"] = "a"  # a is full: b still holds the layer with the most room of two
    assert node.placement.place(node.members, spec(live=True, layers=["lyr_v"])) == live_goes_to


def test_a_live_root_with_no_cap_on_envs_is_placed_as_any_env() -> None:
    node, _ = cluster({"a": 3, "b": 1, "c": 0}, NodeCaps(max_memory_mb=100))
    node.members.layers["lyr_v"] = {"a"}
    assert node.placement.place(node.members, spec(live=True, layers=["lyr_v"])) == "a"


def test_live_children_count_on_their_node_and_a_fork_past_its_room_is_refused() -> None:
    node, members = cluster({"a": 2, "b": 0}, NodeCaps(max_envs=4))
    root = LiveProc(group="env_a0", container="c", pid=1, start=1, port=8000)
    assert (node.room(), node.room_beside("env_a0"), node.room_beside("env_b9")) == (6, 2, 0)
    node.live_fork("env_a0", root, [], [("env_k1", 20001), ("env_k2", 20002)])
    assert (node.room(), node.room_beside("env_a0"), node.room_beside("env_k1")) == (4, 0, 0)
    with pytest.raises(LiveError) as refused:
        node.live_fork("env_a0", root, [], [("env_k3", 20003)])
    assert refused.value.code == "node_full" and "node a has room for 0" in refused.value.message
    assert members["a"].calls == ["live_fork"]  # the refused fork reached no member
    assert node.room() == 4  # and counted nothing

    # The group's container goes with its last env: then its root counts no more.
    node.live_teardown("env_a0", root, last=False)
    node.live_teardown("env_k1", root, last=False)
    assert node.room_beside("env_k2") == 1  # the deleted root's container is still there
    node.live_teardown("env_k2", root, last=True)
    assert node.room() == 7  # a holds env_a1 only, b nothing


def test_live_children_that_outlive_a_control_plane_restart_count_again() -> None:
    # A new control plane knows the group's container from the member (``owned``), and the
    # live children from their records (reconcile hands each to ``live_adopt``).
    node, _ = cluster({"a": 1}, NodeCaps(max_envs=4))
    child = LiveProc(group="env_a0", container="c", pid=2, start=2, port=20001, depth=1)
    assert node.room() == 3
    node.live_adopt("env_k1", child)
    node.live_adopt("env_k1", child)  # twice: counted once
    node.live_adopt("env_k9", child.model_copy(update={"group": "env_gone"}))  # no such group
    assert (node.room(), node.room_beside("env_k1")) == (2, 2)
