"""Kept for `denv.server.cli` until it imports `denv.local`, the public module, instead."""

from .local import LocalServer, ensure_local_server, read_local_server, stop_local_server

__all__ = ["LocalServer", "ensure_local_server", "read_local_server", "stop_local_server"]
