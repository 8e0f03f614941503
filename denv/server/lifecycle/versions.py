"""Versions: the implicit one of a sandbox, deployed compose projects, snapshots, deletion.

A version's volume is a ``records.Volume`` (service, path, layers); layers are immutable dirs on
the node, newest first.
A fresh volume is seeded with what the image has at its path (cached per image and path), so a
database image's initial files are there, and children copy-on-write over them.
"""

from __future__ import annotations

import logging

from denv.server import ids
from denv.server.db import Store, iso, now
from denv.server.errors import ApiError, not_found
from denv.server.lifecycle.compose import ComposeSpec, parse_compose
from denv.server.lifecycle.context import Context
from denv.server.lifecycle.image_allowlist import check_allowed
from denv.server.lifecycle.limits import service_limits
from denv.server.lifecycle.requests import SandboxCreate
from denv.server.lifecycle.shown import Change, VersionDiff
from denv.server.node.errors import Refused
from denv.server.node.seam import ImageFacts
from denv.server.records import (
    UP,
    EnvRecord,
    EnvStatus,
    ServiceSpec,
    VersionOrigin,
    VersionRecord,
    Volume,
    volume_slots,
)

log = logging.getLogger(__name__)

SANDBOX_SERVICE = "agent"
DIFF_LIMIT = 10_000  # files a diff lists (VersionDiff.changes)
FORK_LABEL = "ai.denv.fork"  # an image's declaration: "warm" when it reads volumes per session


