"""The disk budget and version lifetimes without Docker: which versions expire (pure), the
collector on a real store behind a fake node, the accounting that the 507s are made of, and
the options that set them."""

from __future__ import annotations

import argparse
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_server_node_seam import FakeNode

from denv.server.config import MIB, ServerConfig
from denv.server.db import Store, iso, now
from denv.server.errors import ApiError
from denv.server.ingress.routes import IngressTable
from denv.server.lifecycle.collect import Candidate, Collector, expired
from denv.server.lifecycle.context import Context
from denv.server.lifecycle.disk import check_disk, disk_size, key_bytes
from denv.server.lifecycle.versions import Versions
from denv.server.net.host_guard import HostGuardWatch
from denv.server.node.seam import Node
from denv.server.records import (
    EnvDeletion,
    EnvRecord,
    EnvStatus,
    ServiceSpec,
    VersionOrigin,
    VersionRecord,
    Volume,
    VolumeSlot,
)
from denv.server.serve_options import UsageError, add_arguments, config_from_args

# -- which versions expire (pure)


def cand(vid: str, parent: str | None = None) -> Candidate:
    return Candidate(vid, "o", parent, "2026-01-01T00:00:00Z")


def test_a_chain_of_fork_versions_goes_leaf_first_in_one_pass_without_grace() -> None:
    chain = [cand("r"), cand("f1", "r"), cand("f2", "f1")]
    parents = {"r": None, "f1": "r", "f2": "f1"}
    chosen, idle = expired(chain, set(), parents, {}, now_s=100.0, grace_s=0)
    assert chosen == ["f2", "f1", "r"] and idle == {}


def test_a_version_an_env_runs_or_a_kept_child_names_stays_with_its_ancestors() -> None:
    chain = [cand("r"), cand("f1", "r"), cand("f2", "f1")]
    parents = {"r": None, "f1": "r", "f2": "f1"}
    assert expired(chain, {"f2"}, parents, {}, 100.0, 0) == ([], {})
    # a snapshot (not a candidate) made from f1 keeps f1 and r; f2 goes
    kept = {**parents, "snap": "f1"}
    assert expired(chain, set(), kept, {}, 100.0, 0) == (["f2"], {})


def test_grace_counts_from_when_a_pass_first_saw_a_version_idle() -> None:
    chain = [cand("r"), cand("f1", "r")]
    parents = {"r": None, "f1": "r"}
    chosen, idle = expired(chain, set(), parents, {}, now_s=100.0, grace_s=60)
    assert chosen == [] and idle == {"f1": 100.0}  # r is needed by f1 until f1 goes
    chosen, idle = expired(chain, set(), parents, idle, now_s=159.0, grace_s=60)
    assert chosen == [] and idle == {"f1": 100.0}
    chosen, idle = expired(chain, set(), parents, idle, now_s=160.0, grace_s=60)
    assert chosen == ["f1"] and idle == {"r": 160.0}  # its parent's clock starts now
    # f1 is gone; r is used again (an env from it): its clock is reset
    chosen, idle = expired([cand("r")], {"r"}, {"r": None}, idle, now_s=300.0, grace_s=60)
    assert chosen == [] and idle == {}


# -- the collector and the accounting, on a real store


