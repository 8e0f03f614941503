"""The node seam: what one machine does for the envs placed on it.

A *node* is a machine that runs envs: it holds images, volume layers and each env's network,
volumes and containers. The server's lifecycle code (``envs``, ``warm``, ``versions``,
``reconcile``) asks a node for everything it needs done there and never touches Docker, the
host's mounts or cgroups itself. ``DockerNode`` (``docker_node``) is the first node: the
local Docker Engine. A later one may be a Ray actor on another machine behind the same calls.

So every call takes and returns plain values: ids (``env_...``, ``lyr_...``, container ids),
strings, numbers, and *records*, frozen pydantic models that serialise to JSON unchanged
(``ServiceSpec``, ``VolumeSlot`` from ``records``; ``BootSpec``, ``Booted``, ``Owned`` here).
No live object, no callback crosses it; a boot is stopped by an explicit :meth:`Node.cancel`,
and its time limit is a number of seconds. Failures are exceptions holding plain values, of
one tree (``node.errors``), and none names an HTTP status: ``BootFailed`` (the env cannot
boot: a code for its ``error``), ``Cancelled``, ``NodeLost``, and the ``Refused`` ones
(``EngineUnavailable``, ``ImageNotFound``...), which the API answers as they are.

The calls, by what they serve::

    bring_up(BootSpec) -> Booted         network, volumes, containers (dependencies healthy
                                         first), the agent's address; BootFailed, Cancelled
    wait_healthy(BootSpec, Booted, s)    until the agent answers its health path
    mount_volumes(env_id, [VolumeSlot])  late mount into a running spare (rslave mounts)
    prioritize(env_id, [container])      full CPU weight for a spare someone waits for
    snapshot(env_id, [container], [VolumeSlot]) -> [[layer]]
                                         freeze, capture each volume's changes, thaw
    changed_bytes(env_id, [VolumeSlot], cap) -> [int]
    cancel(env_id) / teardown(env_id, [container]) / stop()
    states(env_id?) / logs(env_id, service, n) / memory_bytes([container])
    logs_after(env_id, service, cursor, n, s) -> (lines, cursor)
                                         a log's new lines, waiting up to s for one
    usage([Metered]) -> [Usage]          each env's memory and CPU time (its own cgroups)
    exit_reason(env_id, service)         "out of memory ..." when the OOM killer ended it
    owned() -> Owned / remove_owned(Owned) / recover(...) / drop_partial_layers()
    live_adopt(env_id, LiveProc)         after a restart: a live env still runs in its group
    room() / room_beside(env_id) / lost() / layer_storage([layer])
                                         a cluster's capacity, dead nodes, durability
    engine_version() / resolve_image / image_labels / seed_layer / has_layer
    layer_ids() / delete_layers([layer]) / layer_sizes([layer]) / free_disk_bytes()
    layer_digest / offer_layer(layer) -> LayerOffer / copy_layer(layer, origin)
    upload_layer / fetch_layer           layers between nodes and object storage (layerpack),
                                         as streams (file to socket to file, file to S3),
                                         never a whole layer in memory

A cluster's members also implement ``ImageNode``: images copied between nodes, through
object storage or pulled, the same way, and collected under each node's budget.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import Field

from denv.server.config import StoreConfig

# The failures the calls below name, kept importable here (their tree: ``node.errors``).
from denv.server.node.errors import BootFailed as BootFailed
from denv.server.node.errors import Cancelled as Cancelled
from denv.server.node.errors import NodeLost as NodeLost
from denv.server.records import LiveProc, Record, ServiceSpec, VolumeSlot


class BootSpec(Record):
    """What to bring up for one env (or a warm spare, which carries its future env id)."""

    env_id: str
    services: list[ServiceSpec]  # in start order: dependencies first
    agent: str  # the service that serves OpenEnv
    egress: str  # "deny": an internal network; "allow": the agent's ports published
    env: dict[str, str] = Field(default_factory=dict)  # the agent's env overrides
    volumes: list[VolumeSlot] = Field(default_factory=list)
    late_mount: bool = False  # mount points stay empty until mount_volumes (a spare)
    live: bool = False  # the agent runs under the live-fork launcher (denv.server.docker.live)
    warm_pool: str | None = None  # a spare's pool: it boots at low CPU weight, primed
    owner: str = ""  # the API key it is booted for: its CPU share and its turn at the engine
    timeout_s: float = 120.0
    timeout_name: str = "wait_timeout_s"  # how failure messages name the time limit

    def agent_service(self) -> ServiceSpec:
        return next(s for s in self.services if s.name == self.agent)


class Booted(Record):
    """What ``bring_up`` made: the network, containers (service -> id), the agent's address."""

    env_id: str
    network: str
    containers: dict[str, str]
    agent_ip: str
    host_ports: dict[int, int] = Field(
        default_factory=dict
    )  # container port -> published host port (egress allow)
    node: str = "local"  # the node it runs on (a cluster's node name)


