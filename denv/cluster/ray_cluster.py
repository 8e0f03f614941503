"""The control plane's view of a Ray cluster: which nodes run envs, and their agents.

A Ray node runs envs when it offers the custom resource ``denv_node``; its *node name* is
given by a second resource ``denv_node_<name>`` (``ray start --resources
'{"denv_node": 1, "denv_node_gpu-a": 1}'`` makes node ``gpu-a``). A node without one is
named ``ray-<first 12 hex digits of its Ray node id>`` (a new name when Ray restarts it, so
give real machines a name). Names are lowercase letters, digits and ``-``. Resources, not
Ray's node labels, carry the name: labels are still experimental (hidden) in ``ray start``.

Each such node gets one agent: the detached actor ``denv-node-<name>`` in namespace
``denv`` (``agent.NodeAgent``), pinned to the node (hard node affinity), restarted by Ray
when its process dies (``max_restarts=-1``), outliving the control plane that started it
(a control-plane restart finds it again by name). When its Ray node dies the actor dies
with it; a node that comes back is a new Ray node and gets a new agent, which finds the
node's containers again through the instance id kept in its state dir.

    connect("auto")                       # or "10.0.0.5:6379"
    nodes = discover(AgentConfig(state_root="/var/lib/denv-node"))   # name -> RemoteNode
    alive()                               # {"n0", "n1"}
    members = members_fn("auto", cfg)     # for ClusterNode: members() -> live name -> Node
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import ray.exceptions
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from denv.server.node.seam import Node

from . import ray_auth
from .agent import ACTOR_PREFIX, MAX_CONCURRENCY, NAMESPACE, AgentConfig, NodeAgent
from .remote import RemoteNode

log = logging.getLogger(__name__)

RESOURCE = "denv_node"
NAME_RESOURCE = "denv_node_"  # + the node's name
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
AGENT_START_S = 120.0  # a new agent: a worker process, imports, the host guard's first check
RETRY_FAILED_S = 10.0  # an agent that failed to start is tried again this much later


def check_name(name: str) -> str:
    """``name`` if it can name a node; ValueError naming the rule otherwise."""
    if not NAME_RE.match(name):
        raise ValueError(
            f"node name {name!r}: use 1 to 40 lowercase letters, digits and '-', "
            "starting with a letter or digit"
        )
    return name


def connect(address: str = "auto", token_file: Path | None = None) -> None:
    """Join the Ray cluster at ``address`` (``auto``/``ray``: the one ``RAY_ADDRESS`` or a
    local ``ray start`` names) as a driver in namespace ``denv``; once per process (until
    ``disconnect``). With ``token_file`` this process joins with the token in it
    (``ray_auth``), else as Ray's variables say (``RAY_AUTH_MODE``, ``RAY_AUTH_TOKEN_PATH``)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return
    if token_file is not None:
        ray_auth.use_token(ray_auth.check_token_file(token_file))
    ray.init(
        address="auto" if address in ("", "auto", "ray") else address,
        namespace=NAMESPACE,
        log_to_driver=False,  # the agents' logs stay in each node's Ray log dir
        logging_level=logging.WARNING,
    )


def disconnect() -> None:
    """Leave the cluster ``connect`` joined, and forget the token it was given."""
    ray.shutdown()
    ray_auth.forget_token()


@dataclass(frozen=True)
class RayNode:
    """A Ray node offering ``denv_node``."""

    name: str
    node_id: str
    alive: bool
    ip: str


def node_name(resources: Mapping[str, Any], node_id: str) -> str:
    """The node's name from its ``denv_node_<name>`` resource (see the module's doc)."""
    for key in sorted(resources):
        if key.startswith(NAME_RESOURCE) and NAME_RE.match(key[len(NAME_RESOURCE) :]):
            return key[len(NAME_RESOURCE) :]
    return f"ray-{node_id[:12]}"


