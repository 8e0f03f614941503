"""The provider's operations, each written once as a plan (`_plan`) on a `Binding`.

`DenvProvider` runs them with blocking calls (`_plan.run`) or awaits them (`_async.run`);
`awaited` says which, for the names in messages and for `Binding.awaited`. Readiness is in
`_waits`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from contextlib import suppress
from typing import TYPE_CHECKING, Any, Literal

from denv.errors import Conflict, EnvStartError, InvalidRequest, NotFound

from ._binding import Binding
from ._config import ForkKind, ProviderConfig, check_start_options
from ._plan import Plan, Together, api, run
from ._readiness import child_probe
from ._waits import FAILED, agent_url, delete_quietly, needs_probes, ready, start_error

if TYPE_CHECKING:
    from denv.types import Env, Fork

logger = logging.getLogger(__name__)

#: The contract's limit on children per fork request (EnvsCreate.count).
MAX_FORK_COUNT = 32


def start_image(
    binding: Binding,
    image: str | None,
    port: int | None,
    env_vars: Mapping[str, str] | None,
    options: dict[str, Any],
    *,
    awaited: bool,
) -> Plan[str]:
    """`DenvProvider.start_container`: a new env of `image`; its base URL."""
    check_start_options(options)
    config = binding.config
    image = image or config.image
    if not image:
        call = "start_container_async" if awaited else "start_container"
        raise ValueError(f"no image to start: pass one to {call}(image) or DenvProvider(image=...)")
    binding.require_unbound()
    wait_timeout = options.get("wait_timeout")
    sandbox = config.sandbox_options(port, env_vars, options)
    with binding.released_on_failure():
        try:
            env: Env = yield from _live_create(config, "create_sandbox", image, **sandbox)
        except InvalidRequest as exc:
            if exc.code != "image_not_found":
                raise
            raise image_not_found(exc, config.pull) from exc
        binding.ready_timeout_s = float(wait_timeout) if wait_timeout else None
        return (yield from adopt(binding, env, f"image {image!r}", awaited=awaited))


def _live_create(
    config: ProviderConfig,
    method: Literal["create_sandbox", "envs_from_version"],
    *args: Any,
    **options: Any,
) -> Plan[Any]:
    """The create `method` with the provider's `live`; under `fork="auto"`, once more
    without the launcher when the server refused it (an image with no Python)."""
    try:
        return (yield api(method, *args, live=config.live_start(), **options))
    except Conflict as exc:
        if not config.volume_fallback(exc.code):
            raise
        logger.info("fork='auto': %s; starting for volume forks", exc)
        return (yield api(method, *args, live=False, **options))


def image_not_found(exc: InvalidRequest, pulled: bool) -> InvalidRequest:
    """The server's `image_not_found`, its advice in the provider's words: `pull=True` when
    the start did not pull, nothing more when it did (the pull is what failed)."""
    advice = "" if pulled else ", or pass DenvProvider(pull=True)"
    return InvalidRequest(
        exc.message.replace(", or pass pull: true", advice),
        status=exc.status,
        code=exc.code,
        request_id=exc.request_id,
        body=exc.body,
        details=exc.details,
    )


def start_version(
    binding: Binding,
    version_id: str,
    env_vars: Mapping[str, str] | None,
    wait_timeout: float | None,
    labels: Mapping[str, str] | None,
    *,
    awaited: bool,
) -> Plan[str]:
    """`DenvProvider.start_version`: a new env from a stored version; its base URL."""
    config = binding.config
    binding.require_unbound()
    options = {
        "count": 1,
        "egress": config.egress,
        "env": dict(env_vars) if env_vars else None,
        "labels": config.merged_labels(labels),
        "ttl_s": config.ttl_s,
        "wait": "running",
        "wait_timeout_s": float(wait_timeout or config.timeout_s),
        "warm": config.warm,
    }
    with binding.released_on_failure():
        envs: list[Env] = yield from _live_create(
            config, "envs_from_version", version_id, **options
        )
        (env,) = envs
        binding.ready_timeout_s = float(wait_timeout) if wait_timeout else None
        return (yield from adopt(binding, env, f"version {version_id}", awaited=awaited))


def adopt(binding: Binding, env: Env, what: str, *, awaited: bool) -> Plan[str]:
    """Bind to a just-created env and return its base URL; delete it if it is unusable."""
    try:
        if str(env.status) in FAILED:
            raise (yield from start_error(env, what))
        url = agent_url(env)
        if url is None:
            raise EnvStartError(
                f"env {env.id} ({what}) has no endpoint for its agent service "
                f"{env.agent_service!r}",
                env_id=env.id,
                fix="Expose the port its OpenEnv server listens on: start_container(port=...).",
            )
    except BaseException:
        yield from delete_quietly(env.id)
        raise
    binding.bind(env, url, what, awaited)
    logger.info("env %s started (%s, egress %s)", env.id, what, env.egress)
    return url


def fork(
    binding: Binding, count: int, kind: ForkKind | None, *, awaited: bool, reseed: bool = True
) -> Plan[list[Binding]]:
    """`DenvProvider.fork(count)`: one snapshot, `count` children ready, all or none."""
    if not 1 <= count <= MAX_FORK_COUNT:
        raise ValueError(f"fork count must be between 1 and {MAX_FORK_COUNT}, not {count!r}")
    env_id, config = binding.env_id, binding.config
    if env_id is None:
        raise RuntimeError(
            "fork_async() needs a running env: start one first (start_container_async(), or "
            "from_denv_version(...))"
            if awaited
            else "fork() needs a running env: start one first (start_container(), or a client "
            "made with from_docker_image(image, provider=DenvProvider()))"
        )
    result: Fork = yield api(
        "fork",
        env_id,
        count=count,
        labels=config.merged_labels(),
        ttl_s=config.ttl_s,
        # The server starts the children in parallel and answers once each is healthy or
        # failed (at once for warm children); the client then only probes its own path.
        wait="healthy",
        wait_timeout_s=config.timeout_s,
        warm=config.warm,
        kind=config.fork_kind(kind),
        reseed=reseed,
    )
    logger.info("forked env %s into %d (version %s)", env_id, count, result.version.id)
    children: list[Binding] = []
    try:
        for env in result.envs:
            child = binding.child(child_probe(str(env.start), binding.ws_probe))
            children.append(child)
            yield from adopt(child, env, f"a fork of {env_id}", awaited=awaited)
        waits = [
            ready(child, child.base_url or "", config.timeout_s)
            for child in children
            if needs_probes(child.start)
        ]
        errors: list[BaseException | None] = yield Together(waits)
        for error in errors:
            if error is not None:
                raise error
    except BaseException:
        # Nothing is left behind: every child is deleted, then lets go of the connection.
        yield Together([delete_quietly(env.id) for env in result.envs])
        for child, env in zip(children, result.envs, strict=False):
            child.unbind(env.id)
            child.disconnect()
        raise
    return children


def stop(binding: Binding) -> Plan[None]:
    """`DenvProvider.stop_container`: delete the env, if any; let go of the connection."""
    env_id = binding.env_id
    if env_id is not None and binding.connected:
        with suppress(NotFound):  # already gone: what stop wants
            yield api("delete_env", env_id)
        binding.unbind(env_id)
        logger.info("deleted env %s", env_id)
    binding.disconnect()


def stop_on_a_thread(binding: Binding) -> None:
    """`stop` without making the running loop wait (OpenEnv's async `close()` calls the
    provider's sync stop). Not a daemon: the interpreter waits for it before exiting."""

    def stop_here() -> None:
        try:
            run(stop(binding), binding)
        except Exception as exc:
            logger.warning("could not delete env %s: %s", binding.env_id, exc)
            binding.disconnect()

    thread = threading.Thread(target=stop_here, name=f"denv-stop-{binding.env_id}", daemon=False)
    thread.start()