class Versions:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def _seed(self, image_id: str, path: str) -> list[str]:
        """The layer holding the image's files at ``path`` ([] when it has none)."""
        key = f"seed:{image_id}:{path}"
        store, node = self.ctx.store, self.ctx.node
        layer = store.get_meta(key)
        if layer is not None:
            if not layer:
                return []
            if node.has_layer(layer):
                return [layer]
        made = node.seed_layer(image_id, path)
        store.set_meta(key, made or "")
        return [made] if made else []

    def _volumes(self, service: str, image_id: str, paths: list[str]) -> list[Volume]:
        return [Volume(service=service, path=p, layers=self._seed(image_id, p)) for p in paths]

    def implicit(self, owner: str, body: SandboxCreate) -> tuple[VersionRecord, ImageFacts]:
        """The one-service version behind ``POST /v1/sandboxes``, not yet recorded: the
        request is admitted on it first (``add`` records it)."""
        facts = self.ctx.node.inspect_image(body.image, body.pull)
        image_id = facts.id
        paths = ["/work", *[p.rstrip("/") or "/" for p in body.volumes]]
        paths = list(dict.fromkeys(paths))
        svc = ServiceSpec(
            name=SANDBOX_SERVICE,
            image=body.image,
            image_digest=image_id,
            command=body.command,
            env=dict(body.env),
            ports=list(body.ports),
            volumes=paths,
            health_path=body.health_path or "/health",
        )
        vols = self._volumes(SANDBOX_SERVICE, image_id, paths)
        warm_fork = body.warm_fork or _warm_image(facts)
        made = self._new(owner, None, None, SANDBOX_SERVICE, [svc], vols, warm_fork, {})
        made.origin = "sandbox"
        return made, facts

    def add(self, rec: VersionRecord, parent: VersionRecord | None = None) -> VersionRecord:
        """Record a version (one made by ``implicit`` once its request is admitted), with the
        size of each layer it names that has none yet, and its own size: the bytes of its
        layers that ``parent``'s do not name (all of them for a root)."""
        store = self.ctx.store
        names = set(version_layers(rec))
        sizes = store.sizes.get(names)
        missing = sorted(names - sizes.keys())
        if missing:  # each layer is walked once, here, when its first version is recorded
            made = dict(zip(missing, self.ctx.node.layer_sizes(missing), strict=True))
            store.sizes.record(made)
            sizes.update(made)
        inherited = set(version_layers(parent)) if parent is not None else set()
        rec.size_bytes = sum(sizes[x] for x in names - inherited)
        store.insert_version(rec)
        return rec

    def deploy(
        self, owner: str, project: str, compose: str, labels: dict[str, str]
    ) -> VersionRecord:
        spec: ComposeSpec = parse_compose(compose)
        services: list[ServiceSpec] = []
        vols: list[Volume] = []
        warm_images: list[bool] = []
        for s in spec.services:
            check_allowed(s.image, self.ctx.config.allow_images, f"services.{s.name}.image")
        for s in spec.services:
            try:
                facts = self.ctx.node.inspect_image(s.image, False)
            except Refused as exc:  # not on the engine, or no engine answers
                exc.message = f"services.{s.name}.image: {exc.message}"
                exc.details = {"path": f"services.{s.name}.image", "image": s.image}
                raise
            image_id = facts.id
            warm_images.append(_warm_image(facts))
            agent = s.name == spec.agent_service
            paths = list(
                dict.fromkeys(([] if "/work" in s.volumes or not agent else ["/work"]) + s.volumes)
            )
            services.append(
                ServiceSpec(
                    name=s.name,
                    image=s.image,
                    image_digest=image_id,
                    command=s.command,
                    env=s.env,
                    ports=s.ports,
                    volumes=paths,
                    depends_on=s.depends_on,
                    health_path=spec.health_path if agent else None,
                    healthcheck=s.healthcheck,
                    wait_healthy=s.wait_healthy or [],
                    limits=service_limits(s, self.ctx.config.limits),
                )
            )
            vols += self._volumes(s.name, image_id, paths)
        # undeclared: warm when every image declares it
        warm_fork = spec.fork == "warm" if spec.fork is not None else all(warm_images)
        made = self._new(
            owner, project, None, spec.agent_service, services, vols, warm_fork, labels,
            tools=spec.tools,
        )  # fmt: skip
        made.origin = "deploy"
        return self.add(made)

    def _new(
        self,
        owner: str,
        project: str | None,
        parent_env_id: str | None,
        agent: str,
        services: list[ServiceSpec],
        volumes: list[Volume],
        warm_fork: bool,
        labels: dict[str, str],
        parent_version_id: str | None = None,
        tools: list[str] | None = None,
    ) -> VersionRecord:
        rec = VersionRecord(
            id=ids.new_id("ver"),
            owner=owner,
            project=project,
            parent_env_id=parent_env_id,
            parent_version_id=parent_version_id,
            agent_service=agent,
            services=services,
            volumes=volumes,
            warm_fork=warm_fork,
            labels=dict(labels),
            created_at=iso(now()),
            tools=tools,
        )
        return rec

    def snapshot(
        self, env: EnvRecord, labels: dict[str, str], origin: VersionOrigin
    ) -> VersionRecord:
        """Pause the env, turn each volume's upper dir into a layer, resume; a new version
        (``origin`` "snapshot" is kept, "fork" expires once its children are gone)."""
        ctx = self.ctx
        parent = ctx.store.get_version(env.version_id)
        if parent is None:
            raise ApiError(409, "conflict", f"the version of env {env.id} is gone")
        with ctx.env_lock(env.id):
            current = ctx.store.get_env(env.id)
            if current is None or current.status not in UP:
                status = current.status if current else EnvStatus.DELETED
                raise ApiError(
                    409,
                    "env_not_running",
                    f"env {env.id} is {status}: only a running env can be "
                    "snapshotted (create a new env from its version instead)",
                )
            containers = list(current.runtime.containers.values())
            stacks = ctx.node.snapshot(env.id, containers, volume_slots(parent.volumes))
        return self.child(env, parent, stacks, labels, origin)

    def child(
        self,
        env: EnvRecord,
        parent: VersionRecord,
        stacks: list[list[str]],
        labels: dict[str, str],
        origin: VersionOrigin,
    ) -> VersionRecord:
        """Record the version a snapshot or a fork of ``env`` made: its parent version with
        each volume's layers as ``stacks`` (newest first); the one way both kinds of fork
        record what the children start from."""
        volumes = [
            vol.model_copy(update={"layers": layers})
            for vol, layers in zip(parent.volumes, stacks, strict=True)
        ]
        made = self._new(
            env.owner,
            parent.project,
            env.id,
            parent.agent_service,
            parent.services,
            volumes,
            parent.warm_fork,
            labels,
            parent.id,
            parent.tools,
        )
        made.origin = origin
        return self.add(made, parent)

    def get_owned(self, owner: str, version_id: str) -> VersionRecord:
        rec = self.ctx.store.get_version(version_id) if ids.is_id(version_id, "ver") else None
        if rec is None or rec.owner != owner:
            raise not_found("version", version_id)
        return rec

    def delete(self, owner: str, version_id: str) -> None:
        """Delete a version and the layers no other version uses; 409 while envs use it."""
        rec = self.get_owned(owner, version_id)
        if self.ctx.store.version_in_use(rec.id):
            raise ApiError(
                409,
                "version_in_use",
                f"version {rec.id} is used by envs that are not deleted: "
                "delete them first (GET /v1/envs?version_id=...)",
            )
        self.ctx.store.mark_version_deleted(rec.id)
        self.collect_layers({x for v in rec.volumes for x in v.layers})

    def diff(self, base: VersionRecord, version: VersionRecord) -> VersionDiff:
        """The contract's VersionDiff: every volume of either version, matched by service
        and path (a volume only one has counts as empty in the other)."""

        def stacks(rec: VersionRecord) -> dict[tuple[str, str], list[str]]:
            return {(v.service, v.path): v.layers for v in rec.volumes}

        before, after = stacks(base), stacks(version)
        changes: list[Change] = []
        truncated = False
        for service, path in sorted(before.keys() | after.keys()):
            left = DIFF_LIMIT - len(changes)
            found, more = self.ctx.node.diff_layers(
                before.get((service, path), []), after.get((service, path), []), left
            )
            root = path.rstrip("/")
            changes += [
                Change(f"{root}/{rel}", change, size, service) for rel, change, size in found
            ]
            if more or len(changes) >= DIFF_LIMIT:
                truncated = more or len(changes) > DIFF_LIMIT
                break
        return VersionDiff(base.id, version.id, changes[:DIFF_LIMIT], truncated)

    def collect_layers(self, candidates: set[str], keep_seeds: bool = False) -> tuple[int, int]:
        """Delete those of ``candidates`` no version names (nor, with ``keep_seeds``, an
        image's seed, which a sandbox being created may be about to name); (layers, bytes)
        deleted, from their recorded sizes."""
        store = self.ctx.store
        keep = referenced_layers(store) | (store.seed_layers() if keep_seeds else set())
        gone = sorted(candidates - keep)
        if not gone:
            return 0, 0
        sizes = store.sizes.get(gone)
        self.ctx.node.delete_layers(gone)
        store.sizes.forget(gone)
        return len(gone), sum(sizes.values())


def referenced_layers(store: Store) -> set[str]:
    """Every layer some version (deleted ones excepted) still names."""
    return {x for v in store.all_versions() for vol in v.volumes for x in vol.layers}


def _warm_image(facts: ImageFacts) -> bool:
    """The image declares that it reads its volumes per session (``ai.denv.fork=warm``)."""
    return facts.labels.get(FORK_LABEL) == "warm"


def version_layers(rec: VersionRecord) -> list[str]:
    """Every layer of a version's volumes, once each."""
    return list(dict.fromkeys(x for v in rec.volumes for x in v.layers))