class Owned(Record):
    """What a node holds for this server: containers and networks by env, volume dirs."""

    containers: dict[str, str] = Field(
        default_factory=dict
    )  # container id -> env id ("" for a seed container)
    networks: dict[str, str] = Field(default_factory=dict)  # network name -> env id
    volume_envs: list[str] = Field(default_factory=list)  # env ids with volume dirs


class LayerOffer(Record):
    """A packed layer a node offers to one other node (``Node.offer_layer``): a TCP port on
    the offering node's address that sends the layer's bytes to the first connection that
    presents ``token``, for a short while. The taker checks ``digest`` over what it read."""

    address: str  # "host:port" on the offering node
    token: str = Field(repr=False)  # hex: random, one offer's, never logged
    digest: str  # "sha256:<hex>" of the packed layer
    size: int  # its bytes


class Metered(Record):
    """An env whose use of its node is asked for: its containers, or (a live env) its server
    process, which runs in cgroups of its own inside its group's container."""

    env_id: str
    containers: list[str] = Field(default_factory=list)
    live: LiveProc | None = None


class Usage(Record):
    """What an env uses now: memory in bytes, CPU time used so far in seconds (None: not
    known, e.g. it no longer runs)."""

    env_id: str
    memory_bytes: int | None = None
    cpu_s: float | None = None


class ImageFacts(Record):
    """What an image is, read once per request: its id, its command, its labels."""

    id: str  # sha256:...: what a version pins
    command: list[str]  # Entrypoint and Cmd, as the engine runs them
    labels: dict[str, str] = Field(default_factory=dict)  # LABEL, e.g. ai.denv.fork


