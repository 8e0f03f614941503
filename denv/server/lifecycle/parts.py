"""What every verb of the lifecycle works with (``Parts``), and how it answers (``Views``):
records as the API shows them (``shown``), waits for envs, ownership (another key's env is 404)."""

from __future__ import annotations

from dataclasses import dataclass

from denv.server import ids
from denv.server.errors import not_found
from denv.server.lifecycle.admission import Admission
from denv.server.lifecycle.context import Context
from denv.server.lifecycle.envs import Envs
from denv.server.lifecycle.leases import Leases
from denv.server.lifecycle.live.forks import LiveForks
from denv.server.lifecycle.live.zygotes import Zygotes
from denv.server.lifecycle.requests import WaitFor
from denv.server.lifecycle.shown import EnvShown, VersionShown
from denv.server.lifecycle.versions import Versions, version_layers
from denv.server.node.errors import Unavailable
from denv.server.records import ALL, FINAL, READY, UP, EnvRecord, EnvStatus, VersionRecord

WAIT_MARGIN_S = 30.0
WAIT_UNTIL: dict[str, frozenset[EnvStatus]] = {  # what a wait for each condition returns at
    "none": ALL,
    "running": UP | FINAL,
    "healthy": READY | FINAL,
    "deleted": frozenset({EnvStatus.DELETED}),
}


class Views:
    """Records as the API shows them (``shown``), with the node's view of their containers."""

    def __init__(self, ctx: Context, envs: Envs) -> None:
        self.ctx = ctx
        self.envs = envs

    def owned_env(self, owner: str, env_id: str) -> EnvRecord:
        rec = self.ctx.store.get_env(env_id) if ids.is_id(env_id, "env") else None
        if rec is None or rec.owner != owner:
            raise not_found("env", env_id)
        return rec

    def states(self, env_id: str | None = None) -> dict[str, str] | None:
        try:
            return self.ctx.node.states(env_id)
        except Unavailable:
            return None  # engine down: report services as missing, do not fail envs

    def env_states(self, rec: EnvRecord) -> dict[str, str] | None:
        """The states of the containers of ``rec`` (a live child: its group's container)."""
        return self.states(rec.runtime.live.group if rec.runtime.live else rec.id)

    def env(self, rec: EnvRecord, states: dict[str, str] | None) -> EnvShown:
        """``rec`` as the API shows it: observed against its containers' ``states`` (None:
        the node could not say), with its version."""
        if states is not None:
            rec = self.envs.observe(rec, states)
        version = self.ctx.store.get_version(rec.version_id, include_deleted=True)
        return EnvShown(rec, version, states or {})

    def version(self, rec: VersionRecord) -> VersionShown:
        return VersionShown(rec, self.ctx.node.layer_storage(version_layers(rec)))

    def copies(self, recs: list[EnvRecord]) -> list[EnvShown]:
        """Live copies just made: they run in their parent's container, which ran them a
        moment ago (no round trip to the engine to say so)."""
        states = {cid: "running" for r in recs for cid in r.runtime.containers.values()}
        return [self.env(r, states) for r in recs]

    def wait_all(self, recs: list[EnvRecord], wait: WaitFor, timeout_s: float) -> list[EnvShown]:
        until = WAIT_UNTIL[wait]
        done = [self.envs.wait(r.id, until, timeout_s + WAIT_MARGIN_S) for r in recs]
        states = self.states()
        return [self.env(r, states) for r in done]


@dataclass(frozen=True)
class Parts:
    """The lifecycle's parts, made once per server (``Service``) and shared by its verbs."""

    ctx: Context
    envs: Envs
    versions: Versions
    live: LiveForks
    leases: Leases
    zygotes: Zygotes
    views: Views

    @property
    def admit(self) -> Admission:
        return self.envs.admit


class Verb:
    """A verb's access to the parts (``self.envs``, ``self.admit``...)."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        self.ctx, self.envs, self.versions = parts.ctx, parts.envs, parts.versions
        self.live, self.leases, self.zygotes = parts.live, parts.leases, parts.zygotes
        self.views, self.admit = parts.views, parts.admit
