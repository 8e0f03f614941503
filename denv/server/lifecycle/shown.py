"""What the lifecycle's verbs answer: records as the API shows them, not yet JSON.

A verb returns one of these; the API's edge (``denv.server.api.render``) turns it into the
contract's shape. What only the lifecycle knows travels with the record: an env's version and
its containers' states as the node saw them, a version's storage, a lease's count of envs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from denv.server.records import EnvRecord, LeaseRecord, VersionRecord

T = TypeVar("T")


@dataclass(frozen=True)
class EnvShown:
    """An env (its record as observed), its version (None once that is gone) and the states
    of its containers by id ({}: the node was not asked, or could not answer)."""

    rec: EnvRecord
    version: VersionRecord | None
    states: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class VersionShown:
    """A version and where its layers are stored (the node's word; None: unknown)."""

    rec: VersionRecord
    storage: str | None = None


@dataclass(frozen=True)
class Made:
    """The envs a create or a fork made; ``version``: a fork's (its children's parent);
    ``one``: a create that asked for one env, answered by it alone (not a batch)."""

    envs: list[EnvShown]
    version: VersionShown | None = None
    one: bool = False


@dataclass(frozen=True)
class Page(Generic[T]):
    """A page of a list, and the cursor of the next (None at the end)."""

    items: list[T]
    next_cursor: str | None


@dataclass(frozen=True)
class LeaseShown:
    lease: LeaseRecord
    envs: int  # the envs it holds now


@dataclass(frozen=True)
class PoolShown:
    """The warm pool an env asked for (``state`` none when it has none)."""

    env_id: str
    state: str
    target: int = 0
    ready: int = 0
    booting: int = 0
    failures: int = 0
    error: str | None = None


@dataclass(frozen=True)
class Logs:
    env_id: str
    service: str
    lines: list[str]


@dataclass(frozen=True)
class Change:
    """A file that differs between two versions: ``change`` added, modified or deleted."""

    path: str
    change: str
    size: int
    service: str


@dataclass(frozen=True)
class VersionDiff:
    base_version_id: str
    version_id: str
    changes: list[Change]
    truncated: bool


@dataclass(frozen=True)
class Project:
    name: str
    latest_version_id: str
    version_count: int
    created_at: str
