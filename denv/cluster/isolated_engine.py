"""An isolated node's own Docker Engine (``isolation``): its dockerd, run in the node's
network namespace and cgroup with a data root, exec root and socket of its own; and the
images ``denv cluster up --isolated --image`` names, copied into it from this machine's engine
(``docker save`` once, ``docker load`` into each node).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from .isolation import FREEZER, docker_host, node_prefix, run_cmd
from .processes import ClusterError, session_pids, spawn, stop_session, tail

ENGINE_START_S = 60.0


def check_images(images: list[str]) -> None:
    """ClusterError naming the images this machine's engine lacks (before anything starts)."""
    missing = [
        image
        for image in images
        if run_cmd("docker", "image", "inspect", image, check=False).returncode != 0
    ]
    if missing:
        raise ClusterError(
            f"--image {', '.join(missing)}: not on this machine's Docker Engine, so it cannot "
            "be copied to the nodes: build or load it first (docker images)"
        )


def start_engine(node: dict[str, Any], log_path: Path) -> int:
    """The node's dockerd, in its namespace and cgroup; its session id once it answers.
    An engine of the node that still answers (its node's Ray died, its engine did not: a cut
    network) is kept: a second dockerd would take its socket, and the first its containers."""
    if node.get("engine_sid") and session_pids(int(node["engine_sid"])):
        if run_cmd("docker", "-H", docker_host(node), "version", check=False).returncode == 0:
            return int(node["engine_sid"])
        stop_session(int(node["engine_sid"]), grace_s=10.0)  # hung: restarted, as by systemd
    root, run = Path(node["root"]), Path(node["run"])
    root.mkdir(parents=True, exist_ok=True)
    run.mkdir(mode=0o700, exist_ok=True)
    for stale in ("dockerd.pid", "docker.sock"):  # a killed engine's (a restarted node)
        (run / stale).unlink(missing_ok=True)
    (FREEZER / node["cgroup"]).mkdir(exist_ok=True)
    cmd = [
        *node_prefix(node),
        "dockerd",
        f"--host={docker_host(node)}",
        f"--data-root={root / 'data'}",
        f"--exec-root={run / 'exec'}",
        f"--pidfile={run / 'dockerd.pid'}",
        f"--bip={node['bip']}",
        f"--cgroup-parent=/{node['cgroup']}",
    ]
    sid = spawn(cmd, log_path)
    deadline = time.monotonic() + ENGINE_START_S
    while True:
        done = run_cmd("docker", "-H", docker_host(node), "version", check=False)
        if done.returncode == 0:
            return sid
        if not session_pids(sid) or time.monotonic() > deadline:
            raise ClusterError(
                f"the Docker Engine of node {node['netns']} did not start: {tail(log_path)}"
            )
        time.sleep(0.3)


def load_images(iso: dict[str, Any], names: list[str], work_dir: Path) -> None:
    """Copy ``iso["images"]`` from this machine's engine into the engines of ``names`` (saved
    once, loaded into the nodes side by side), skipping those a node already has."""
    images = list(iso["images"])
    if not images or not names:
        return
    missing = [n for n in names if _lacks(iso["nodes"][n], images)]
    if not missing:
        return
    tar = work_dir / "images.tar"
    done = run_cmd("docker", "save", "-o", str(tar), *images, check=False)
    if done.returncode != 0:
        tar.unlink(missing_ok=True)
        raise ClusterError(
            f"cannot copy {', '.join(images)} to the nodes: {done.stderr.strip()} "
            "(build or load them into this machine's Docker Engine first: docker images)"
        )
    errors: list[str] = []

    def load(name: str) -> None:
        out = run_cmd(
            "docker",
            "-H",
            docker_host(iso["nodes"][name]),
            "load",
            "-q",
            "-i",
            str(tar),
            check=False,
        )
        if out.returncode != 0:
            errors.append(f"node {name}: {out.stderr.strip()}")

    try:
        threads = [threading.Thread(target=load, args=(n,)) for n in missing]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        tar.unlink(missing_ok=True)
    if errors:
        raise ClusterError(f"loading images into the nodes failed: {'; '.join(errors)}")


def _lacks(node: dict[str, Any], images: list[str]) -> bool:
    done = run_cmd("docker", "-H", docker_host(node), "image", "inspect", *images, check=False)
    return done.returncode != 0
