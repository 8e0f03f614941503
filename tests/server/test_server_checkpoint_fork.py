"""Forks by sandbox checkpoint/restore (``--isolation gvisor``), without Docker: the API's
fork on the composition root's app (``create_app``) over a fake node that can save a
sandbox (``CheckpointCalls``). A fork of kind ``auto`` of a one-service env saves the
parent's sandbox once, its children boot with ``BootSpec.restore`` naming that image and
start ``restored`` when the node says they resumed, and the image is let go of once, after
every child has started; when the node cannot save it, when the fork is not ``auto``, or
when the runtime is runc, the children boot as before."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from test_server_node_seam import FakeNode

from denv.server.app import create_app
from denv.server.auth import digest
from denv.server.config import ServerConfig
from denv.server.lifecycle.admission import Admitted
from denv.server.lifecycle.env_records import EnvOptions
from denv.server.lifecycle.service import Service
from denv.server.node.abilities import EVERYTHING, Abilities
from denv.server.node.errors import CheckpointUnsupported, NodeError
from denv.server.node.seam import Booted, BootSpec, Checkpoint
from denv.server.records import READY, EnvStatus, ServiceSpec, VersionRecord, Volume

KEY = "dak_checkpoint_test"
OWNER = digest(KEY)  # the owner id the API derives from the key
GVISOR = Abilities(live="no launcher under gVisor", spares="no late mounts", checkpoint=None)
STARTED = {EnvStatus.STARTING, EnvStatus.RUNNING, EnvStatus.HEALTHY}


class CheckpointNode(FakeNode):
    """A fake node that can save a sandbox: ``checkpoint`` answers a ``Checkpoint`` (or
    raises ``refuse``), ``bring_up`` says the agent resumed when its spec names an image
    (unless ``restores`` is False: the image was gone on that node), and every call is
    recorded, with the envs' statuses at the moment the image is let go of."""

    def __init__(self, refuse: NodeError | None = None, restores: bool = True) -> None:
        super().__init__()
        self.refuse, self.restores = refuse, restores
        self.order: list[str] = []  # close_idle, checkpoint, bring_up, drop: as they came
        self.checkpoints: list[tuple[str, str]] = []
        self.dropped: list[tuple[str, str]] = []
        self.specs: dict[str, BootSpec] = {}
        self.statuses_at_drop: dict[str, EnvStatus] = {}
        self.service: Service | None = None

    def checkpoint(self, env_id: str, container: str) -> Checkpoint:
        self.order.append(f"checkpoint {env_id}")
        self.checkpoints.append((env_id, container))
        if self.refuse is not None:
            raise self.refuse
        return Checkpoint(env_id=env_id, image=f"{env_id}-ckpt-1", bytes=39 << 20, seconds=0.6)

    def drop_checkpoint(self, env_id: str, image: str) -> None:
        self.order.append(f"drop {image}")
        self.dropped.append((env_id, image))
        assert self.service is not None
        store = self.service.ctx.store
        for eid in self.specs:
            rec = store.get_env(eid)
            assert rec is not None
            self.statuses_at_drop[eid] = rec.status

    def bring_up(self, spec: BootSpec) -> Booted:
        if spec.restore:  # a resume takes a moment: a drop that does not wait sees 'creating'
            time.sleep(0.1)
        booted = super().bring_up(spec)
        self.order.append(f"bring_up {spec.env_id}")
        self.specs[spec.env_id] = spec
        return booted.model_copy(update={"restored": bool(spec.restore) and self.restores})

    def states(self, env_id: str | None = None) -> dict[str, str]:
        return {cid: "running" for spec in self.specs.values() for cid in _containers(spec)}


def _containers(spec: BootSpec) -> list[str]:
    return [f"c-{s.name}" for s in spec.services]  # FakeNode.bring_up's names


@dataclass
class Served:
    client: TestClient
    service: Service
    node: CheckpointNode
    parent: str  # a healthy one-service env of OWNER
    parent_container: str

    def fork(self, **body: Any) -> dict[str, Any]:
        res = self.client.post(f"/v1/envs/{self.parent}/fork", json=body, headers=AUTH)
        assert res.status_code == 201, res.text
        answer: dict[str, Any] = res.json()
        return answer

    def env(self, env_id: str) -> dict[str, Any]:
        res = self.client.get(f"/v1/envs/{env_id}", headers=AUTH)
        assert res.status_code == 200, res.text
        answer: dict[str, Any] = res.json()
        return answer

    def children(self, made: dict[str, Any]) -> list[str]:
        return [e["id"] for e in made["envs"]]

    def finish(self) -> None:
        """Every worker's task done (the image's drop among them)."""
        self.service.ctx.workers.shutdown(wait=True)


