"""An agent keeps the settings it was started with: `denv cluster up` starts the agents before
its `denv serve`, so the server it starts must ask them for exactly those, and a server that
asks an agent already running for others says which (without Ray: the command line and the
settings are compared as the server builds them)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from denv.cluster import local_server, ray_cluster, serve
from denv.cluster.agent import AgentConfig
from denv.server.node.cluster import options
from denv.server.serve_options import add_arguments, config_from_args


def asked_by_serve(argv: list[str]) -> AgentConfig:
    """What a `denv serve` run with ``argv`` asks of every agent."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(argv[1:])  # argv[0] is "serve"
    found = options.settings(args)
    assert found is not None
    return serve.agent_config(found, config_from_args(args, cluster_package=True))


@pytest.mark.parametrize("merge_pages", [False, True])
@pytest.mark.parametrize("image_budget_mb", [None, 512])
def test_cluster_ups_server_asks_its_agents_for_what_they_were_started_with(
    tmp_path: Path, merge_pages: bool, image_budget_mb: int | None
) -> None:
    caps: dict[str, object] = {"max_envs": 7, "max_memory_mb": 900}
    if image_budget_mb is not None:
        caps["image_budget_mb"] = image_budget_mb
    if merge_pages:
        caps["merge_pages"] = True
    (tmp_path / "creds").write_text('{"access_key": "a", "secret_key": "s"}')
    (tmp_path / "key").write_text("dak_test\n")
    (tmp_path / "key").chmod(0o600)
    started = local_server.caps_config(tmp_path, caps)  # what up() starts the agents with
    state = {"address": "127.0.0.1:6379", "store": {"endpoint": "http://127.0.0.1:8333",
             "bucket": "denv", "credentials": str(tmp_path / "creds")}}  # fmt: skip
    argv = local_server.serve_argv(state, started, tmp_path / "server", tmp_path / "key", 8080)
    assert ("--merge-pages" in argv) is merge_pages
    asked = asked_by_serve(argv)
    assert ray_cluster.settings_differ(started.model_dump(mode="json"), asked) == []
    assert asked.merge_pages is merge_pages


def test_a_server_asking_a_running_agent_for_other_settings_says_which(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    running = local_server.agent_config(tmp_path).model_dump(mode="json")
    wanted = local_server.agent_config(tmp_path, merge_pages=True)
    assert ray_cluster.settings_differ(running, wanted) == ["merge_pages=False (asked: True)"]
    with caplog.at_level(logging.WARNING, logger=ray_cluster.log.name):
        ray_cluster.warn_settings("n1", running, wanted)
        ray_cluster.warn_settings("n2", running, local_server.agent_config(tmp_path))  # the same
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert "node n1" in message and "merge_pages=False (asked: True)" in message
    assert "denv cluster down" in message


def test_a_gvisor_server_asks_its_agents_for_gvisor(tmp_path: Path) -> None:
    (tmp_path / "creds").write_text('{"access_key": "a", "secret_key": "s"}')
    (tmp_path / "key").write_text("dak_test\n")
    (tmp_path / "key").chmod(0o600)
    started = local_server.caps_config(tmp_path, {})
    state = {"address": "127.0.0.1:6379", "store": {"endpoint": "http://127.0.0.1:8333",
             "bucket": "denv", "credentials": str(tmp_path / "creds")}}  # fmt: skip
    argv = local_server.serve_argv(state, started, tmp_path / "server", tmp_path / "key", 8080)
    asked = asked_by_serve([*argv, "--isolation", "gvisor"])
    assert asked.isolation == "gvisor"
    # Agents started for runc say so to a server that asks for gvisor (a warning naming it).
    differ = ray_cluster.settings_differ(started.model_dump(mode="json"), asked)
    assert differ == ["isolation='runc' (asked: 'gvisor')"]
