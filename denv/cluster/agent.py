"""The node agent: the node seam of one Ray node, run by a Ray actor pinned to that node.

What ``create_app`` builds for one machine, minus the API and the database: an ``Engine``
labelled with the agent's own instance id, a ``SubnetPool``, the host guard (firewall
rules of egress, kept in place by a thread), ``Volumes`` under the agent's own state dir,
and the ``DockerNode`` over them. The control plane calls any ``Node`` method through
:meth:`NodeAgent.call` (``RemoteNode`` in ``remote``); arguments, results and exceptions are
plain picklable values (``node`` says which).

The state dir is ``<state_root>/<node name>`` on the agent's machine and holds a file
``instance`` with the agent's instance id: a restarted agent (Ray restarts a dead actor on its
node), or an agent of a restarted control plane, labels what it makes with the same id and so
finds its containers, networks, volumes and layers again.

Several agents may share one machine and its Docker Engine (the local cluster): each has
its own instance id (``owned()`` sees only its own objects) and its own state dir. They
share the subnet pool's range safely: a ``SubnetPool`` skips subnets Docker already has and
takes the next one when Docker answers "Pool overlaps" (see ``subnets``); and the firewall's
generic rules are the same for every agent while each adds and removes only the per-env rules
of its own envs (see ``firewall``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from denv.server import ids
from denv.server.auth import private_dir
from denv.server.config import (
    DEFAULT_LIMITS,
    DEFAULT_MAX_VOLUME_MB,
    DEFAULT_SUBNET_POOL,
    DEFAULT_SUBNET_PREFIX,
    HOST_GUARD_CHECK_S,
)
from denv.server.docker import ksm
from denv.server.docker.boot import WARM_LABEL
from denv.server.docker.engine import Engine, container_name
from denv.server.docker.images import DEFAULT_BUDGET_MB
from denv.server.docker.node import DockerNode
from denv.server.gvisor import runtime as gvisor
from denv.server.ingress.relay import relayed, split_address
from denv.server.net.host_guard import HostGuardWatch
from denv.server.net.policy import HostGuardError
from denv.server.net.subnets import SubnetPool
from denv.server.node.errors import EngineUnavailable
from denv.server.node.seam import NODE_CALLS, Booted, NodeLost
from denv.server.records import Limits
from denv.server.volumes.overlay import Volumes

from . import ray_auth
from .relay import Relay, env_addresses, with_live_children

if TYPE_CHECKING:
    from .remote import RemoteNode

log = logging.getLogger(__name__)

INSTANCE_FILE = "instance"
RELAY_PORT_FILE = "relay-port"  # the port the relay had: taken again after a restart
ACTOR_PREFIX = "denv-node-"  # the agent of node "a" is the actor "denv-node-a"
NAMESPACE = "denv"
MAX_CONCURRENCY = 128  # calls at once: boots and waits block a thread for their whole time
STOP_DRAIN_S = 60.0  # after stop(): how long boots in flight may take to end (Cancelled)
IMAGE_GC_S = 300.0  # how often an agent collects the images it brought (and after each)
# Calls that need the node's engine (the reaper asks for states every few seconds): one
# answered means the engine is back.
ENGINE_CALLS = frozenset({"states", "owned", "engine_version", "inspect_image", "bring_up"})
_BRING_IMAGE = frozenset({"copy_image", "fetch_image", "pull_image"})


class AgentConfig(BaseModel):
    """What every agent of a cluster is started with (the same for all its nodes)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    state_root: str  # on each machine; an agent's state dir is <state_root>/<node name>
    subnet_pool: str = DEFAULT_SUBNET_POOL
    subnet_prefix: int = DEFAULT_SUBNET_PREFIX
    allow_private_egress: bool = False
    pull_credentials: bool = False
    max_volume_mb: int = DEFAULT_MAX_VOLUME_MB
    limits: Limits = DEFAULT_LIMITS
    max_envs: int = 0  # envs (spares included) one node holds; 0: no cap
    max_memory_mb: int = 0  # memory the envs of one node may use together; 0: no cap
    relay_port: int = 0  # each node's relay port; 0: the one it had, else a free one
    image_budget_mb: int = DEFAULT_BUDGET_MB  # the images a node brought, kept up to this
    live_netns: bool = True  # each live child in a network namespace (`denv serve --live-netns`)
    merge_pages: bool = False  # live envs' memory merged by the kernel (`--merge-pages`)
    isolation: str = "runc"  # runc or gvisor: what each env runs in (`denv serve --isolation`)