AUTH = {"Authorization": f"Bearer {KEY}"}


def _version(services: list[str]) -> VersionRecord:
    specs = [
        ServiceSpec(name=n, image="x", image_digest="d", ports=[8000], health_path="/health")
        for n in services
    ]
    return VersionRecord(
        id="ver_1",
        owner=OWNER,
        project=None,
        parent_env_id=None,
        agent_service=services[0],
        services=specs,
        volumes=[Volume(service=services[0], path="/work")],
        warm_fork=False,
        labels={},
        created_at="2025-01-01T00:00:00Z",
    )


def _serve(
    tmp_path: Path, node: CheckpointNode, abilities: Abilities, services: list[str]
) -> Served:
    """The server's app on ``node`` (the composition root: ``create_app``), its runtime's
    ``abilities`` as ``gvisor.use`` would give them, and a healthy env of ``services``."""
    config = ServerConfig(state_dir=tmp_path / "state", api_key=KEY)
    app = create_app(config, node=node)  # type: ignore[arg-type]  # the fake is a Node
    service: Service = app.state.service
    service.ctx.abilities = abilities
    node.service = service
    ingress = service.ctx.ingress
    close_idle = ingress.close_idle

    def closing(host: str) -> None:
        node.order.append(f"close_idle {host}")
        close_idle(host)

    ingress.close_idle = closing  # type: ignore[method-assign]
    version = _version(services)
    service.ctx.store.insert_version(version)
    with service.envs.admit.hold(OWNER, 1) as hold:
        (rec,) = service.envs.create(Admitted(hold, 1, "deny"), version, EnvOptions({}, 600, 10))
    parent = service.envs.wait(rec.id, READY, 10)
    assert parent.status == EnvStatus.HEALTHY, parent
    container = parent.runtime.containers[parent.agent_service]
    return Served(TestClient(app), service, node, rec.id, container)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    made: list[Served] = []

    def start(
        node: CheckpointNode, abilities: Abilities = GVISOR, services: list[str] | None = None
    ) -> Served:
        served = _serve(tmp_path, node, abilities, services or ["agent"])
        made.append(served)
        return served

    yield start
    for served in made:
        served.service.ctx.workers.shutdown(wait=True)
        served.service.ctx.store.close()


