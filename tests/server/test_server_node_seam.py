"""Typed records and the node seam, without Docker: what crosses the seam is plain data,
and the env lifecycle runs on any node that implements it (here a fake one)."""

from __future__ import annotations

import pickle
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from denv.server.config import MAX_COUNT, ServerConfig
from denv.server.db import Store
from denv.server.errors import ApiError
from denv.server.ingress.routes import IngressTable
from denv.server.lifecycle.admission import Admitted
from denv.server.lifecycle.context import Context
from denv.server.lifecycle.env_records import EnvOptions
from denv.server.lifecycle.envs import Envs
from denv.server.net.host_guard import HostGuardWatch
from denv.server.node.errors import CheckpointUnsupported, EngineUnavailable
from denv.server.node.seam import (
    Booted,
    BootFailed,
    BootSpec,
    Cancelled,
    Checkpoint,
    ImageFacts,
    LayerOffer,
    LiveForked,
    Metered,
    Node,
    Owned,
    Usage,
)
from denv.server.records import (
    ALL,
    EXISTING,
    FINAL,
    READY,
    EnvStatus,
    LiveProc,
    Runtime,
    ServiceSpec,
    VersionRecord,
    Volume,
    VolumeSlot,
    volume_slots,
)

ROOT = Path(__file__).resolve().parents[2]


def test_env_status_is_the_contracts_and_its_groups_are_named() -> None:
    spec = yaml.safe_load((ROOT / "openapi" / "denv.yaml").read_text())
    assert spec["components"]["schemas"]["EnvStatus"]["enum"] == [s.value for s in EnvStatus]
    assert ALL - {EnvStatus.DELETED} == EXISTING
    assert {EnvStatus.FAILED, EnvStatus.DELETED} == FINAL
    assert {EnvStatus.RUNNING, EnvStatus.HEALTHY} == READY


def test_volume_slots_count_per_service() -> None:
    vols = [
        Volume(service="agent", path="/work", layers=["lyr_a"]),
        Volume(service="db", path="/data"),
        Volume(service="agent", path="/cache"),
    ]
    assert [(s.service, s.n, s.path, s.layers) for s in volume_slots(vols)] == [
        ("agent", 0, "/work", ["lyr_a"]),
        ("db", 0, "/data", []),
        ("agent", 1, "/cache", []),
    ]


def test_what_crosses_the_seam_survives_json_and_pickle() -> None:
    svc = ServiceSpec(name="agent", image="x", image_digest="sha256:1", ports=[8000])
    slot = VolumeSlot(service="agent", n=0, path="/work", layers=["lyr_1"])
    records = [
        BootSpec(env_id="env_1", services=[svc], agent="agent", egress="deny", volumes=[slot]),
        Booted(env_id="env_1", network="n", containers={"agent": "c1"}, agent_ip="10.0.0.2"),
        Booted(env_id="e", network="n", containers={}, agent_ip="ip", host_ports={8000: 32768}),
        Owned(containers={"c1": "env_1"}, networks={"n": "env_1"}, volume_envs=["env_1"]),
        LiveForked(
            stacks=[["lyr_2", "lyr_1"]],
            children=[LiveProc(group="env_1", container="c1", pid=7, start=1, port=8000), "died"],
            timings_ms={"fork_ms": 1.5},
        ),
        LayerOffer(address="10.0.0.5:40000", token="ab" * 32, digest="sha256:1", size=1 << 31),
    ]
    assert "ab" * 32 not in repr(records[-1])  # a one-time token, never in a log line
    for rec in records:
        assert type(rec).model_validate_json(rec.model_dump_json()) == rec
        assert pickle.loads(pickle.dumps(rec)) == rec
    failed = pickle.loads(pickle.dumps(BootFailed("exited", "gone", "db", "n", {"db": "c"})))
    assert (failed.code, failed.message, failed.service) == ("exited", "gone", "db")
    assert (failed.network, failed.containers) == ("n", {"db": "c"})
    down = pickle.loads(pickle.dumps(EngineUnavailable("not reachable", {"node": "n1"})))
    assert isinstance(down, EngineUnavailable) and down.code == "engine_unavailable"
    assert (down.message, down.details) == ("not reachable", {"node": "n1"})