def denv_nodes() -> list[RayNode]:
    """Every Ray node (alive or dead) that offers ``denv_node``; alive ones win a name."""
    found: dict[str, RayNode] = {}
    for info in ray.nodes():  # type: ignore[no-untyped-call]
        resources = info.get("Resources") or {}
        if RESOURCE not in resources:
            continue
        node = RayNode(
            name=node_name(resources, str(info["NodeID"])),
            node_id=str(info["NodeID"]),
            alive=bool(info.get("Alive")),
            ip=str(info.get("NodeManagerAddress", "")),
        )
        if node.name not in found or (node.alive and not found[node.name].alive):
            found[node.name] = node
    return sorted(found.values(), key=lambda n: n.name)


def alive() -> set[str]:
    """Names of the nodes Ray sees alive (Ray's health checks notice a death in seconds)."""
    return {n.name for n in denv_nodes() if n.alive}


def start_agent(node: RayNode, cfg: AgentConfig) -> Any:
    """The agent actor of ``node``: the running one, else a new one pinned to it."""
    actor_cls: Any = ray.remote(NodeAgent)
    return actor_cls.options(
        name=ACTOR_PREFIX + node.name,
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        max_restarts=-1,
        max_task_retries=0,  # a boot or a teardown is never run twice behind our back
        max_concurrency=MAX_CONCURRENCY,
        num_cpus=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
    ).remote(node.name, cfg)


def find_agent(name: str) -> RemoteNode | None:
    """The running agent of node ``name`` without starting one, None when there is none."""
    try:
        return RemoteNode(name, ray.get_actor(ACTOR_PREFIX + name, namespace=NAMESPACE))
    except ValueError:
        return None


def discover(cfg: AgentConfig, timeout_s: float = AGENT_START_S) -> dict[str, RemoteNode]:
    """A ``RemoteNode`` per alive node offering ``denv_node``, its agent started if missing.

    Waits up to ``timeout_s`` for each agent to answer; one that does not (or failed to
    start: its error is logged) is left out.
    """
    members = Members(cfg)
    return members.wait(timeout_s)


