"""denv's start-up hook for live envs, run by every Python process of a live env's container.

The live launcher (``launcher.py``, pid 1) puts this directory first on ``PYTHONPATH`` and sets
``DENV_LIVE_HOOK=1``; Python's ``site`` then imports this module at start-up. It changes
nothing until one of four modules is imported, and then patches it from ``_denv_live``:

- ``uvicorn.config``: uvicorn serves on asyncio's own event loop, not uvloop's (which a live
  fork cannot copy);
- ``uvicorn.server``: the process's first ``Server.serve`` takes the live launcher on (the
  gate, the control socket), however uvicorn was started;
- ``concurrent.futures.thread``: executor jobs are counted (a fork waits for none in flight);
- ``openenv.core.env_server.http_server``: OpenEnv's sessions are tracked (a child continues
  one).

Anywhere else (``DENV_LIVE_HOOK`` unset, as when the host's denv package is imported) it does
nothing. An image's own ``sitecustomize``, which this module hides on ``sys.path``, is run
after it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
PATCHES = {
    "uvicorn.config": "patch_uvicorn_config",
    "uvicorn.server": "patch_uvicorn",
    "concurrent.futures.thread": "patch_executors",
    "openenv.core.env_server.http_server": "patch_openenv",
}


def _patch(name: str, module: ModuleType) -> None:
    live: Any = sys.modules.get("_denv_live") or importlib.import_module("_denv_live")
    patch = getattr(live, PATCHES[name], None)
    if patch is not None:  # None: _denv_live is being imported, and patches at its end
        patch(module)


class _Loader(importlib.abc.Loader):
    """The module's own loader, then the patch."""

    def __init__(self, inner: Any, after: Callable[[ModuleType], None]) -> None:
        self.inner, self.after = inner, after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self.inner.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        self.after(module)

    def __getattr__(self, attr: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self.inner, attr)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name not in PATCHES:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec: importlib.machinery.ModuleSpec | None = find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(spec.loader, lambda module: _patch(name, module))
        return spec


def _install() -> None:
    for name in PATCHES:
        if name in sys.modules:  # imported before site ran (a .pth file): patch it now
            _patch(name, sys.modules[name])
    sys.meta_path.insert(0, _Finder())


def _run_the_images_own() -> None:
    """The ``sitecustomize`` this one hides (Debian's Python has one), if any."""
    rest = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":  # run by site at start-up (not imported as part of denv)
    if os.environ.get("DENV_LIVE_HOOK") == "1":
        _install()
    _run_the_images_own()