def _dropped_soon(node: CheckpointNode, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not node.dropped and time.monotonic() < deadline:
        time.sleep(0.01)


def test_an_auto_fork_resumes_every_child_from_one_checkpoint_then_lets_it_go(
    serve: Any,
) -> None:
    """Guards the whole path: the lifecycle asking for the checkpoint (fork._checkpoint),
    the image carried to each child's BootSpec (EnvOptions.restore -> EnvSpec.restore ->
    BootSpec.restore), the start recorded 'restored' from Booted.restored (envs._start_env),
    and the one drop once the children have left 'creating' (_drop_when_started). Breaking
    any of these (say, EnvOptions.of dropping ``restore``, or the drop submitted before the
    children are recorded and not waiting for them) fails an assert below."""
    node = CheckpointNode()
    served = serve(node)
    made = served.fork(count=3, kind="auto")
    children = served.children(made)
    assert len(children) == 3
    image = f"{served.parent}-ckpt-1"
    assert node.checkpoints == [(served.parent, served.parent_container)]
    # The ingress's idle connections to the parent go before the save (they cannot be saved).
    assert node.order.index("close_idle 10.1.0.2") < node.order.index(f"checkpoint {served.parent}")
    assert [node.specs[c].restore for c in children] == [image] * 3
    for env in made["envs"]:  # the fork's own answer
        assert env["start"] == "restored", env
        assert env["parent_id"] == served.parent
        assert [s["start"] for s in env["services"]] == ["restored"]
    for child in children:  # and what the API says of each later
        assert served.env(child)["start"] == "restored"
    _dropped_soon(node)
    served.finish()
    assert node.dropped == [(served.parent, image)]  # exactly once, every worker done
    # When it was let go of, every child had started (none left to resume from it).
    assert all(node.statuses_at_drop[c] in STARTED for c in children), node.statuses_at_drop
    last_boot = max(node.order.index(f"bring_up {c}") for c in children)
    assert node.order.index(f"drop {image}") > last_boot
    assert served.env(served.parent)["start"] == "cold"  # the parent is not a child


def test_a_node_that_cannot_save_the_sandbox_boots_the_children(serve: Any) -> None:
    """Guards the fallback (fork._checkpoint's ``except NodeError``): a refusal such as
    CheckpointUnsupported (an open WebSocket, a runsc too old) is no failure of the fork,
    its children boot from the snapshot of /work, and there is nothing to let go of.
    Without the except, the fork answers an error; with a Checkpoint made up anyway, the
    children's BootSpec.restore or the drop would say so."""
    node = CheckpointNode(refuse=CheckpointUnsupported("the env has an open connection"))
    served = serve(node)
    made = served.fork(count=2, kind="auto")
    children = served.children(made)
    assert node.checkpoints == [(served.parent, served.parent_container)]  # it was asked
    assert [node.specs[c].restore for c in children] == ["", ""]
    assert [e["start"] for e in made["envs"]] == ["cold", "cold"]
    assert [e["status"] for e in made["envs"]] == ["healthy", "healthy"]
    assert [served.env(c)["start"] for c in children] == ["cold", "cold"]
    served.finish()
    assert node.dropped == []


def test_a_volume_fork_never_saves_the_sandbox(serve: Any) -> None:
    """Guards the ``opts.kind != 'auto'`` check: kind volume asked for a snapshot of /work
    and boots, even where the node could save the sandbox."""
    node = CheckpointNode()
    served = serve(node)
    made = served.fork(count=2, kind="volume")
    assert node.checkpoints == []
    assert [node.specs[c].restore for c in served.children(made)] == ["", ""]
    assert [e["start"] for e in made["envs"]] == ["cold", "cold"]
    served.finish()
    assert node.dropped == []


def test_runc_never_saves_the_sandbox(serve: Any) -> None:
    """Guards the ``ctx.abilities.checkpoint is not None`` check with runc's abilities as
    create_app chooses them (EVERYTHING, whose checkpoint field is a reason): a node that
    could save one is never asked, and the children boot."""
    assert EVERYTHING.checkpoint  # runc's: a reason, not None
    node = CheckpointNode()
    served = serve(node, abilities=EVERYTHING)
    assert served.service.ctx.abilities is EVERYTHING  # create_app's choice, kept
    made = served.fork(count=2, kind="auto")
    assert node.checkpoints == []
    assert [node.specs[c].restore for c in served.children(made)] == ["", ""]
    assert [e["start"] for e in made["envs"]] == ["cold", "cold"]
    served.finish()
    assert node.dropped == []


def test_a_compose_env_is_not_saved(serve: Any) -> None:
    """Guards the one-service rule: a compose env's other services would boot again beside
    a restored server whose memory still holds the parent's connections to them."""
    node = CheckpointNode()
    served = serve(node, services=["agent", "db"])
    made = served.fork(count=2, kind="auto")
    assert node.checkpoints == []
    assert [e["start"] for e in made["envs"]] == ["cold", "cold"]
    served.finish()
    assert node.dropped == []


def test_a_child_whose_node_did_not_restore_it_stays_cold(serve: Any) -> None:
    """Guards that 'restored' is the node's answer (Booted.restored), not the request's:
    a child whose node no longer had the image booted instead, and says so. The image is
    still let go of once the children started. Recording 'restored' from
    EnvSpec.restore instead fails here."""
    node = CheckpointNode(restores=False)
    served = serve(node)
    made = served.fork(count=2, kind="auto")
    children = served.children(made)
    image = f"{served.parent}-ckpt-1"
    assert [node.specs[c].restore for c in children] == [image, image]  # it was asked to
    assert [e["start"] for e in made["envs"]] == ["cold", "cold"]
    assert [served.env(c)["start"] for c in children] == ["cold", "cold"]
    _dropped_soon(node)
    served.finish()
    assert node.dropped == [(served.parent, image)]
