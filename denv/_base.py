"""How a `Denv` reaches its server: found on first use, one pooled connection, closed once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Self

import httpx
from denv_api_client.client import AuthenticatedClient

from . import _config
from ._http import build_api_client, call_options
from ._requests import Secret, WaitArg
from .local import resolve_server


class ClientBase:
    """The connection half of `Denv` (its calls are in `denv._client`)."""

    def __init__(
        self,
        server: str | None = None,
        api_key: str | None = None,
        *,
        timeout_s: float = _config.DEFAULT_TIMEOUT_S,
        max_retries: int = _config.DEFAULT_MAX_RETRIES,
        _transport: httpx.BaseTransport | None = None,
        _sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, not {timeout_s!r}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be 0 or more, not {max_retries!r}")
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self._page_size = _config.LIST_PAGE_SIZE
        # The server is found on first use (`_api`), so constructing a client does no I/O.
        self._server_arg = server
        self._key_arg = None if api_key is None else Secret(api_key)
        self._transport = _transport
        self._sleep = _sleep
        self._server: str | None = None
        self._client: AuthenticatedClient | None = None
        self._closed = False
        self._lock = threading.Lock()

    @classmethod
    def from_environment(
        cls,
        server: str | None = None,
        api_key: str | None = None,
        *,
        start_local: bool = False,
        timeout_s: float = _config.DEFAULT_TIMEOUT_S,
        max_retries: int = _config.DEFAULT_MAX_RETRIES,
    ) -> Self:
        """A client whose server is found now rather than on first use (see `denv.local`).

        With `start_local=True` and no server configured, the local server is started when
        none answers. Raises `DenvConfigError` when no server or key is found.

        >>> denv = Denv.from_environment(start_local=True)
        """
        url, key = resolve_server(server, api_key, start=start_local)
        return cls(url, key, timeout_s=timeout_s, max_retries=max_retries)

    @property
    def server(self) -> str:
        """The server's base URL (found on first use: argument, DENV_SERVER, local server)."""
        self._api  # noqa: B018  (finds the server)
        assert self._server is not None
        return self._server

    @property
    def _api(self) -> AuthenticatedClient:
        """The generated client, built on first use (see `denv.local.resolve_server`)."""
        with self._lock:
            if self._client is None:
                if self._closed:  # once built, httpx itself refuses calls after close
                    raise RuntimeError("this Denv client is closed")
                server, key = resolve_server(self._server_arg, self._key_arg)
                self._client = build_api_client(
                    server,
                    Secret(key),
                    timeout_s=self.timeout_s,
                    max_retries=self.max_retries,
                    transport=self._transport,
                    sleep=self._sleep,
                )
                self._server = server
            return self._client

    def __repr__(self) -> str:
        return f"Denv(server={self._server or self._server_arg!r})"

    # -- lifecycle

    def close(self) -> None:
        """Close the connection pool. The client is unusable afterwards."""
        with self._lock:
            self._closed = True
            client = self._client
        if client is not None:
            client.get_httpx_client().close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _long_poll(
        self, wait_s: float, *, idempotent: bool | None = None
    ) -> AbstractContextManager[None]:
        """For a call that may rightly wait `wait_s` before answering: that, plus `timeout_s`."""
        return call_options(read_timeout_s=wait_s + self.timeout_s, idempotent=idempotent)

    def _create_timeout(
        self, wait: WaitArg, wait_timeout_s: float | None
    ) -> AbstractContextManager[None]:
        if str(wait) == "none":
            return call_options()
        return self._long_poll(
            wait_timeout_s if wait_timeout_s is not None else _config.DEFAULT_CREATE_WAIT_TIMEOUT_S
        )
