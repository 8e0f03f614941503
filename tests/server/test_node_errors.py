"""The node side's errors (``denv.server.node.errors``) and where they become HTTP: no
Docker, no Ray.

Below the seam nothing picks a status: a node raises its own error, which keeps every
field across a trip to another process (Ray pickles it), and the API's edge
(``denv.server.errors``) answers each kind of refusal with the contract's status, code and
message, as they were when the node raised ``ApiError`` itself.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from denv.server.docker.networks import EnvNetworks
from denv.server.errors import NODE_STATUS, from_node, install_error_handlers
from denv.server.net.subnets import SubnetPool
from denv.server.node.errors import (
    BootFailed,
    Cancelled,
    EngineUnavailable,
    ImageNotFound,
    Invalid,
    LiveError,
    NoCapacity,
    NodeError,
    NodeLost,
    Refused,
    Unavailable,
)

ONE_OF_EACH: list[NodeError] = [
    Invalid("egress entry 'x' is not a destination", "egress.allow[0]"),
    ImageNotFound("image 'a:1' is not on any node (n1)", "a:1", ["n1"]),
    Unavailable("node n1: its env's state is unknown", {"node": "n1"}),
    EngineUnavailable("the Docker Engine is not reachable (ConnectionError)"),
    NoCapacity("every /27 subnet of the env network pool 10.213.0.0/16 is in use"),
    BootFailed("exited", "gone", "db", "net_1", {"db": "c1"}),
    Cancelled(),
    NodeLost("n2", "its agent restarts"),
    LiveError("busy", "the env is forking already"),
]


def _subclasses(cls: type[Refused]) -> list[type[Refused]]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


@pytest.mark.parametrize("err", ONE_OF_EACH, ids=lambda e: type(e).__name__)
def test_every_node_error_keeps_its_class_and_fields_across_processes(err: NodeError) -> None:
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and str(back) == str(err) == err.message
    assert vars(back) == vars(err)
    moved = err.reworded(f"node n3: {err.message}", {"node": "n3"})
    again = pickle.loads(pickle.dumps(moved))
    assert type(again) is type(err) and str(again) == again.message == f"node n3: {err.message}"
    assert again.details == {"node": "n3"} and again.code == err.code


def test_the_api_answers_each_refusal_as_the_contract_says() -> None:
    answers = {type(e).__name__: from_node(e) for e in ONE_OF_EACH if isinstance(e, Refused)}
    seen = {k: (a.status, a.code, a.details) for k, a in answers.items()}
    assert seen == {
        "Invalid": (422, "invalid_request", {"path": "egress.allow[0]"}),
        "ImageNotFound": (422, "image_not_found", {"image": "a:1", "nodes": ["n1"]}),
        "Unavailable": (503, "engine_unavailable", {"node": "n1"}),
        "EngineUnavailable": (503, "engine_unavailable", None),
        "NoCapacity": (503, "engine_unavailable", None),
    }
    for kind in _subclasses(Refused):  # a new kind of refusal needs a status at the edge
        assert any(issubclass(kind, known) for known in NODE_STATUS), kind


def test_a_node_error_raised_under_a_route_is_the_contract_s_error_body() -> None:
    app = FastAPI()
    install_error_handlers(app)
    raised: dict[str, Exception] = {
        "image": ImageNotFound("image 'a:1' is not on the Docker Engine: build it", "a:1"),
        "engine": EngineUnavailable("the Docker Engine is not reachable: start dockerd"),
        "lost": NodeLost("n1"),  # not a refusal: a bug if it gets here, as any other
    }

    @app.get("/{what}")
    def fail(what: str) -> None:
        raise raised[what]

    client = TestClient(app, raise_server_exceptions=False)
    res = client.get("/image")
    assert res.status_code == 422 and "Retry-After" not in res.headers
    assert {k: res.json()[k] for k in ("code", "message", "details")} == {
        "code": "image_not_found",
        "message": "image 'a:1' is not on the Docker Engine: build it",
        "details": {"image": "a:1"},
    }
    res = client.get("/engine")
    assert (res.status_code, res.json()["code"]) == (503, "engine_unavailable")
    res = client.get("/lost")
    assert (res.status_code, res.json()["code"]) == (500, "internal")


class _NoEngine:
    """The Docker API's stand-in: it lists no networks and must be asked for nothing else."""

    instance_id = "inst"

    @property
    def api(self) -> Any:
        return self

    def networks(self, **_: Any) -> list[dict[str, Any]]:
        return []


def test_a_full_subnet_pool_is_no_capacity_naming_the_flag() -> None:
    pool = SubnetPool("10.250.0.0/27", 27)  # room for one env network
    assert pool.allocate(list) == "10.250.0.0/27"
    networks = EnvNetworks(_NoEngine(), pool)  # type: ignore[arg-type]
    with pytest.raises(NoCapacity) as full:
        networks.create("env_1", "deny")
    assert "--subnet-pool" in full.value.message and "10.250.0.0/27" in full.value.message
    assert (from_node(full.value).status, full.value.code) == (503, "engine_unavailable")
