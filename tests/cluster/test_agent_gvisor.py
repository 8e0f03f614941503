"""A cluster node agent asked for gvisor (``AgentConfig.isolation``, which ``denv serve
--cluster --isolation gvisor`` sets) boots its envs under gVisor's runtime. The agent runs in
this process, as Ray would run it, on the machine's real engine and runsc."""

from __future__ import annotations

from pathlib import Path

import docker
import httpx
from cluster_helpers import standin_boot

from denv.cluster.agent import AgentConfig, NodeAgent
from denv.server.gvisor import runtime
from denv.server.volumes.mounts import unmount_all


def test_an_agent_asked_for_gvisor_boots_under_it(tmp_path: Path) -> None:
    agent = NodeAgent(
        "gvisor-t", AgentConfig(state_root=str(tmp_path / "nodes"), isolation="gvisor")
    )
    booted = None
    try:
        spec = standin_boot(agent, 90)
        booted = agent.call("bring_up", spec)
        agent.call("wait_healthy", spec, booted, 90)
        (cid,) = booted.containers.values()
        container = docker.from_env().containers.get(cid)
        assert container.attrs["HostConfig"]["Runtime"] == runtime.RUNTIME
        release = container.exec_run(["uname", "-r"]).output.decode().strip()
        assert release != Path("/proc/sys/kernel/osrelease").read_text().strip()
        res = httpx.get(f"http://{booted.agent_ip}:8000/health", trust_env=False, timeout=10)
        assert res.status_code == 200
    finally:
        if booted is not None:
            agent.call("teardown", booted.env_id, list(booted.containers.values()))
        agent.close()
        unmount_all(tmp_path)