class SizedNode(FakeNode):
    """A fake node whose layers have sizes and whose disk has ``free`` bytes free."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: dict[str, int] = {}
        self.deleted: list[str] = []
        self.free = 2**40
        self.walks = 0

    def layer_sizes(self, layer_ids: list[str]) -> list[int]:
        self.walks += len(layer_ids)
        return [self.sizes.get(x, 0) for x in layer_ids]

    def delete_layers(self, layer_ids: list[str]) -> None:
        self.deleted += layer_ids

    def free_disk_bytes(self) -> int:
        return self.free

    def changed_bytes(self, env_id: str, volumes: list[VolumeSlot], stop_after: int) -> list[int]:
        return [0 for _ in volumes]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[Context, Versions, SizedNode]]:
    node = SizedNode()
    seam: Node = node
    store = Store(tmp_path / "denv.db")
    config = ServerConfig(
        state_dir=tmp_path, api_key="dak_test", version_grace_s=0, max_disk_per_key_mb=10
    )
    ctx = Context(
        config=config, store=store, node=seam, ingress=IngressTable(), host_guard=HostGuardWatch()
    )
    yield ctx, Versions(ctx), node
    ctx.workers.shutdown(wait=True)
    store.close()


def version(
    versions: Versions,
    vid: str,
    layers: list[str],
    origin: VersionOrigin,
    parent: VersionRecord | None = None,
    owner: str = "o",
    created_at: str = "2026-01-01T00:00:00Z",
) -> VersionRecord:
    rec = VersionRecord(
        id=vid,
        owner=owner,
        project=None,
        parent_env_id="env_p" if parent else None,
        agent_service="agent",
        services=[ServiceSpec(name="agent", image="x", image_digest="d")],
        volumes=[Volume(service="agent", path="/work", layers=layers)],
        warm_fork=False,
        labels={},
        created_at=created_at,
        parent_version_id=parent.id if parent else None,
        origin=origin,
    )
    return versions.add(rec, parent)


def env_on(ctx: Context, env_id: str, version_id: str) -> None:
    t = "2026-01-01T00:00:00Z"
    ctx.store.insert_env(
        EnvRecord(
            id=env_id,
            owner="o",
            version_id=version_id,
            parent_id=None,
            project=None,
            agent_service="agent",
            egress="deny",
            labels={},
            status=EnvStatus.HEALTHY,
            start="cold",
            created_at=t,
            expires_at="2099-01-01T00:00:00Z",
        )
    )


def test_sizes_are_recorded_once_per_layer_and_a_version_counts_what_it_adds(
    world: tuple[Context, Versions, SizedNode],
) -> None:
    ctx, versions, node = world
    node.sizes = {"lyr_a": 3 * MIB, "lyr_b": 2 * MIB, "lyr_c": MIB}
    root = version(versions, "ver_r", ["lyr_a"], "sandbox")
    fork = version(versions, "ver_f", ["lyr_b", "lyr_a"], "fork", root)
    assert (root.size_bytes, fork.size_bytes) == (3 * MIB, 2 * MIB)
    assert node.walks == 2  # lyr_a was walked once, for the root
    version(versions, "ver_o", ["lyr_c", "lyr_a"], "fork", root, owner="other")
    assert node.walks == 3
    # a layer two versions name counts once; another key's versions count for it only
    assert key_bytes(ctx, "o") == 5 * MIB and key_bytes(ctx, "other") == 4 * MIB


def test_the_quota_and_the_floor_refuse_with_codes_naming_the_budget(
    world: tuple[Context, Versions, SizedNode],
) -> None:
    ctx, versions, node = world
    node.sizes = {"lyr_a": 9 * MIB}
    version(versions, "ver_r", ["lyr_a"], "sandbox")
    check_disk(ctx, "o", adding=MIB)  # 10 MiB: at the quota, not past it
    with pytest.raises(ApiError) as past:
        check_disk(ctx, "o", adding=MIB + 1)
    assert (past.value.status, past.value.code) == (507, "disk_quota_exceeded")
    assert "--max-disk-per-key" in past.value.message and "denv gc" in past.value.message
    assert past.value.details == {
        "limit": "disk_per_key",
        "used_bytes": 9 * MIB,
        "max_bytes": 10 * MIB,
    }
    check_disk(ctx, "other", adding=MIB)  # another key is unaffected
    node.free = ctx.config.min_free_disk_mb * MIB - 1
    with pytest.raises(ApiError) as low:
        check_disk(ctx, "other")
    assert (low.value.status, low.value.code) == (507, "disk_low")
    assert "--min-free-disk" in low.value.message


def test_the_collector_frees_expired_versions_and_only_their_own_layers(
    world: tuple[Context, Versions, SizedNode],
) -> None:
    ctx, versions, node = world
    node.sizes = {"lyr_a": 100, "lyr_b": 20, "lyr_c": 3, "lyr_s": 7}
    root = version(versions, "ver_r", ["lyr_a"], "sandbox")
    f1 = version(versions, "ver_f1", ["lyr_b", "lyr_a"], "fork", root)
    f2 = version(versions, "ver_f2", ["lyr_c", "lyr_b", "lyr_a"], "fork", f1)
    version(versions, "ver_d", [], "deploy")
    env_on(ctx, "env_1", f2.id)
    collector = Collector(ctx, versions)
    assert collector.collect("o").versions == 0  # f2 runs, its parents are needed
    ctx.store.mark_deleted("env_1", EnvDeletion(reason="requested", message="", at="x"))
    # a snapshot made from f1 keeps f1 and the root
    snap = version(versions, "ver_s", ["lyr_s", "lyr_b", "lyr_a"], "snapshot", f1)
    freed = collector.collect("o")
    assert (freed.versions, freed.layers, freed.bytes) == (1, 1, 3)
    assert node.deleted == ["lyr_c"]
    ctx.store.mark_version_deleted(snap.id)  # deleted by hand; then the rest expire
    freed = collector.collect(None)
    assert (freed.versions, freed.layers, freed.bytes) == (2, 2, 120)
    assert {v.id for v in ctx.store.all_versions()} == {"ver_d", "ver_s"} - {snap.id}
    assert ctx.store.sizes.get(["lyr_a", "lyr_b", "lyr_c"]) == {}


def test_a_pinned_version_outlives_a_collection(
    world: tuple[Context, Versions, SizedNode],
) -> None:
    ctx, versions, _ = world
    collector = Collector(ctx, versions)
    asked = version(versions, "ver_a", [], "fork")
    version(versions, "ver_b", [], "fork")
    with ctx.pins.pin("o", asked.id):  # a create from ver_a in flight
        # a fork in flight: its version is recorded before its children are
        version(versions, "ver_new", [], "fork", created_at=iso(now()))
        assert collector.collect("o").versions == 1
        assert {v.id for v in ctx.store.all_versions()} == {"ver_a", "ver_new"}
    assert collector.collect("o").versions == 2


# -- the options


def parse(*argv: str) -> ServerConfig:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from_args(parser.parse_args(["--state-dir", "/tmp/x", *argv]))


def test_disk_sizes_read_as_people_write_them() -> None:
    assert [disk_size(x) for x in ("500M", "50G", "1.5T", "2048", "0", "2GiB")] == [
        500,
        50 * 1024,
        int(1.5 * 1024 * 1024),
        2048,
        0,
        2048,
    ]
    with pytest.raises(argparse.ArgumentTypeError, match="500M or 50G"):
        disk_size("lots")
    cfg = parse("--max-disk-per-key", "1G", "--min-free-disk", "0", "--version-grace", "5")
    assert (cfg.max_disk_per_key_mb, cfg.min_free_disk_mb, cfg.version_grace_s) == (1024, 0, 5)
    with pytest.raises(UsageError, match="--version-grace"):
        parse("--version-grace", "-1")


def test_an_older_database_gains_origins_and_each_keys_layer_counts(tmp_path: Path) -> None:
    path = tmp_path / "denv.db"
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE versions (id TEXT PRIMARY KEY, owner TEXT NOT NULL, project TEXT, "
        "parent_env_id TEXT, agent_service TEXT NOT NULL, services TEXT NOT NULL, "
        "volumes TEXT NOT NULL, warm_fork INTEGER NOT NULL, labels TEXT NOT NULL, "
        "created_at TEXT NOT NULL, deleted INTEGER NOT NULL DEFAULT 0, "
        "parent_version_id TEXT, tools TEXT)"
    )
    vols = json.dumps([{"service": "agent", "path": "/work", "layers": ["lyr_b", "lyr_a"]}])
    for vid, project, parent_env in (
        ("ver_d", "p", None),
        ("ver_s", None, None),
        ("ver_k", None, "env_x"),
    ):
        old.execute(
            "INSERT INTO versions VALUES (?,?,?,?,'agent','[]',?,0,'{}','t',0,NULL,NULL)",
            (vid, "o", project, parent_env, vols),
        )
    old.commit()
    old.close()
    store = Store(path)
    origins = {v.id: (v.origin, v.implicit, v.size_bytes) for v in store.all_versions()}
    assert origins == {
        "ver_d": ("deploy", False, 0),
        "ver_s": ("sandbox", True, 0),
        "ver_k": ("snapshot", False, 0),  # a fork's or a snapshot's: kept
    }
    store.sizes.record({"lyr_a": 5, "lyr_b": 7})
    assert store.sizes.of_owner("o") == 12  # each layer once, though 3 versions name them
    for vid in origins:
        store.mark_version_deleted(vid)
    assert store.sizes.of_owner("o") == 0
    store.close()