def instance_id(state_dir: Path) -> str:
    """The agent's instance id, made once and kept in ``<state_dir>/instance``."""
    path = state_dir / INSTANCE_FILE
    try:
        value = path.read_text().strip()
        if value:
            return value
    except FileNotFoundError:
        pass
    value = ids.ulid().lower()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(value + "\n")
    os.replace(tmp, path)
    return value


class NodeAgent:
    """One node's ``DockerNode``, its host guard and what the control plane asks of it.

    Ray runs it as a threaded actor (``ray_cluster.start_agent``); it is also a plain class,
    so it can run in-process.
    """

    def __init__(self, name: str, cfg: AgentConfig) -> None:
        self.name, self.cfg = name, cfg
        self.state_dir = Path(cfg.state_root) / name
        private_dir(self.state_dir)
        self.instance_id = instance_id(self.state_dir)
        # Fail fast, as denv serve does: without the guard, deny envs could reach the host.
        self.host_guard = HostGuardWatch()
        self.host_guard.check()
        self.engine = Engine(
            self.instance_id,
            SubnetPool(cfg.subnet_pool, cfg.subnet_prefix),
            firewall=self.host_guard.firewall,
            allow_private_egress=cfg.allow_private_egress,
        )
        self.engine.pull_credentials = cfg.pull_credentials
        self.saver = None  # how the runtime saves a sandbox (the node's checkpoints)
        if cfg.isolation == "gvisor":  # GvisorUnavailable naming the fix, before any env
            self.saver = gvisor.use(self.engine)[1]
        self.volumes = Volumes(self.state_dir, cfg.max_volume_mb)
        if self.volumes.fs is not None:
            self.volumes.fs.check()  # OSError naming the fix, before any env
        if cfg.merge_pages:
            ksm.enable()  # OSError naming the fix, before any env (as denv serve does)
        # Where other nodes reach this one (its layer offers): the Ray node's address.
        self.address = _ray_place(actor=True)[1] or "127.0.0.1"
        self.node = self._docker_node()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        # The engine's last outage: when a call first found it gone, and when one found it
        # back (None: still gone); (0, 0) when none was seen.
        self._engine_outage: tuple[float, float | None] = (0.0, 0.0)
        try:  # the firewall rules of envs that outlived the last agent process
            self.engine.adopt_egress()
        except Exception:
            log.exception("node %s: the egress rules of running envs were not taken back", name)
        threading.Thread(target=self._watch_guard, name="denv-guard", daemon=True).start()
        self.relay: Relay | None = None
        self.relay_address = ""  # "host:port" of the relay; "": envs are reached directly
        self._start_relay()
        log.info("denv node agent %s (instance %s) on %s", name, self.instance_id, self.state_dir)

    def _docker_node(self) -> DockerNode:
        node = DockerNode(
            self.engine,
            self.volumes,
            self.cfg.limits,
            peers=peer_agent,
            address=self.address,
            live_netns=self.cfg.live_netns,
            merge_pages=self.cfg.merge_pages,
            saver=self.saver,
        )
        node.images.budget_mb = self.cfg.image_budget_mb
        return node

    def _collect_images(self) -> None:
        with self._lock:
            node = self.node
        try:
            node.collect_images()
        except Exception:
            log.exception("node %s: collecting images failed", self.name)

    def _start_relay(self) -> None:
        """The relay that carries the control plane's ingress to this node's envs
        (``relay``), on the node's address; without the cluster's Ray token there is no
        key, and no relay: the ingress then connects to env addresses itself, which only
        works when it runs on this machine."""
        key = ray_auth.relay_key()
        if key is None:
            log.warning(
                "node %s: no relay (Ray runs without token authentication): the control "
                "plane reaches this node's envs only if it runs on this machine",
                self.name,
            )
            return
        host = self.address
        kept = self.state_dir / RELAY_PORT_FILE
        port = self.cfg.relay_port or _read_port(kept)
        envs = with_live_children(env_addresses(self.cfg.subnet_pool, self.cfg.subnet_prefix))
        relay = Relay(key, envs)
        try:
            bound = relay.start(host, port)
        except OSError:
            if self.cfg.relay_port or not port:
                raise
            log.warning("node %s: relay port %d is taken; a new one", self.name, port)
            relay = Relay(key, envs)
            bound = relay.start(host, 0)
        kept.write_text(f"{bound[1]}\n")
        self.relay, self.relay_address = relay, f"{host}:{bound[1]}"
        log.info("node %s: relay for the ingress at %s", self.name, self.relay_address)

    def _watch_guard(self) -> None:
        collected = time.monotonic()
        while not self._closed.wait(HOST_GUARD_CHECK_S):
            if time.monotonic() - collected > IMAGE_GC_S:
                self._collect_images()
                collected = time.monotonic()
            try:
                self.host_guard.check()
            except HostGuardError:
                pass  # logged by check, reported by info()
            except Exception:
                log.exception("node %s: host guard check failed", self.name)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``Node.<method>(*args, **kwargs)`` on this node's ``DockerNode``."""
        if method not in NODE_CALLS:
            raise AttributeError(f"{method!r} is not a method of the node seam")
        if method == "stop":
            return self._stop()
        with self._lock:
            node = self.node
        if method == "wait_healthy" and self.relay_address:  # the node probes its own side
            spec, booted, *rest = args
            ip = split_address(booted.agent_ip)[0]
            args = (spec, booted.model_copy(update={"agent_ip": ip}), *rest)
        try:
            result = getattr(node, method)(*args, **kwargs)
        except EngineUnavailable as exc:  # not a full subnet pool: the engine answered that
            if self._engine_outage[1] is not None:
                self._engine_outage = (time.time(), None)
                log.warning("node %s: its Docker Engine does not answer: %s", self.name, exc)
            raise
        if self._engine_outage[1] is None and method in ENGINE_CALLS:  # it answers again
            self._engine_outage = (self._engine_outage[0], time.time())
        if method == "exit_reason" and result is None:
            result = self._stopped_by_engine(*args)
        if method in _BRING_IMAGE:  # one more image on this node: within its budget?
            threading.Thread(target=self._collect_images, name="denv-image-gc", daemon=True).start()
        if method == "bring_up" and self.relay_address and isinstance(result, Booted):
            # The control plane reaches the env through this node's relay.
            result = result.model_copy(
                update={"agent_ip": relayed(result.agent_ip, self.relay_address)}
            )
        return result

    def _stopped_by_engine(self, env_id: str, service: str) -> str | None:
        """Why a container of ``env_id`` exited, when it stopped while its engine was away
        (an engine restarted without live-restore stops every container it finds running)."""
        gone_at, back_at = self._engine_outage
        if back_at is None or gone_at <= 0:
            return None
        info = self.engine.inspect(container_name(env_id, service)) or {}
        finished = _docker_time((info.get("State") or {}).get("FinishedAt"))
        if finished is None or not gone_at - 1 <= finished <= back_at + 1:
            return None
        at = time.strftime("%H:%M:%S UTC", time.gmtime(gone_at))
        return (
            f"node {self.name}'s Docker Engine stopped answering at {at}; "
            "its restart stopped the env's containers"
        )

    def _stop(self) -> None:
        """The control plane stops: boots in flight end (Cancelled); the agent stays up.

        ``DockerNode.stop`` is for good, but this agent outlives the control plane (its next
        process reconnects): later calls go to a fresh ``DockerNode`` over the same engine
        and volumes, while the stopped one's boots run into ``Cancelled``.
        """
        with self._lock:
            stopped = self.node
            self.node = self._docker_node()
        stopped.stop()

    def ping(self) -> str:
        """Its instance id: an answer means the agent is up."""
        return self.instance_id

    def hello(self) -> dict[str, Any]:
        """Its instance id and the settings it was started with: a running agent keeps
        them (``ray_cluster.Members`` says when a server asks for others)."""
        return {"instance_id": self.instance_id, "settings": self.cfg.model_dump(mode="json")}

    def info(self) -> dict[str, Any]:
        """The node's load and caps, for placement and ``denv cluster status``."""
        with self._lock:
            node = self.node
        containers = self.engine.my_containers()
        env_ids = sorted({(c.get("Labels") or {}).get("denv.env", "") for c in containers} - {""})
        warm = sorted(
            {
                (c.get("Labels") or {}).get("denv.env", "")
                for c in containers
                if (c.get("Labels") or {}).get(WARM_LABEL)
            }
            - {""}
        )
        ray_node_id, ip = _ray_place()
        return {
            "name": self.name,
            "ray_node_id": ray_node_id,
            "ip": ip,
            "pid": os.getpid(),
            "instance_id": self.instance_id,
            "state_dir": str(self.state_dir),
            "envs": len(env_ids),
            "env_ids": env_ids,
            "warm_env_ids": warm,  # booted as spares (a taken spare keeps its label)
            "memory_bytes": node.memory_bytes([str(c["Id"]) for c in containers]),
            "max_envs": self.cfg.max_envs,
            "max_memory_mb": self.cfg.max_memory_mb,
            "host_guard": self.host_guard.status(),
            "egress_unsafe": self.host_guard.egress_unsafe(),
            "relay": self.relay_address,
            "time": time.time(),
        }

    def close(self) -> None:
        """Stop the guard's thread and the relay (a test running the agent in-process)."""
        self._closed.set()
        if self.relay is not None:
            self.relay.close()