class FakeNode:
    """A node that boots instantly and records what it was asked."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.cancelled: set[str] = set()
        self.fail_health = False

    def engine_version(self) -> str:
        return "fake"

    def room(self) -> int | None:
        return None

    def room_beside(self, env_id: str) -> int | None:
        return None

    def live_adopt(self, env_id: str, proc: LiveProc) -> None:
        pass

    def lost(self) -> dict[str, str]:
        return {}

    def layer_storage(self, layer_ids: list[str]) -> str:
        return "node"

    def layer_nodes(self, layer_ids: list[str]) -> list[str]:
        return ["local"]

    def lost_reason(self, env_id: str) -> str | None:
        return None

    def inspect_image(self, image: str, pull: bool) -> ImageFacts:
        return ImageFacts(id="sha256:" + image, command=["uvicorn", "app:app"])

    def seed_layer(self, image_id: str, path: str) -> str | None:
        return None

    def has_layer(self, layer_id: str) -> bool:
        return True

    def layer_ids(self) -> set[str]:
        return set()

    def delete_layers(self, layer_ids: list[str]) -> None:
        pass

    def layer_sizes(self, layer_ids: list[str]) -> list[int]:
        return [0 for _ in layer_ids]

    def free_disk_bytes(self) -> int:
        return 2**40

    def drop_partial_layers(self) -> None:
        pass

    def bring_up(self, spec: BootSpec) -> Booted:
        self.calls.append(f"bring_up {spec.env_id} late={spec.late_mount}")
        if spec.env_id in self.cancelled:
            raise Cancelled()
        containers = {s.name: f"c-{s.name}" for s in spec.services}
        return Booted(env_id=spec.env_id, network="net", containers=containers, agent_ip="10.1.0.2")

    def wait_healthy(self, spec: BootSpec, booted: Booted, timeout_s: float) -> None:
        self.calls.append(f"wait_healthy {spec.env_id}")
        if self.fail_health:
            raise BootFailed("health_timeout", "/health did not answer", spec.agent)

    def mount_volumes(self, env_id: str, volumes: list[VolumeSlot]) -> None:
        self.calls.append(f"mount_volumes {env_id}")

    def prioritize(self, env_id: str, containers: list[str]) -> None:
        pass

    def snapshot(
        self, env_id: str, containers: list[str], volumes: list[VolumeSlot]
    ) -> list[list[str]]:
        self.calls.append(f"snapshot {env_id}")
        return [["lyr_new", *v.layers] for v in volumes]

    def changed_bytes(self, env_id: str, volumes: list[VolumeSlot], stop_after: int) -> list[int]:
        return [0 for _ in volumes]

    def checkpoint(self, env_id: str, container: str) -> Checkpoint:
        raise CheckpointUnsupported("a fake node has no sandbox to save")

    def drop_checkpoint(self, env_id: str, image: str) -> None:
        pass

    def cancel(self, env_id: str) -> None:
        self.cancelled.add(env_id)

    def teardown(self, env_id: str, containers: list[str]) -> None:
        self.calls.append(f"teardown {env_id}")

    def stop(self) -> None:
        pass

    def states(self, env_id: str | None = None) -> dict[str, str]:
        return {}

    def logs(self, env_id: str, service: str, tail: int) -> list[str]:
        return [f"log of {service}"]

    def memory_bytes(self, containers: list[str]) -> int:
        return 0

    def logs_after(
        self, env_id: str, service: str, cursor: str | None, tail: int, wait_s: float
    ) -> tuple[list[str], str | None]:
        return [f"log of {service}"], "1"

    def usage(self, envs: list[Metered]) -> list[Usage]:
        return [Usage(env_id=e.env_id) for e in envs]

    def exit_reason(self, env_id: str, service: str) -> str | None:
        return None

    def owned(self) -> Owned:
        return Owned()

    def remove_owned(self, owned: Owned) -> None:
        pass

    def recover(
        self,
        env_id: str,
        containers: dict[str, str],
        volumes: list[VolumeSlot],
        states: dict[str, str],
    ) -> str | None:
        return None


def _lifecycle(
    tmp_path: Path, node: FakeNode, workers: int = 4
) -> tuple[Envs, Store, VersionRecord]:
    config = ServerConfig(state_dir=tmp_path, api_key="dak_test")
    store = Store(tmp_path / "denv.db")
    seam: Node = node  # the fake is a Node as far as mypy is concerned
    pool = ThreadPoolExecutor(workers)
    ctx = Context(
        config=config,
        store=store,
        node=seam,
        ingress=IngressTable(),
        host_guard=HostGuardWatch(),
        workers=pool,
    )
    version = VersionRecord(
        id="ver_1",
        owner="o",
        project=None,
        parent_env_id=None,
        agent_service="agent",
        services=[
            ServiceSpec(
                name="agent", image="x", image_digest="d", ports=[8000], health_path="/health"
            )
        ],
        volumes=[Volume(service="agent", path="/work")],
        warm_fork=False,
        labels={},
        created_at="2025-01-01T00:00:00Z",
    )
    store.insert_version(version)
    return Envs(ctx), store, version


def _create(envs: Envs, version: VersionRecord) -> str:
    with envs.admit.hold("o", 1) as hold:
        recs = envs.create(Admitted(hold, 1, "deny"), version, EnvOptions({}, 60, 5))
    return recs[0].id


def test_a_cold_start_and_delete_go_through_the_seam(tmp_path: Path) -> None:
    node = FakeNode()
    envs, store, version = _lifecycle(tmp_path, node)
    env_id = _create(envs, version)
    done = envs.wait(env_id, READY, 10)
    assert done.status == EnvStatus.HEALTHY
    assert done.runtime.containers == {"agent": "c-agent"}
    (endpoint,) = done.runtime.endpoints
    assert endpoint.via == "ingress" and endpoint.token is None and endpoint.url == ""
    token = envs.ctx.ingress_keys.token(env_id, "agent", endpoint.port)  # derived, not kept
    assert envs.ctx.ingress.resolve(token) is not None
    assert node.calls == [f"bring_up {env_id} late=False", f"wait_healthy {env_id}"]
    envs.delete(env_id)
    assert env_id in node.cancelled and node.calls[-1] == f"teardown {env_id}"
    got = store.get_env(env_id)
    assert got is not None and got.status == EnvStatus.DELETED
    envs.ctx.workers.shutdown(wait=True)
    store.close()


def test_a_failed_boot_keeps_its_code_and_log_tail(tmp_path: Path) -> None:
    node = FakeNode()
    node.fail_health = True
    envs, store, version = _lifecycle(tmp_path, node)
    env_id = _create(envs, version)
    done = envs.wait(env_id, READY, 10)
    assert done.status == EnvStatus.FAILED and done.error is not None
    assert (done.error.code, done.error.service) == ("health_timeout", "agent")
    assert done.error.log_tail == ["log of agent"]
    assert done.runtime == Runtime(
        network="net",
        containers={"agent": "c-agent"},
        endpoints=done.runtime.endpoints,
        agent_ip="10.1.0.2",
        node="local",  # the node it was placed on (Booted.node)
    )
    envs.ctx.workers.shutdown(wait=True)
    store.close()


def test_a_delete_before_the_boot_cancels_it(tmp_path: Path) -> None:
    node = FakeNode()
    envs, store, version = _lifecycle(tmp_path, node, workers=1)
    gate = threading.Event()
    envs.ctx.workers.submit(gate.wait)  # the one worker starts the env after the delete
    env_id = _create(envs, version)
    envs.delete(env_id)
    gate.set()
    envs.ctx.workers.shutdown(wait=True)
    assert not any(c.startswith("wait_healthy") for c in node.calls)
    got = store.get_env(env_id)
    assert got is not None and got.status == EnvStatus.DELETED
    store.close()


def test_a_failed_copy_of_a_zygote_leaves_the_creates_version_id_free(tmp_path: Path) -> None:
    """A zygote copy records its version under an id of its own: when the copy fails, the
    create boots and records its planned version itself (the copy once took the planned id,
    and the boot's insert failed with sqlite's UNIQUE constraint: a 500). The node is a fake
    here: a copy that dies on the real engine is made by no image on purpose."""
    from dataclasses import replace

    from denv.server.lifecycle.live.forks import LiveForks
    from denv.server.lifecycle.requests import EnvsCreate
    from denv.server.lifecycle.versions import Versions

    node = FakeNode()
    asked: list[list[tuple[str, int]]] = []

    def live_fork(
        parent_env: str, parent: LiveProc, volumes: list[VolumeSlot], children: Any, reseed: bool
    ) -> LiveForked:
        asked.append(list(children))
        stacks = [["lyr_zygote"] for _ in volumes]
        return LiveForked(stacks=stacks, children=["the copy died" for _ in children])

    node.live_fork = live_fork  # type: ignore[attr-defined]
    envs, store, version = _lifecycle(tmp_path, node)
    zygote_id = _create(envs, version)
    assert envs.wait(zygote_id, READY, 10).status == EnvStatus.HEALTHY
    proc = LiveProc(group=zygote_id, container="c-agent", pid=1, start=1, port=8000)
    runtime = store.get_env(zygote_id).runtime  # type: ignore[union-attr]
    store.set_runtime(zygote_id, runtime.model_copy(update={"live": proc}))
    zygote = store.get_env(zygote_id)
    assert zygote is not None
    planned = replace(version, id="ver_planned")
    with envs.admit.hold("o", 1) as hold:
        made, recs = LiveForks(envs.ctx, Versions(envs.ctx)).from_zygote(
            hold, zygote, planned, EnvsCreate()
        )
        assert envs.ctx.holds.held("o") == 0  # handed over as the copy's record was inserted
    assert asked and recs[0].status == EnvStatus.FAILED
    assert made.id != planned.id
    store.insert_version(planned)  # the boot's record of its version: no UNIQUE failure
    assert store.get_version("ver_planned") is not None
    envs.ctx.workers.shutdown(wait=True)
    store.close()


def test_envs_held_by_a_request_in_flight_count_against_the_keys_quota(tmp_path: Path) -> None:
    """Admission checks the env quota once and holds what it let through: a second request
    of the key sees the first one's envs before they are recorded, and the hold goes when
    the first request ends without recording them."""
    envs, store, _ = _lifecycle(tmp_path, FakeNode())
    limit = envs.ctx.config.max_envs_per_key
    held = [envs.admit.hold("o", min(MAX_COUNT, limit - n)) for n in range(0, limit, MAX_COUNT)]
    assert envs.ctx.holds.held("o") == limit and store.count_existing("o") == 0
    with pytest.raises(ApiError) as refused:
        envs.admit.hold("o", 1)
    assert (refused.value.status, refused.value.code) == (429, "quota_exceeded")
    envs.admit.hold("other", 1).release()  # another key's quota is its own
    for hold in held:
        hold.release()
    with envs.admit.hold("o", 1):  # the first request ended: its hold went with it
        assert envs.ctx.holds.held("o") == 1
    assert envs.ctx.holds.held("o") == 0
    store.close()


def test_a_fork_past_the_clusters_room_is_refused_before_its_version_is_written(
    tmp_path: Path,
) -> None:
    """A cluster's room is checked at admission: the fork's snapshot (its version) is never
    made for children that cannot be placed."""
    from denv.server.lifecycle.requests import EnvsCreate
    from denv.server.lifecycle.service import Service

    node = FakeNode()
    envs, store, version = _lifecycle(tmp_path, node)
    env_id = _create(envs, version)
    assert envs.wait(env_id, READY, 10).status == EnvStatus.HEALTHY
    node.room = lambda: 1  # type: ignore[method-assign]
    before = store.count_versions("o")
    with pytest.raises(ApiError) as refused:
        Service(envs.ctx).fork("o", env_id, EnvsCreate(count=3, kind="volume"))
    assert (refused.value.status, refused.value.code) == (429, "rate_limited")
    assert refused.value.details == {"limit": "cluster", "room": 1, "asked": 3, "retry_after_s": 5}
    assert store.count_versions("o") == before
    assert not any(c.startswith("snapshot") for c in node.calls), node.calls
    assert envs.ctx.holds.held("o") == 0
    envs.ctx.workers.shutdown(wait=True)
    store.close()


def test_a_stop_removes_the_spares_a_dropped_pool_left_to_the_workers(tmp_path: Path) -> None:
    """Deleting the only env that asked for a pool hands its ready spares' removal to the
    workers; the server's stop does not wait for them (``Service.shutdown``: cancel the
    queued, leave the running to the process's end), so the pools' shutdown removes them
    (a SIGTERM just after such a delete left both spares of a `warm: 2` env running)."""
    node = FakeNode()
    envs, store, version = _lifecycle(tmp_path, node, workers=1)
    version.warm_fork = True
    with envs.admit.hold("o", 1) as hold:
        (rec,) = envs.create(Admitted(hold, 1, "deny", warm=2), version, EnvOptions({}, 60, 5))
    assert envs.wait(rec.id, READY, 10).status == EnvStatus.HEALTHY
    deadline = time.monotonic() + 10
    while envs.warm.status(rec.id).ready < 2:
        assert time.monotonic() < deadline, envs.warm.status(rec.id)
        time.sleep(0.01)
    spares = {c.split()[1] for c in node.calls if c.endswith("late=True")}
    gate = threading.Event()
    envs.ctx.workers.submit(gate.wait)  # the one worker is busy: the removals queue
    envs.delete(rec.id)
    envs.ctx.workers.shutdown(wait=False, cancel_futures=True)  # as Service.shutdown
    envs.warm.shutdown()
    gate.set()
    assert len(spares) == 2 and all(f"teardown {x}" in node.calls for x in spares), node.calls
    store.close()


def test_what_the_nodes_runtime_takes_away_is_refused_by_its_reason(tmp_path: Path) -> None:
    """A runtime that takes live forks and warm spares away (gVisor's, chosen by the
    composition root) says so in ``Abilities``: the admission refuses ``live: true`` and
    ``warm`` with 409 naming its reason, resolves ``auto`` to a start without the launcher,
    and writes nothing for a refused request."""
    from denv.server.lifecycle.requests import EnvsCreate
    from denv.server.node.abilities import Abilities

    envs, store, version = _lifecycle(tmp_path, FakeNode())
    envs.ctx.abilities = Abilities(live="no launcher here", spares="no late mounts here")
    admit, before = envs.admit, store.count_versions("o")
    with admit.hold("o", 2) as hold:
        with pytest.raises(ApiError) as live:
            admit.from_version(hold, version, EnvsCreate(live=True), "deny")
        assert (live.value.status, live.value.code) == (409, "live_unsupported")
        assert "no launcher here" in str(live.value) and "kind volume" in str(live.value)
        with pytest.raises(ApiError) as warm:
            admit.from_version(hold, version, EnvsCreate(count=2, warm=2), "deny")
        assert (warm.value.status, warm.value.code) == (409, "conflict")
        assert "no late mounts here" in str(warm.value)
        auto = admit.from_version(hold, version, EnvsCreate(live="auto"), "deny")
        assert auto.live is False
    envs.ctx.abilities = Abilities()  # runc's: the same requests pass
    with admit.hold("o", 1) as hold:
        assert admit.from_version(hold, version, EnvsCreate(live="auto"), "deny").live == "auto"
    assert store.count_versions("o") == before and envs.ctx.holds.held("o") == 0
    envs.ctx.workers.shutdown(wait=True)
    store.close()


def test_a_live_fork_that_spills_holds_the_keys_quota_once(tmp_path: Path) -> None:
    """A live fork whose parent's node has room for fewer children than asked spills the
    rest to a volume fork on other nodes, all under the one hold its admission took: a fork
    that fits the key's quota exactly is let through and counted once (the spill used to let
    go of the fork's hold and take one of its own, after the live children were made). The
    node is a fake here: a node's room for live children is a cluster's (test_cluster_live
    spills on a real one)."""
    from dataclasses import replace

    from denv.server.lifecycle.requests import EnvsCreate
    from denv.server.lifecycle.service import Service

    node = FakeNode()

    def live_fork(
        parent_env: str, parent: LiveProc, volumes: list[VolumeSlot], children: Any, reseed: bool
    ) -> LiveForked:
        procs: list[LiveProc | str] = [
            LiveProc(group=parent.group, container="c-agent", pid=9 + i, start=1, port=port)
            for i, (_, port) in enumerate(children)
        ]
        return LiveForked(stacks=[["lyr_fork"] for _ in volumes], children=procs)

    node.live_fork = live_fork  # type: ignore[attr-defined]
    node.room_beside = lambda group: 1  # type: ignore[method-assign]
    node.live_alive = lambda proc: True  # type: ignore[attr-defined]
    envs, store, version = _lifecycle(tmp_path, node)
    env_id = _create(envs, version)
    assert envs.wait(env_id, READY, 10).status == EnvStatus.HEALTHY
    proc = LiveProc(group=env_id, container="c-agent", pid=1, start=1, port=8000)
    runtime = store.get_env(env_id).runtime  # type: ignore[union-attr]
    store.set_runtime(env_id, runtime.model_copy(update={"live": proc}))
    envs.ctx.config = replace(envs.ctx.config, max_envs_per_key=store.count_existing("o") + 3)
    service = Service(envs.ctx)
    made = [e.rec for e in service.fork("o", env_id, EnvsCreate(count=3, kind="auto")).envs]
    assert sorted(e.start for e in made) == ["cold", "cold", "live"], made
    assert [e.spec.spill is not None for e in made] == [False, True, True], made
    assert envs.ctx.holds.held("o") == 0
    with pytest.raises(ApiError) as full:  # the quota is reached now, and counted right
        service.fork("o", env_id, EnvsCreate(count=1, kind="auto"))
    assert (full.value.status, full.value.code) == (429, "quota_exceeded")
    envs.ctx.workers.shutdown(wait=True)
    store.close()
