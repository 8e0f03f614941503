"""``ClusterNode`` answers every call of the seam without restating it (issue 44), without
Docker or Ray: a call about one env goes as it was made to the env's member (a live
process's: its group's), a call a part answers reaches that part, and placement is a
strategy the node is given. The members are stand-ins that record what reaches them."""

from __future__ import annotations

from typing import Any

import pytest

from denv.server.node.cluster.membership import Members
from denv.server.node.cluster.node import ClusterNode
from denv.server.node.cluster.placement import LeastLoaded, NodeCaps
from denv.server.node.seam import Booted, BootSpec, Node, NodeLost
from denv.server.records import LiveProc, ServiceSpec, VolumeSlot


class Member:
    """Answers any call with its own name, and records it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, call: str) -> Any:
        def answer(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((call, args, kwargs))
            if call == "bring_up":
                return Booted(env_id=args[0].env_id, network="n", containers={}, agent_ip="ip")
            return self.name

        return answer


def cluster(**kwargs: Any) -> tuple[ClusterNode, dict[str, Member]]:
    members = {"a": Member("a"), "b": Member("b")}
    node = ClusterNode(lambda: members, **kwargs)
    node.members.env.update({"env_a": "a", "env_b": "b"})
    return node, members


def spec(env_id: str) -> BootSpec:
    svc = ServiceSpec(name="agent", image="x", image_digest="sha256:1", ports=[8000])
    slot = VolumeSlot(service="agent", n=0, path="/work", layers=[])
    return BootSpec(env_id=env_id, services=[svc], agent="agent", egress="deny", volumes=[slot])


def test_every_call_of_the_seam_is_answered() -> None:
    node, _ = cluster()
    calls = {n for n in dir(Node) if not n.startswith("_")}
    missing = sorted(n for n in calls if not callable(getattr(node, n, None)))
    assert missing == [], f"ClusterNode lacks calls of the seam: {missing}"


def test_a_call_about_an_env_goes_as_made_to_its_member_only() -> None:
    node, members = cluster()
    assert node.changed_bytes("env_b", [], stop_after=5) == "b"
    assert members["b"].calls == [("changed_bytes", ("env_b", []), {"stop_after": 5})]
    assert members["a"].calls == []
    proc = LiveProc(group="env_a", container="c", pid=1, start=1, port=8000)
    assert node.live_exit_reason("env_k1", proc) == "a"  # a live process: its group's member
    assert members["a"].calls == [("live_exit_reason", ("env_k1", proc), {})]


def test_a_call_about_an_env_on_no_member_fails_or_answers_what_it_says() -> None:
    node, _ = cluster()
    with pytest.raises(NodeLost, match="no node holds env_gone"):
        node.prioritize("env_gone", [])
    assert node.logs("env_gone", "agent", 10) == [
        "(node (none) is lost: no node holds env_gone: no log)"
    ]
    proc = LiveProc(group="env_gone", container="c", pid=1, start=1, port=8000)
    assert node.live_alive(proc) is False


def test_calls_a_part_answers_reach_it() -> None:
    node, members = cluster()
    assert node.engine_version() == "a"  # any member answers: the first
    assert node.lost_reason("env_a") is None
    assert node.has_layer("lyr_x")  # the layers' part asked the members where it is
    assert ("has_layer", ("lyr_x",), {}) in members["a"].calls


class Always:
    """A placement that takes one member, and counts no room."""

    def __init__(self, name: str) -> None:
        self.name = name

    def place(self, members: Members, spec: BootSpec, skip: frozenset[str] = frozenset()) -> str:
        return self.name

    def least_loaded(self, members: Members) -> str:
        return self.name

    def room(self, members: Members) -> int | None:
        return None

    def room_beside(self, members: Members, env_id: str) -> int | None:
        return None

    def refusal(self, members: Members, name: str, count: int) -> str | None:
        return None


def test_placement_is_a_strategy_the_node_is_given() -> None:
    node, members = cluster(placement=Always("b"))
    assert node.bring_up(spec("env_1")).node == "b"
    assert [c[0] for c in members["b"].calls] == ["has_image", "bring_up"]
    assert isinstance(cluster(caps=NodeCaps(max_envs=1))[0].placement, LeastLoaded)
    with pytest.raises(ValueError, match="caps or a placement"):
        cluster(caps=NodeCaps(), placement=Always("a"))
