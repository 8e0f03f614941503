"""`lineage`: the chain from an env or a version to its root, defined once for both clients.

A chain takes several calls, each depending on the answer before it, so it is written as a
plan: a generator that yields each call and is sent its value (or thrown its error).
`Denv` runs a plan with its blocking calls, `AsyncDenv` awaits each one; neither repeats the
walk.
"""

from __future__ import annotations

from . import _operations as ops
from .errors import NotFound
from .types import Env, Version

#: The longest chain followed; a longer one means a loop in the records, not a lineage.
MAX_DEPTH = 10_000


def lineage(id: str) -> ops.Plan[list[Env | Version]]:
    """The chain from an env or a version to its root, nearest first.

    Env → its version → the env that version was snapshotted from → its version → … →
    the root version (a sandbox's implicit one, or a deployed one). A version deleted
    since ends the chain early.

    >>> [x.id for x in denv.lineage(child.id)]
    ['env_...child', 'ver_...fork', 'env_...root', 'ver_...implicit']
    """
    # The root is a version without a parent env; a version deleted since ends the chain
    # early because what it came from is no longer known.
    if not isinstance(id, str) or not id.startswith(("env_", "ver_")):
        raise ValueError(
            f"lineage() needs an env id (env_...) or a version id (ver_...), not {id!r}"
        )
    chain: list[Env | Version] = []
    version_id: str | None = id
    if id.startswith("env_"):
        env: Env = yield ops.get_env(id)
        chain.append(env)
        version_id = env.version_id
    while version_id is not None and len(chain) < MAX_DEPTH:
        try:
            version: Version = yield ops.get_version(version_id)
        except NotFound:
            if not chain:  # the id asked for itself is unknown: say so
                raise
            break
        chain.append(version)
        if version.parent_env_id is None:
            break
        parent: Env = yield ops.get_env(version.parent_env_id)
        chain.append(parent)
        version_id = parent.version_id
    return chain
