"""The records of a version: ``Version`` and its ``VersionService``s, a ``Fork``, a
``VersionDiff`` of ``FileChange``s.

What snapshots, forks and diffs return, converted from the generated models field for
field. ``denv.types`` re-exports them; import them from there.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from typing import TYPE_CHECKING

from ._types_enums import FileChangeKind
from ._types_env import Env
from ._types_record import Record, plain_dict

if TYPE_CHECKING:
    from denv_api_client import models as api


@dataclasses.dataclass(frozen=True)
class VersionService(Record):
    """One service of a version, pinned by image digest."""

    name: str
    image: str
    image_digest: str
    command: list[str] | None
    env: dict[str, str]
    ports: list[int]
    volumes: list[str]
    depends_on: list[str]
    health_path: str | None

    @classmethod
    def from_api(cls, m: api.VersionService) -> VersionService:
        return cls(
            name=m.name,
            image=m.image,
            image_digest=m.image_digest,
            command=None if m.command is None else list(m.command),
            env=plain_dict(m.env),
            ports=list(m.ports),
            volumes=list(m.volumes),
            depends_on=list(m.depends_on),
            health_path=m.health_path,
        )


@dataclasses.dataclass(frozen=True)
class Version(Record):
    """An immutable snapshot: images pinned by digest plus one layer per volume."""

    id: str
    project: str | None
    parent_env_id: str | None
    parent_version_id: str | None  # the version its parent env ran; None for a root
    agent_service: str
    services: list[VersionService]
    layer_depth: int
    warm_fork: bool
    labels: dict[str, str]
    created_at: datetime.datetime
    #: The MCP tools it declares (the compose file's x-denv.tools); None when none were.
    tools: list[str] | None = None
    #: Where its /work layers are kept: "node" (only where they were made), "uploading",
    #: "durable" (in object storage: it forks on any node) or "lost"; None from older servers.
    storage: str | None = None
    #: Bytes of disk its layers add to its parent version's (all of them for a root).
    size_bytes: int = 0
    #: Made by a sandbox or a fork: deleted once no env and no child version needs it.
    implicit: bool = False

    @classmethod
    def from_api(cls, m: api.Version) -> Version:
        return cls(
            id=m.id,
            project=m.project,
            parent_env_id=m.parent_env_id,
            parent_version_id=m.parent_version_id,
            agent_service=m.agent_service,
            services=[VersionService.from_api(s) for s in m.services],
            layer_depth=m.layer_depth,
            warm_fork=m.warm_fork,
            labels=plain_dict(m.labels),
            created_at=m.created_at,
            tools=list(m.tools) if isinstance(m.tools, list) else None,
            storage=m.storage.value if isinstance(m.storage, enum.Enum) else None,
            size_bytes=m.size_bytes if isinstance(m.size_bytes, int) else 0,
            implicit=m.implicit if isinstance(m.implicit, bool) else False,
        )


@dataclasses.dataclass(frozen=True)
class Collected(Record):
    """What `Denv.gc` freed: expired versions deleted, their layers, and bytes of disk."""

    versions_deleted: int
    layers_deleted: int
    bytes_freed: int

    @classmethod
    def from_api(cls, m: api.GcResult) -> Collected:
        return cls(
            versions_deleted=m.versions_deleted,
            layers_deleted=m.layers_deleted,
            bytes_freed=m.bytes_freed,
        )


@dataclasses.dataclass(frozen=True)
class FileChange(Record):
    """One file that differs: its path in the container, how, its size in bytes (in the
    newer version; in the base when deleted) and the service whose volume holds it."""

    path: str
    change: FileChangeKind
    size: int
    service: str

    @classmethod
    def from_api(cls, m: api.FileChange) -> FileChange:
        return cls(
            path=m.path, change=FileChangeKind(m.change.value), size=m.size, service=m.service
        )


@dataclasses.dataclass(frozen=True)
class VersionDiff(Record):
    """What changed in the volumes from `base_version_id` to `version_id` (`Denv.diff`).

    `truncated`: more files differ than `changes` holds (at most 10000).
    """

    base_version_id: str
    version_id: str
    changes: list[FileChange]
    truncated: bool

    @classmethod
    def from_api(cls, m: api.VersionDiff) -> VersionDiff:
        return cls(
            base_version_id=m.base_version_id,
            version_id=m.version_id,
            changes=[FileChange.from_api(c) for c in m.changes],
            truncated=m.truncated,
        )


@dataclasses.dataclass(frozen=True)
class Fork(Record):
    """One snapshot of an env (`version`) and the children started from it (`envs`)."""

    version: Version
    envs: list[Env]

    @classmethod
    def from_api(cls, m: api.Fork) -> Fork:
        return cls(version=Version.from_api(m.version), envs=[Env.from_api(e) for e in m.envs])
