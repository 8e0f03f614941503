"""``RemoteNode`` forwards the node seam's calls without restating them (issue 44): every
call of every capability crosses, with its time limit; nothing else does. No Ray here: the
calls' forwarding over a real cluster is what the other modules of this folder test."""

from __future__ import annotations

import pytest

from denv.cluster import remote
from denv.cluster.agent import NodeAgent
from denv.cluster.remote import (
    BOOT_MARGIN_S,
    CALL_TIMEOUT_S,
    LONG_TIMEOUT_S,
    RemoteNode,
    time_limit,
)
from denv.server.docker.node import DockerNode
from denv.server.node.seam import NODE_CALLS, BootSpec, LiveCalls, Node


class Handle:
    """What ``RemoteNode`` asks of an actor handle: ``call.remote``; recorded, not run."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, tuple[object, ...], dict[str, object]]] = []
        self.call = self

    def remote(self, method: str, *args: object, **kwargs: object) -> str:
        self.asked.append((method, args, kwargs))
        return f"ref-{method}"


def test_every_call_of_every_capability_crosses_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert {n for n in dir(LiveCalls) if not n.startswith("_")} <= NODE_CALLS
    assert {n for n in dir(Node) if not n.startswith("_")} <= NODE_CALLS
    missing = sorted(n for n in NODE_CALLS if not callable(getattr(DockerNode, n, None)))
    assert missing == [], f"DockerNode lacks calls of the seam: {missing}"
    waited: list[float] = []
    monkeypatch.setattr(remote.ray, "get", lambda ref, timeout: waited.append(timeout) or ref)
    handle = Handle()
    node = RemoteNode("n1", handle)
    assert node.states("env_1") == "ref-states"
    assert node.live_teardown("env_1", proc="p", last=True) == "ref-live_teardown"
    assert handle.asked == [
        ("states", ("env_1",), {}),
        ("live_teardown", ("env_1",), {"proc": "p", "last": True}),
    ]
    assert waited == [CALL_TIMEOUT_S, LONG_TIMEOUT_S]
    with pytest.raises(AttributeError, match="no call 'shutdown_machine'"):
        node.shutdown_machine  # noqa: B018
    assert not hasattr(NodeAgent, "shutdown_machine")


def test_time_limits_follow_what_each_call_waits_for() -> None:
    spec = BootSpec(env_id="env_1", services=[], agent="agent", egress="deny", timeout_s=200)
    assert time_limit("bring_up", (spec,), {}) == 200 + BOOT_MARGIN_S
    assert time_limit("wait_healthy", (spec, None), {"timeout_s": 30.0}) == 30 + BOOT_MARGIN_S
    assert time_limit("logs_after", ("e", "agent", None, 10, 25.0), {}) == CALL_TIMEOUT_S + 25
    assert time_limit("inspect_image", ("img", True), {}) == LONG_TIMEOUT_S
    assert time_limit("inspect_image", ("img", False), {}) == CALL_TIMEOUT_S
    assert time_limit("live_fork", ("e", None, [], []), {}) == LONG_TIMEOUT_S
    with pytest.raises(TypeError):  # a call given arguments its protocol does not take
        time_limit("states", ("env_1", "extra"), {})
