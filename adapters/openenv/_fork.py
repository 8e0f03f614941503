"""fork(n): one snapshot of a live env, n children started in parallel, each ready.

The server snapshots the parent's volumes once and starts every child from
that version; the client then waits for all children at once (health and a
WebSocket on each), so fork(n) takes about as long as the slowest child.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._provider import DenvProvider

logger = logging.getLogger(__name__)

#: The contract's limit on children per fork request (EnvsCreate.count).
MAX_FORK_COUNT = 32


def fork_children(parent: DenvProvider, count: int) -> list[DenvProvider]:
    """`count` ready providers bound to children of `parent`'s env; nothing left on failure."""
    if not 1 <= count <= MAX_FORK_COUNT:
        raise ValueError(f"fork count must be between 1 and {MAX_FORK_COUNT}, not {count!r}")
    env_id = parent.env_id
    if env_id is None:
        raise RuntimeError(
            "fork() needs a running env: start one first (start_container(), or a client made "
            "with from_docker_image(image, provider=DenvProvider()))"
        )
    connection = parent._conn()
    result = connection.denv.fork(
        env_id,
        count=count,
        labels=parent._merged_labels(None),
        ttl_s=parent._ttl_s,
        # The server starts the children in parallel and answers once each is healthy or
        # failed (at once for warm children); the client then only probes its own path.
        wait="healthy",
        wait_timeout_s=parent._timeout_s,
        warm=parent._warm,
    )
    logger.info("forked env %s into %d (version %s)", env_id, count, result.version.id)
    children: list[DenvProvider] = []
    try:
        for env in result.envs:
            children.append(parent._child(env, connection))
        _wait_all(children, parent._timeout_s)
    except BaseException:
        _discard(parent, [env.id for env in result.envs], children)
        raise
    return children


def _wait_all(children: list[DenvProvider], timeout_s: float) -> None:
    """Wait for every child at once; raise the first failure after all have finished."""
    if len(children) == 1:
        child = children[0]
        child.wait_for_ready(_url(child), timeout_s)
        return
    with ThreadPoolExecutor(max_workers=len(children), thread_name_prefix="denv-fork") as pool:
        futures = [pool.submit(c.wait_for_ready, _url(c), timeout_s) for c in children]
        errors = [f.exception() for f in futures]
    for error in errors:
        if error is not None:
            raise error


def _url(child: DenvProvider) -> str:
    assert child.base_url is not None  # _child binds it or raises
    return child.base_url


def _discard(parent: DenvProvider, env_ids: list[str], children: list[DenvProvider]) -> None:
    """Delete every child env of a failed fork, bound to a provider or not."""
    bound = {c.env_id for c in children}
    for child in children:
        try:
            child.close()
        except Exception as exc:
            logger.warning("could not delete env %s: %s", child.env_id, exc)
    for env_id in env_ids:
        if env_id not in bound:
            parent._delete_quietly(env_id)
