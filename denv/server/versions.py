"""Versions: the implicit one of a sandbox, deployed compose projects, snapshots, deletion.

A version's volume is ``{"service", "path", "layers"}``; layers are immutable dirs, newest first.
A fresh volume is seeded with what the image has at its path (cached per image and path), so a
database image's initial files are there, and children copy-on-write over them.
"""

from __future__ import annotations

import logging
import shutil
from typing import Any

from . import ids
from .compose import ComposeSpec, parse_compose
from .context import Context
from .envs import volume_slots
from .errors import ApiError, not_found
from .store import EnvRecord, VersionRecord, iso, now

log = logging.getLogger(__name__)

SANDBOX_SERVICE = "agent"
SNAPSHOT_STATES = ("starting", "running", "healthy")
FORK_LABEL = "ai.denv.fork"  # an image's declaration: "warm" when it reads volumes per session


class Versions:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def _seed(self, image_id: str, path: str) -> list[str]:
        """The layer holding the image's files at ``path`` ([] when it has none)."""
        key = f"seed:{image_id}:{path}"
        store = self.ctx.store
        layer = store.get_meta(key)
        if layer is not None:
            if not layer:
                return []
            if self.ctx.volumes.layer_path(layer).is_dir():
                return [layer]
        layer_id, tmp = self.ctx.volumes.new_layer_dir()
        try:
            has = self.ctx.engine.export_path(image_id, path, tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if has:
            self.ctx.volumes.publish(layer_id, tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        store.set_meta(key, layer_id if has else "")
        return [layer_id] if has else []

    def _service(
        self,
        name: str,
        image: str,
        image_id: str,
        *,
        command: list[str] | None,
        env: dict[str, str],
        ports: list[int],
        volumes: list[str],
        depends_on: list[str],
        health_path: str | None,
        healthcheck: list[str] | None = None,
        wait_healthy: list[str] | None = None,
    ) -> dict[str, Any]:
        return {
            "name": name,
            "image": image,
            "image_digest": image_id,
            "command": command,
            "env": env,
            "ports": ports,
            "volumes": volumes,
            "depends_on": depends_on,
            "health_path": health_path,
            "healthcheck": healthcheck,
            "wait_healthy": wait_healthy or [],
        }

    def implicit(self, owner: str, body: dict[str, Any]) -> VersionRecord:
        """The one-service version behind ``POST /v1/sandboxes``."""
        image = body["image"]
        image_id = self.ctx.engine.resolve_image(image, bool(body.get("pull")))
        paths = ["/work", *[p.rstrip("/") or "/" for p in body.get("volumes") or []]]
        paths = list(dict.fromkeys(paths))
        svc = self._service(
            SANDBOX_SERVICE,
            image,
            image_id,
            command=body.get("command"),
            env=dict(body.get("env") or {}),
            ports=list(body.get("ports") or [8000]),
            volumes=paths,
            depends_on=[],
            health_path=body.get("health_path") or "/health",
        )
        vols = [
            {"service": SANDBOX_SERVICE, "path": p, "layers": self._seed(image_id, p)}
            for p in paths
        ]
        warm_fork = bool(body.get("warm_fork")) or self._warm_image(image_id)
        return self._record(owner, None, None, SANDBOX_SERVICE, [svc], vols, warm_fork, {})

    def _warm_image(self, image_id: str) -> bool:
        return self.ctx.engine.image_labels(image_id).get(FORK_LABEL) == "warm"

    def deploy(
        self, owner: str, project: str, compose: str, labels: dict[str, str]
    ) -> VersionRecord:
        spec: ComposeSpec = parse_compose(compose)
        services, vols = [], []
        for s in spec.services:
            try:
                image_id = self.ctx.engine.resolve_image(s.image, False)
            except ApiError as exc:
                exc.message = f"services.{s.name}.image: {exc.message}"
                exc.details = {"path": f"services.{s.name}.image", "image": s.image}
                raise
            agent = s.name == spec.agent_service
            paths = list(
                dict.fromkeys(([] if "/work" in s.volumes or not agent else ["/work"]) + s.volumes)
            )
            services.append(
                self._service(
                    s.name,
                    s.image,
                    image_id,
                    command=s.command,
                    env=s.env,
                    ports=s.ports,
                    volumes=paths,
                    depends_on=s.depends_on,
                    health_path=spec.health_path if agent else None,
                    healthcheck=s.healthcheck,
                    wait_healthy=s.wait_healthy,
                )
            )
            vols += [
                {"service": s.name, "path": p, "layers": self._seed(image_id, p)} for p in paths
            ]
        if spec.fork is not None:
            warm_fork = spec.fork == "warm"
        else:  # undeclared: warm when every image declares it
            warm_fork = all(self._warm_image(s["image_digest"]) for s in services)
        return self._record(
            owner, project, None, spec.agent_service, services, vols, warm_fork, labels
        )

    def _record(
        self,
        owner: str,
        project: str | None,
        parent_env_id: str | None,
        agent: str,
        services: list[dict[str, Any]],
        volumes: list[dict[str, Any]],
        warm_fork: bool,
        labels: dict[str, str],
    ) -> VersionRecord:
        rec = VersionRecord(
            id=ids.new_id("ver"),
            owner=owner,
            project=project,
            parent_env_id=parent_env_id,
            agent_service=agent,
            services=services,
            volumes=volumes,
            warm_fork=warm_fork,
            labels=dict(labels),
            created_at=iso(now()),
        )
        self.ctx.store.insert_version(rec)
        return rec

    def snapshot(self, env: EnvRecord, labels: dict[str, str]) -> VersionRecord:
        """Pause the env, turn each volume's upper dir into a layer, resume; a new version."""
        ctx = self.ctx
        parent = ctx.store.get_version(env.version_id)
        if parent is None:
            raise ApiError(409, "conflict", f"the version of env {env.id} is gone")
        new_layers: list[str | None] = []
        with ctx.env_lock(env.id):
            current = ctx.store.get_env(env.id)
            if current is None or current.status not in SNAPSHOT_STATES:
                status = current.status if current else "deleted"
                raise ApiError(
                    409,
                    "env_not_running",
                    f"env {env.id} is {status}: only a running env can be "
                    "snapshotted (create a new env from its version instead)",
                )
            cids = list((current.runtime.get("containers") or {}).values())
            frozen: list[tuple[str, str]] = []
            try:
                for cid in cids:  # no inspect first: freezing what does not run is a no-op
                    if how := ctx.engine.freeze(cid):
                        frozen.append((cid, how))
                for vol, n in volume_slots(parent):
                    upper = ctx.volumes.upper(env.id, vol["service"], n)
                    new_layers.append(ctx.volumes.capture(upper))
            finally:
                for cid, how in frozen:
                    ctx.engine.thaw(cid, how)
        volumes = [
            {**vol, "layers": ctx.volumes.stack(layer, vol["layers"])}
            for (vol, _), layer in zip(volume_slots(parent), new_layers, strict=True)
        ]
        return self._record(
            env.owner,
            parent.project,
            env.id,
            parent.agent_service,
            parent.services,
            volumes,
            parent.warm_fork,
            labels,
        )

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
        self.collect_layers({x for v in rec.volumes for x in v["layers"]})

    def collect_layers(self, candidates: set[str]) -> None:
        used = {
            x for v in self.ctx.store.all_versions() for vol in v.volumes for x in vol["layers"]
        }
        self.ctx.volumes.delete_layers(candidates - used)