class Node(Protocol):
    """One machine's part in running envs. Every call blocks; callers run them in threads."""

    # images and layers
    def engine_version(self) -> str: ...

    def inspect_image(self, image: str, pull: bool) -> ImageFacts:
        """Everything the lifecycle needs of an image, in one look (one remote call on a
        cluster): ``ImageNotFound`` when it is not there (pulled first with ``pull``)."""
        ...

    def seed_layer(self, image_id: str, path: str) -> str | None:
        """A new layer with what the image has at ``path``; None when it has nothing."""
        ...

    def has_layer(self, layer_id: str) -> bool: ...

    def layer_ids(self) -> set[str]: ...

    def delete_layers(self, layer_ids: list[str]) -> None: ...

    def layer_sizes(self, layer_ids: list[str]) -> list[int]:
        """Bytes of disk each layer holds (0 for one not here); counted by walking its files,
        so the lifecycle asks once per layer and records the answer."""
        ...

    def free_disk_bytes(self) -> int:
        """Bytes free to the server on the disk its layers and volumes live on (a
        cluster: the fullest node's)."""
        ...

    def drop_partial_layers(self) -> None:
        """Remove half-made layers of a server that died mid-snapshot."""
        ...

    # one env
    def bring_up(self, spec: BootSpec) -> Booted:
        """Network, volumes and started containers, dependencies' healthchecks passed first."""
        ...

    def wait_healthy(self, spec: BootSpec, booted: Booted, timeout_s: float) -> None:
        """Until the agent answers 200 on its health path; BootFailed, Cancelled."""
        ...

    def mount_volumes(self, env_id: str, volumes: list[VolumeSlot]) -> None:
        """Mount volumes on the empty mount points of a spare: its containers see them."""
        ...

    def prioritize(self, env_id: str, containers: list[str]) -> None:
        """Full CPU weight for ``containers`` (every container of the env when empty) and
        for the containers its boot creates from now on."""
        ...

    def snapshot(
        self, env_id: str, containers: list[str], volumes: list[VolumeSlot]
    ) -> list[list[str]]:
        """Freeze, turn each volume's changes into a layer, thaw: each volume's new stack."""
        ...

    def changed_bytes(self, env_id: str, volumes: list[VolumeSlot], stop_after: int) -> list[int]:
        """Disk each volume's changes use; counting stops past ``stop_after``."""
        ...

    def diff_layers(
        self, base: list[str], layers: list[str], limit: int
    ) -> tuple[list[tuple[str, str, int]], bool]:
        """Files that differ from one layer stack (newest first) to another, read from the
        layers: (path in the volume, added/modified/deleted, bytes), at most ``limit``, and
        whether more differ."""
        ...

    def cancel(self, env_id: str) -> None:
        """Stop a boot of ``env_id`` in flight or to come (Cancelled)."""
        ...

    def teardown(self, env_id: str, containers: list[str]) -> None:
        """Remove the env's containers, network and volumes (idempotent)."""
        ...

    def stop(self) -> None:
        """The server is stopping: every boot in flight ends with Cancelled."""
        ...

    # what runs
    def states(self, env_id: str | None = None) -> dict[str, str]:
        """Container id -> created / running / paused / exited, of one env or all."""
        ...

    def logs(self, env_id: str, service: str, tail: int) -> list[str]: ...

    def memory_bytes(self, containers: list[str]) -> int: ...

    def logs_after(
        self, env_id: str, service: str, cursor: str | None, tail: int, wait_s: float
    ) -> tuple[list[str], str | None]:
        """A service's log as it is written: with no ``cursor``, its last ``tail`` lines at
        once; else the lines written after ``cursor`` (at most the last ``tail``), waiting up
        to ``wait_s`` seconds for the first. And the cursor after them (the node's own
        string), or None when the service has no log (its container is gone)."""
        ...

    def usage(self, envs: list[Metered]) -> list[Usage]:
        """Each env's memory and CPU time, read from its cgroups: its containers' for an env
        of its own containers, its server's own for a live env. In the order asked."""
        ...

    def exit_reason(self, env_id: str, service: str) -> str | None:
        """Why a service's container ended, when the node knows more than its exit: "out of
        memory (limit 2048 MiB)" after the OOM killer; None otherwise."""
        ...

    # live forks (``live: true`` envs; see denv.server.docker.live)
    def live_root(self, env_id: str, container: str, port: int) -> LiveProc:
        """The server process of a booted live env."""
        ...

    def live_fork(
        self,
        parent_env: str,
        parent: LiveProc,
        volumes: list[VolumeSlot],
        children: list[tuple[str, int]],
        reseed: bool = True,
    ) -> tuple[list[list[str]], list[LiveProc | str], dict[str, float]]:
        """Copy the parent's process into each (env id, port): each volume's new stack,
        each child's process or why it failed, timings (ms). ``reseed``: each child draws
        fresh entropy for Python's ``random`` and NumPy's global generator; else it keeps
        the parent's state of both."""
        ...

    def live_alive(self, proc: LiveProc) -> bool: ...

    def live_modules(self, proc: LiveProc) -> list[str]:
        """The modules a live env's server has imported (LiveError when it cannot say)."""
        ...

    def live_preload(self, proc: LiveProc, modules: list[str]) -> dict[str, Any]:
        """Have a live env's server (a zygote) import these modules: its copies then do not
        import them in their first session. Answers what it did and any thread it now runs
        (``unknown_threads``: it cannot be copied any more)."""
        ...

    def live_exit_reason(self, env_id: str, proc: LiveProc) -> str | None:
        """Which limit of its own a live env whose process ended hit (out of memory, its
        pids), if one did."""
        ...

    def live_teardown(self, env_id: str, proc: LiveProc, last: bool) -> None:
        """End one live env's process and volumes; its group's container too when last."""
        ...

    def live_adopt(self, env_id: str, proc: LiveProc) -> None:
        """After a restart: the live env ``env_id`` still runs in its group's container (a
        cluster counts it on that node again; one machine has nothing to do)."""
        ...

    # placement and loss (a cluster of nodes; one machine has no cap and loses nothing)
    def room(self) -> int | None:
        """How many more envs the node(s) accept now; None: no cap."""
        ...

    def room_beside(self, env_id: str) -> int | None:
        """How many more envs the node running ``env_id`` accepts now (where its live
        children would run; one machine: ``room()``); None: no cap."""
        ...

    def lost(self) -> dict[str, str]:
        """Envs that were on a node found dead since the last call: env id -> reason."""
        ...

    def lost_reason(self, env_id: str) -> str | None:
        """Why the env's node is lost (its envs fail with code ``lost``); None when it is
        not (or the env is unknown). Unlike :meth:`lost`, it hands nothing out."""
        ...

    def layer_nodes(self, layer_ids: list[str]) -> list[str]:
        """The nodes known to hold every one of the layers, least loaded first (a fork's
        spares there need no copy); what the node knows now, without asking around."""
        ...

    def layer_storage(self, layer_ids: list[str]) -> str:
        """Where a version's layers are kept: "node" (only on the node that made them),
        "uploading", "durable" (all in object storage) or "lost" (on no live node and not
        stored)."""
        ...

    # reconcile
    def owned(self) -> Owned: ...

    def remove_owned(self, owned: Owned) -> None: ...

    def recover(
        self,
        env_id: str,
        containers: dict[str, str],
        volumes: list[VolumeSlot],
        states: dict[str, str],
    ) -> str | None:
        """After a restart: thaw what an interrupted snapshot froze; what is lost, if any."""
        ...

    # layer transfer (packed layers with a content digest: see layerpack, objstore)
    def layer_digest(self, layer_id: str) -> str:
        """The digest ("sha256:<hex>") of the layer packed (once, then cached on the node)."""
        ...

    def offer_layer(self, layer_id: str) -> LayerOffer:
        """Offer the packed layer (packed first if need be) to one other node: a port that
        streams it to whoever presents the offer's token first (``copy_layer`` on that
        node), withdrawn unless taken within a minute."""
        ...

    def copy_layer(self, layer_id: str, origin: str) -> int:
        """Copy the layer from node ``origin`` of the same cluster: take its
        ``offer_layer``, stream the bytes into a partial file (hashed on the way), check the
        digest, unpack and publish (a no-op when the node has it); the bytes copied.
        NodeLost naming ``origin`` when that node does not answer or its stream breaks off,
        LayerDigestMismatch when the digest differs; either way no partial layer is left."""
        ...

    def upload_layer(self, layer_id: str, store: StoreConfig) -> str:
        """Store the packed layer in object storage unless stored already; its digest."""
        ...

    def fetch_layer(self, layer_id: str, digest: str, store: StoreConfig) -> None:
        """Download the layer from object storage, check ``digest``, unpack and publish it
        (a no-op when the node has it); StoreError, LayerNotStored, LayerDigestMismatch."""
        ...


