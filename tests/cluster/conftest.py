"""Fixtures of the cluster tests (issue 18).

``seaweed`` (session scope): a real SeaweedFS (``denv.cluster.seaweed``, from the ``cluster``
extra) on 127.0.0.1 with a bucket, started once for the whole run; yields its ``ObjectStoreConfig``.
It is stopped and its data deleted at the end.

``cluster`` (session scope): ONE 3-node local Ray cluster (``denv cluster up``: Ray nodes n0,
n1, n2 with their node agents, SeaweedFS, ``denv serve --cluster``; ``--isolated`` when
asked, see ``ISOLATED``) for the whole run; yields a ``cluster_helpers.LocalCluster``;
``denv cluster down --purge`` at the end must leave nothing.

Shared helpers live in ``cluster_helpers`` (import them as ``from cluster_helpers import ...``,
never ``from conftest import``: in a whole run that name is another dir's conftest).

In a whole run pytest imports each dir's conftest.py as the module ``conftest``, each one
replacing the one before, and this dir is collected before tests/e2e and tests/reliability,
whose modules ``from conftest import LocalDenv, start_server ...`` (tests/conftest.py's
helpers). So this conftest offers those helpers too (``_ROOT_HELPERS``), loaded from
tests/conftest.py under a name of their own (its fixtures stay where they are).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import LocalCluster, cluster_leftovers, cluster_sessions

from denv.server.config import ObjectStoreConfig

_ROOT_HELPERS = (
    "LocalDenv",
    "clean",
    "docker_engine",
    "instance_id",
    "leftovers",
    "pooled_fs_contents",
    "start_server",
    "stop",
)


def _root_helpers() -> dict[str, Any]:
    path = Path(__file__).resolve().parents[1] / "conftest.py"
    spec = importlib.util.spec_from_file_location("denv_tests_root_helpers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {name: getattr(module, name) for name in _ROOT_HELPERS}


globals().update(_root_helpers())


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObjectStoreConfig]:
    """A running SeaweedFS's S3 store (endpoint, bucket, credentials), shared by the session."""
    from denv.cluster import seaweed as sw

    try:
        sw.weed_binary()
    except sw.SeaweedError as e:
        pytest.fail(f"{e} (in this repo: make venv, or uv sync --all-extras --group dev)")
    data_dir = tmp_path_factory.mktemp("seaweed")
    store = sw.start(data_dir)
    try:
        yield store
    finally:
        sw.stop(data_dir, purge=True)


def _isolation_unavailable() -> str:
    from denv.cluster import isolation

    return isolation.available()


CLUSTER_NODES = 3
# The session's cluster shares this machine's engine by default; DENV_TEST_CLUSTER_ISOLATED=1
# makes it `up --isolated` (each node in its own network namespace with its own engine, the
# tests' images copied into each) where that can run (root, the cgroup freezer:
# ``isolation.available``). tests/cluster/test_isolated_nodes.py always runs a cluster of its
# own on isolated nodes. Measured here: the whole dir took 464 s and 424 s isolated, 369 s
# shared (load 1-8); with CI's whole run near its 50 min bound, CI keeps the shared one.
ISOLATED = os.environ.get("DENV_TEST_CLUSTER_ISOLATED") == "1" and not _isolation_unavailable()
ISOLATED_IMAGES = ("denv-http-standin:latest", "denv-echo-env:latest")
CLUSTER_MAX_ENVS = 4  # per node (denv serve --node-max-envs): capacity is testable
HERE = Path(__file__).resolve().parent
# Stops the session's cluster (idempotent): after the last test of this dir, not at the end
# of the whole run, so its Ray nodes (~2 GiB) do not idle through the other dirs' tests.
_stop_cluster: list[Callable[[], None]] = []