def peer_agent(name: str) -> RemoteNode:
    """The agent of node ``name`` of this cluster, for a layer copied straight from it
    (``DockerNode.copy_layer``); NodeLost when it has none running."""
    import ray  # here: the agent's module is imported without Ray by `denv cluster` commands

    from .remote import RemoteNode

    try:
        handle = ray.get_actor(ACTOR_PREFIX + name, namespace=NAMESPACE)
    except ValueError as exc:
        raise NodeLost(name, "it has no node agent running") from exc
    return RemoteNode(name, handle)


def _docker_time(value: Any) -> float | None:
    """Seconds since the epoch of a Docker timestamp ("2026-12-03T12:24:50.1234Z"), None
    for none (Docker's zero time "0001-01-01T00:00:00Z" included)."""
    if not isinstance(value, str) or value.startswith("0001-"):
        return None
    try:
        whole = datetime.strptime(value[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    except ValueError:
        return None
    return whole.timestamp()


def _read_port(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return 0


def _ray_place(actor: bool = False) -> tuple[str, str]:
    """(Ray node id, IP) of the process, ("", "") outside Ray (or, with ``actor``, outside
    a Ray actor: a driver's IP is Ray's guess from its default route, not a node's
    address)."""
    try:
        import ray

        if not ray.is_initialized():
            return "", ""
        if actor and ray.get_runtime_context().get_actor_id() is None:
            return "", ""
        ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        return ray.get_runtime_context().get_node_id(), ip
    except Exception:
        return "", ""
