"""from_denv_version: an OpenEnv client on a new env started from a stored version.

Importing `denv.openenv` installs two things on OpenEnv's clients:

* `EnvClient.from_denv_version(version_id, provider=None)`, a classmethod like
  `from_docker_image`: `await MyEnv.from_denv_version("ver_...")` or
  `MyEnv.from_denv_version("ver_...").sync()`;
* a read-only `provider` property on `EnvClient` and `SyncEnvClient` where the
  installed OpenEnv keeps the provider only in `_provider` (0.10 does), so
  that `root.provider.fork()` works.
"""

from __future__ import annotations

from contextlib import suppress
from typing import Any

from openenv.core.env_client import EnvClient
from openenv.core.sync_client import SyncEnvClient

from ._provider import DenvProvider


def from_denv_version(
    client_cls: type[Any], version_id: str, provider: DenvProvider | None = None, **kwargs: Any
) -> Any:
    """Start an env from `version_id` and return a bootstrap handle for a `client_cls` on it.

    The handle works like `from_docker_image`'s: `await` it for a connected
    async client, or call `.sync()` for a connected sync one. The env is
    started when the handle is resolved, on `provider` (default: a new
    `DenvProvider()`), and deleted when the client closes. `kwargs`
    (`env_vars`, `wait_timeout`, `labels`) go to `DenvProvider.start_version`.
    Awaited, nothing blocks the event loop (`DenvProvider.start_version_async`,
    `wait_for_ready_async`), so many can start at once with `asyncio.gather`.

    Example::

        env = from_denv_version(MyEnv, "ver_01JDQ5C8M9W3X7Y2Z4A6B8C0D1").sync()
        env.step(action)
        env.close()
    """
    if not (isinstance(version_id, str) and version_id.startswith("ver_")):
        raise ValueError(f"expected a version id (ver_...), got {version_id!r}")

    def bootstrap() -> Any:
        owned = provider if provider is not None else DenvProvider()
        try:
            base_url = owned.start_version(version_id, **kwargs)
            owned.wait_for_ready(base_url)
            return client_cls(base_url=base_url, provider=owned)
        except BaseException:
            # No client exists yet for the caller to close(): release the env here.
            owned.stop_container()
            raise

    async def bootstrap_async() -> Any:
        owned = provider if provider is not None else DenvProvider()
        try:
            base_url = await owned.start_version_async(version_id, **kwargs)
            await owned.wait_for_ready_async(base_url)
            client = client_cls(base_url=base_url, provider=owned)
            await client.connect()
            return client
        except BaseException:
            with suppress(Exception):
                await owned.stop_container_async()
            raise

    return _bootstrap_handle(bootstrap, bootstrap_async)


def _bootstrap_handle(bootstrap: Any, bootstrap_async: Any) -> Any:
    try:
        from openenv.core.env_client import _BootstrapResult
    except ImportError:  # an OpenEnv without bootstrap handles: a plain coroutine
        return bootstrap_async()

    class _Handle(_BootstrapResult):  # type: ignore[misc]  # openenv ships no type hints
        """OpenEnv's handle (`await` it, or `.sync()`), whose await never blocks the loop."""

        async def _resolve_async(self) -> Any:
            self._consume_async()
            return await bootstrap_async()

        def _consume_async(self) -> None:
            if getattr(self, "_used", False):
                raise RuntimeError(
                    "This bootstrap handle has already been resolved; call "
                    "from_denv_version again to start a new environment."
                )
            self._used = True

    return _Handle(bootstrap)


def _from_denv_version(
    cls: type[Any], /, version_id: str, provider: DenvProvider | None = None, **kwargs: Any
) -> Any:
    return from_denv_version(cls, version_id, provider, **kwargs)


_from_denv_version.__doc__ = from_denv_version.__doc__


def install() -> None:
    """Add `from_denv_version` and a read-only `provider` to OpenEnv's clients (idempotent)."""
    if not hasattr(EnvClient, "from_denv_version"):
        EnvClient.from_denv_version = classmethod(_from_denv_version)
    if not hasattr(EnvClient, "provider"):
        EnvClient.provider = property(
            lambda self: self._provider, doc="The provider that runs this client's env, if any."
        )
    if not hasattr(SyncEnvClient, "provider"):
        SyncEnvClient.provider = property(
            lambda self: self._async.provider,
            doc="The provider that runs this client's env, if any.",
        )
