"""A Ray head started by denv asks no cloud metadata server where it runs, and sends its
"usage stats disabled" report nowhere beyond this machine.

Ray's own usage module is what would ask (``get_cluster_config_to_report``, run by the head's
dashboard process at every start): here it reads the ``HOME`` denv gives the head, and must
take its answer from the bootstrap config there, never calling the function that sends the
metadata requests. Measured on a whole ``denv cluster up`` with iptables counters on the
host's way out: 0 connections and 0 DNS queries with this, against 2 connections to
169.254.169.254 and 4-6 DNS queries for one bare ``ray start --head``.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path

import pytest
from ray._common.usage import usage_lib

from denv.cluster.ray_nodes import quiet_head_env


def test_the_heads_home_names_no_cloud_so_ray_asks_no_metadata_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = quiet_head_env(tmp_path / "ray")
    home = Path(env["HOME"])
    assert home.parent == tmp_path / "ray"  # removed with the Ray temp dir by `down`

    def asked() -> str:
        raise AssertionError("Ray asked the cloud metadata servers")

    monkeypatch.setattr(usage_lib, "get_cloud_from_metadata_requests", asked)
    monkeypatch.setenv("HOME", env["HOME"])
    # What the dashboard's usage module runs at the head's start, with the head's HOME.
    found = usage_lib.get_cluster_config_to_report(
        str(Path("~/ray_bootstrap_config.yaml").expanduser())
    )
    assert found.cloud_provider == "local"


def test_a_node_agent_on_the_head_keeps_the_docker_credentials_of_the_real_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    real = Path.home() / ".docker"
    assert quiet_head_env(tmp_path)["DOCKER_CONFIG"] == str(real)
    monkeypatch.setenv("DOCKER_CONFIG", "/etc/denv-docker")
    assert quiet_head_env(tmp_path)["DOCKER_CONFIG"] == "/etc/denv-docker"


def test_the_disabled_report_goes_to_a_closed_port_on_loopback(tmp_path: Path) -> None:
    url = urllib.parse.urlsplit(quiet_head_env(tmp_path)["RAY_USAGE_STATS_REPORT_URL"])
    assert (url.hostname, url.port) == ("127.0.0.1", 0)  # port 0: nothing can listen there