class Members:
    """The live nodes and their agents, refreshed on each call (``ClusterNode.members``).

    A call lists Ray's nodes (one GCS request), starts agents for new nodes and returns, as
    ``RemoteNode``s, those whose agent answered; it never waits for an agent that is still
    starting (it joins a later call). A node Ray no longer sees alive is left out.
    """

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self._lock = threading.Lock()
        self._ready: dict[str, tuple[str, RemoteNode]] = {}  # name -> (ray node id, node)
        # name -> (ray node id, handle, its hello, when started)
        self._starting: dict[str, tuple[str, Any, Any, float]] = {}
        self._failed: dict[str, float] = {}  # ray node id -> when its agent failed
        self.errors: dict[str, str] = {}  # node name -> why its agent last failed to start
        self._alive: set[str] = set()  # the nodes the last refresh found alive

    def __call__(self) -> dict[str, Node]:
        return {name: node for name, node in self.refresh().items()}

    def refresh(self) -> dict[str, RemoteNode]:
        nodes = {n.name: n for n in denv_nodes() if n.alive}
        with self._lock:
            self._alive = set(nodes)
            for name in list(self._ready):
                if name not in nodes or self._ready[name][0] != nodes[name].node_id:
                    del self._ready[name]
            for name in list(self._starting):
                if name not in nodes or self._starting[name][0] != nodes[name].node_id:
                    del self._starting[name]
            now = time.monotonic()
            for name, node in nodes.items():
                if name in self._ready or name in self._starting:
                    continue
                if now - self._failed.get(node.node_id, -RETRY_FAILED_S) < RETRY_FAILED_S:
                    continue
                try:
                    handle = start_agent(node, self.cfg)
                except Exception as exc:  # a name taken by an actor of a dead node, ...
                    self._fail(name, node.node_id, f"its agent could not be started: {exc}")
                    continue
                # An agent started by an older denv has no hello: its ping says it is up.
                ask = getattr(handle, "hello", None) or handle.ping
                self._starting[name] = (node.node_id, handle, ask.remote(), now)
            self._collect(0.0)
            return {name: node for name, (_, node) in self._ready.items()}

    def _collect(self, timeout_s: float) -> None:
        """Move agents that answered their hello to ``_ready`` (lock held)."""
        if not self._starting:
            return
        refs = {ask: name for name, (_, _, ask, _) in self._starting.items()}
        done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        for ref in done:
            name = refs[ref]
            node_id, handle, _, _ = self._starting.pop(name)
            try:
                hello = ray.get(ref, timeout=0)
            except ray.exceptions.RayError as exc:
                cause = getattr(exc, "cause", None) or exc
                self._fail(name, node_id, f"its agent did not start: {cause}")
                # The name may still be held by an actor of this node's dead predecessor
                # (Ray restarts a detached actor pinned to a node that is gone, which cannot
                # be placed): release it, so that the next try starts one on this node.
                with contextlib.suppress(Exception):
                    ray.kill(handle, no_restart=True)
                continue
            if isinstance(hello, dict):
                warn_settings(name, hello.get("settings") or {}, self.cfg)
            else:
                log.warning(
                    "node %s: its agent runs an older denv, which does not say its settings: "
                    "stop the cluster's Ray nodes and start them again to run this one",
                    name,
                )
            self._ready[name] = (node_id, RemoteNode(name, handle))
            self.errors.pop(name, None)
        now = time.monotonic()
        for name, (node_id, _, _, started) in list(self._starting.items()):
            if now - started > AGENT_START_S:
                del self._starting[name]
                self._fail(name, node_id, f"its agent did not answer within {AGENT_START_S:.0f} s")

    def _fail(self, name: str, node_id: str, why: str) -> None:
        log.error("node %s: %s", name, why)
        self.errors[name] = why
        self._failed[node_id] = time.monotonic()

    def wait(self, timeout_s: float = AGENT_START_S) -> dict[str, RemoteNode]:
        """``refresh`` until the agent of every alive node answered, or ``timeout_s`` passed:
        an agent that failed to start is tried again (``RETRY_FAILED_S`` apart) meanwhile.
        ``errors`` says why each node left out is."""
        deadline = time.monotonic() + timeout_s
        while True:
            ready = self.refresh()
            alive_now = self._alive  # what this refresh found alive
            left = time.monotonic() - deadline
            if alive_now <= set(ready) or left >= 0:
                break
            with self._lock:
                self._collect(min(-left, 1.0))
            if not self._starting:
                time.sleep(min(-left, 0.5))
        with self._lock:
            for name in self._starting:
                log.warning("node %s: its agent is still starting (%.0f s)", name, timeout_s)
            return {name: node for name, (_, node) in self._ready.items()}


def settings_differ(running: Mapping[str, Any], wanted: AgentConfig) -> list[str]:
    """The settings where a running agent's differ from ``wanted``: "name=running (asked:
    wanted)" each."""
    asked = wanted.model_dump(mode="json")
    return [
        f"{key}={running.get(key)!r} (asked: {value!r})"
        for key, value in asked.items()
        if running.get(key) != value
    ]


def warn_settings(name: str, running: Mapping[str, Any], wanted: AgentConfig) -> None:
    """Say which of a server's settings an agent that was already running does not have:
    an agent keeps what it was started with (``denv cluster up`` starts the agents before
    ``denv serve``, with the same settings)."""
    differ = settings_differ(running, wanted)
    if differ:
        log.warning(
            "node %s: its agent was already running with other settings, which it keeps: "
            "%s. To apply this server's, stop the cluster's Ray nodes and start them again "
            "(denv cluster down, then up with the same options as this server)",
            name,
            ", ".join(differ),
        )


def members_fn(
    address: str, agent_config: AgentConfig | Mapping[str, Any], timeout_s: float = AGENT_START_S
) -> Members:
    """Connect to ``address`` and return the callable ``ClusterNode`` asks for its members;
    it waits (up to ``timeout_s``) for the agents of the nodes alive now to answer."""
    connect(address)
    cfg = (
        agent_config
        if isinstance(agent_config, AgentConfig)
        else AgentConfig.model_validate(dict(agent_config))
    )
    members = Members(cfg)
    members.wait(timeout_s)
    return members
