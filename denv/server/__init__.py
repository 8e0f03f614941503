"""The local denv server: the denv contract on the Docker Engine (``denv serve``)."""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("denv")
except metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0"

__all__ = ["__version__"]
