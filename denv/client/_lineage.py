"""`lineage`: the chain from an env or a version to its root, defined once for both clients.

A chain takes several calls, each depending on the answer before it, so it is written as a
plan: a generator that yields each call and is sent its value (or thrown its error).
`Denv` runs a plan with its blocking calls, `AsyncDenv` awaits each one; neither repeats the
walk.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from . import _operations as ops
from .errors import NotFound
from .types import Env, Version

#: A plan: yields calls, is sent their values, returns its result.
Plan = Generator[ops.Call[Any], Any, list[Env | Version]]

#: The longest chain followed; a longer one means a loop in the records, not a lineage.
MAX_DEPTH = 10_000


def lineage(id_: str) -> Plan:
    """Env → its version → the env that version was snapshotted from → … → the root version.

    The root is a version without a parent env (a sandbox's implicit version, or a deployed
    one). A version deleted since ends the chain early: what it came from is no longer known.
    """
    if not isinstance(id_, str) or not id_.startswith(("env_", "ver_")):
        raise ValueError(
            f"lineage() needs an env id (env_...) or a version id (ver_...), not {id_!r}"
        )
    chain: list[Env | Version] = []
    version_id: str | None = id_
    if id_.startswith("env_"):
        env: Env = yield ops.get_env(id_)
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
