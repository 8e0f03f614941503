"""Which images a server runs: the operator's allowlist (``denv serve --allow-image``).

Any key may name any image on the Docker Engine unless the operator lists what is allowed.
A pattern is a glob matched against the reference as the request gives it and against its
full form (registry, ``library/`` for Docker Hub's official images, the tag, ``latest`` when
none is given); a pattern without a tag or digest allows every tag. ``*`` and ``?`` never
match a ``/`` (``denv-*`` does not allow ``denv-evil.example/x``); ``**`` matches anything,
``/`` included::

    allowed("denv-echo-env:latest", ["denv-*"])             # True
    allowed("python:3.12", ["docker.io/library/python"])    # True: every tag
    allowed("ghcr.io/x/y:1", ["ghcr.io/acme/*"])            # False

An image id (``sha256:...``) is matched as it is: it has no name an operator could list.
"""

from __future__ import annotations

import re
from functools import lru_cache

from denv.server.errors import ApiError

DEFAULT_REGISTRY = "docker.io"


def _split(ref: str) -> tuple[str, str]:
    """(name, ":tag" or "@digest" or "") of a reference."""
    if "@" in ref:
        name, _, digest = ref.partition("@")
        return name, "@" + digest
    slash = ref.rfind("/")
    colon = ref.rfind(":")
    if colon > slash:
        return ref[:colon], ref[colon:]
    return ref, ""


def full_name(name: str) -> str:
    """``python`` -> ``docker.io/library/python``; a name with a registry is kept."""
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return name
    if not rest:
        return f"{DEFAULT_REGISTRY}/library/{name}"
    return f"{DEFAULT_REGISTRY}/{name}"


def forms(ref: str) -> list[str]:
    """The spellings of ``ref`` a pattern may match: as given and in full, with and without
    its tag or digest."""
    if ref.startswith("sha256:"):
        return [ref]
    name, suffix = _split(ref)
    full = full_name(name)
    tagged = suffix or ":latest"
    return list(dict.fromkeys([ref, name, name + tagged, full, full + tagged]))


def allowed(ref: str, patterns: tuple[str, ...] | list[str]) -> bool:
    """Whether ``ref`` matches a pattern (every image when there are none)."""
    if not patterns:
        return True
    return any(_regex(pat).fullmatch(form) for form in forms(ref) for pat in patterns)


@lru_cache(maxsize=256)
def _regex(pattern: str) -> re.Pattern[str]:
    parts = re.split(r"(\*\*|\*|\?)", pattern)
    glob = {"**": ".*", "*": "[^/]*", "?": "[^/]"}
    return re.compile("".join(glob.get(p, re.escape(p)) for p in parts))


def check_allowed(ref: str, patterns: tuple[str, ...], path: str) -> None:
    """422 ``invalid_request`` naming the option when ``ref`` is not allowed."""
    if allowed(ref, patterns):
        return
    raise ApiError(
        422,
        "invalid_request",
        f"{path}: image '{ref}' is not allowed on this server: it runs only images matching "
        f"{', '.join(repr(p) for p in patterns)} (the operator's denv serve --allow-image); "
        "use one of those, or ask the operator to allow it",
        {"path": path, "image": ref, "allowed": list(patterns)},
    )