class ImageNode(Protocol):
    """What one node of a cluster does with images, beside ``Node`` (a cluster's member:
    ``DockerNode``, ``RemoteNode``). Image ids are the engine's (``sha256:`` of the config),
    so an image is checked by its id wherever it came from. Each move is a stream (a saved
    image goes file to socket or store to file, and is loaded from the file), never the
    whole image in memory."""

    def has_image(self, image_id: str) -> bool: ...

    def offer_image(self, image_id: str) -> LayerOffer:
        """The image saved and offered to one taker (``copy_image`` on another node)."""
        ...

    def copy_image(self, image_id: str, origin: str) -> int:
        """Take node ``origin``'s offer of the image and load it: the bytes copied (0 when
        it is here). NodeLost naming ``origin`` when its stream fails."""
        ...

    def upload_image(self, image_id: str, store: StoreConfig) -> str:
        """The image saved into object storage (once); the saved tar's digest."""
        ...

    def fetch_image(self, image_id: str, digest: str, store: StoreConfig) -> None:
        """The image from object storage, its saved tar checked against ``digest``, loaded."""
        ...

    def pull_image(self, ref: str, image_id: str) -> None:
        """``ref`` pulled from its registry; ValueError when it is no longer ``image_id``."""
        ...

    def collect_images(
        self, budget_mb: int | None = None, recent_s: float | None = None
    ) -> list[str]:
        """Remove the images this node brought that no container uses, least recently used
        first, until they fit ``budget_mb`` (default: the node's); the ids removed."""
        ...
