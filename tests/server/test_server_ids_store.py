"""Ids (prefixed ULIDs) and the SQLite store."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from denv.server import ids
from denv.server.auth import KeyRing, create_api_key, digest
from denv.server.db import Store
from denv.server.records import EnvRecord, EnvStatus, LiveProc, Runtime, VersionRecord, Volume

CONTRACT_ENV_ID = re.compile(r"^env_[0-9A-HJKMNP-TV-Z]{26}$")


def test_ids_match_the_contract_and_sort_by_time() -> None:
    made = [ids.new_id("env") for _ in range(2000)]
    assert all(CONTRACT_ENV_ID.match(x) for x in made)
    assert made == sorted(made) and len(set(made)) == len(made)
    assert ids.is_id(made[0], "env") and not ids.is_id(made[0], "ver")
    assert not ids.is_id("env_" + "I" * 26, "env")  # I is not Crockford base32


def version(owner: str, vid: str) -> VersionRecord:
    return VersionRecord(
        id=vid,
        owner=owner,
        project="p",
        parent_env_id=None,
        agent_service="agent",
        services=[],
        volumes=[Volume(service="agent", path="/work", layers=["lyr_1"])],
        warm_fork=False,
        labels={},
        created_at="2025-01-01T00:00:00Z",
    )


def env(owner: str, vid: str) -> EnvRecord:
    return EnvRecord(
        id=ids.new_id("env"),
        owner=owner,
        version_id=vid,
        parent_id=None,
        project=None,
        agent_service="agent",
        egress="deny",
        labels={"a": "b"},
        status=EnvStatus.CREATING,
        start="cold",
        created_at="2025-01-01T00:00:00Z",
        expires_at="2025-01-01T01:00:00Z",
    )


def test_store_envs_versions_and_pages(tmp_path: Path) -> None:
    store = Store(tmp_path / "denv.db")
    assert store.instance_id() == store.instance_id()
    vid = ids.new_id("ver")
    store.insert_version(version("o1", vid))
    made = [env("o1", vid) for _ in range(5)]
    for e in made:
        store.insert_env(e)
    page = store.list_envs("o1", 3, None, None, None)
    assert [e.id for e in page] == [e.id for e in reversed(made)][:3]
    rest = store.list_envs("o1", 3, page[-1].id, None, None)
    assert [e.id for e in rest] == [made[1].id, made[0].id]
    assert store.list_envs("o2", 10, None, None, None) == []
    assert store.count_existing("o1") == 5 and store.version_in_use(vid)
    assert store.set_status(made[0].id, EnvStatus.DELETED)
    assert not store.set_status(made[0].id, EnvStatus.FAILED)  # deleted is final
    assert store.count_existing("o1") == 4
    assert store.list_projects("o1", 10, None) == [("p", "2025-01-01T00:00:00Z", vid, 1)]
    store.mark_version_deleted(vid)
    assert store.get_version(vid) is None
    assert store.get_version(vid, include_deleted=True) is not None
    store.close()


def test_live_group_selects_the_envs_of_one_container_not_deleted(tmp_path: Path) -> None:
    # A live fork picks its children's ports, and a delete decides whether the container
    # goes, from the envs of one group: the store selects them, among envs of other groups
    # and envs that are not live.
    store = Store(tmp_path / "denv.db")
    vid = ids.new_id("ver")
    store.insert_version(version("o1", vid))
    made: dict[str, list[str]] = {"g1": [], "g2": [], "none": []}
    for i, group in enumerate(["g1", "g1", "g2", "none", "g1"]):
        rec = env("o1", vid)
        if group != "none":
            proc = LiveProc(group=group, container="c", pid=100 + i, start=1, port=20001 + i)
            rec = replace(rec, runtime=Runtime(live=proc))
        store.insert_env(rec)
        made[group].append(rec.id)
    assert sorted(e.id for e in store.live_group("g1")) == sorted(made["g1"])
    assert [e.runtime.live.port for e in store.live_group("g2") if e.runtime.live] == [20003]
    assert store.set_status(made["g1"][0], EnvStatus.DELETED)
    assert sorted(e.id for e in store.live_group("g1")) == sorted(made["g1"][1:])
    assert store.live_group("none") == [] and store.live_group("g3") == []
    store.close()


def test_extra_api_keys_are_accepted_by_a_running_keyring(tmp_path: Path) -> None:
    store = Store(tmp_path / "denv.db")
    ring = KeyRing(store)
    key = create_api_key(tmp_path)
    assert key.startswith("dak_") and len(key) == 47
    assert ring.owner_of(key) == digest(key)
    assert ring.owner_of("dak_unknown") is None
    store.close()
