"""Fixtures of the cluster tests (issue 18).

``seaweed`` (session scope): a real SeaweedFS (``denv.cluster.seaweed``, from the ``cluster``
extra) on 127.0.0.1 with a bucket, started once for the whole run; yields its ``StoreConfig``.
It is stopped and its data deleted at the end.

Shared helpers live in ``cluster_helpers`` (import them as ``from cluster_helpers import ...``,
never ``from conftest import``: in a whole run that name is another dir's conftest).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from denv.server.objstore import StoreConfig


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoreConfig]:
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