CLI = [sys.executable, "-m", "denv", "cluster"]


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """ONE local cluster for the whole run, started and stopped as a user does it, with
    ``denv cluster up`` and ``denv cluster down --purge``: 3 Ray nodes on this machine (each
    in its own network namespace with its own engine when ``ISOLATED``, the head then this
    machine's; else n0 the head), their node agents, SeaweedFS and ``denv serve --cluster``,
    each node capped
    at ``CLUSTER_MAX_ENVS`` envs. After the last test of tests/cluster ``down`` stops it
    all, and nothing may be left: processes, containers, networks, mounts, Ray's temp dir,
    the store's data, the cluster's directory. Its logs (the server's, Ray's) are copied
    first to pytest's temp dir ``cluster-logs*``, where a failure's request_id is found."""
    from denv.cluster import processes, seaweed

    cluster_dir = tmp_path_factory.mktemp("cluster")
    where = ["--state-dir", str(cluster_dir)]
    sizes = ["--nodes", str(CLUSTER_NODES), "--node-max-envs", str(CLUSTER_MAX_ENVS)]
    if ISOLATED:
        sizes += ["--isolated", *(f"--image={image}" for image in ISOLATED_IMAGES)]
    up = subprocess.run(
        [*CLI, "up", *sizes, *where],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if up.returncode != 0:
        pytest.fail(f"denv cluster up failed ({up.returncode}):\n{up.stderr[-4000:]}")
    state = processes.read_state(cluster_dir)
    assert state, f"denv cluster up wrote no cluster.json:\n{up.stderr}"
    exports = dict(
        line.removeprefix("export ").split("=", 1)
        for line in up.stdout.splitlines()
        if line.startswith("export ")
    )
    found = LocalCluster(
        url=state["server"]["url"],
        api_key=exports.get("DENV_API_KEY", ""),
        dir=cluster_dir,
        address=state["address"],
        nodes=[n["name"] for n in state["nodes"]],
        head=state["head"],
        ray_token=Path(state["ray_token"]),
        max_envs=CLUSTER_MAX_ENVS,
        store=seaweed.running(Path(state["store"]["data_dir"])),
        up_stdout=up.stdout,
        isolated=state.get("isolated"),
    )
    instances = list(found.instance_ids().values())
    logs_kept = tmp_path_factory.mktemp("cluster-logs")

    def stop() -> None:
        if not processes.read_state(cluster_dir):
            return  # stopped already
        from denv.cluster import ray_cluster

        ray_cluster.disconnect()  # up() and the tests joined the cluster as a driver
        sessions = cluster_sessions(cluster_dir)
        # `down --purge` deletes the cluster's directory, logs included: keep them, so that a
        # failed test's request_id can still be looked up in the server's log.
        if (cluster_dir / "logs").is_dir():
            shutil.copytree(cluster_dir / "logs", logs_kept, dirs_exist_ok=True)
        down = subprocess.run(
            [*CLI, "down", "--purge", *where], capture_output=True, text=True, timeout=300
        )
        assert down.returncode == 0, f"denv cluster down failed:\n{down.stderr} (logs: {logs_kept})"
        left = cluster_leftovers(cluster_dir, instances, sessions)
        if state.get("isolated"):
            from denv.cluster import isolation

            left += isolation.leftovers(state["isolated"])
        left += [f"Ray temp dir {state['ray_tmp']}"] if Path(state["ray_tmp"]).exists() else []
        store_dir = Path(state["store"]["data_dir"])
        left += [f"SeaweedFS data {store_dir}"] if store_dir.exists() else []
        left += [f"cluster dir {cluster_dir}"] if cluster_dir.exists() else []
        assert len(instances) == CLUSTER_NODES, instances
        assert not left, f"denv cluster down left: {left} (logs: {logs_kept})"

    _stop_cluster.append(stop)
    try:
        yield found
    finally:
        stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the last test of this dir (in the run's order) and its fixtures' teardown, stop
    the session's cluster."""
    yield
    if not _stop_cluster:
        return
    later = item.session.items[item.session.items.index(item) + 1 :]
    if not any(HERE in Path(it.path).resolve().parents for it in later):
        _stop_cluster.pop()()
