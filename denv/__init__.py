"""denv: run RL environments as sandboxes and fork their live state.

    from denv import Denv

    with Denv() as denv:  # DENV_SERVER / DENV_API_KEY, else the local `denv serve`
        env = denv.create_sandbox("denv-echo-env:latest")
        fork = denv.fork(env.id, count=4)

`AsyncDenv` is the same facade for asyncio (`async with AsyncDenv() as denv`, every call
awaited, lists async iterators).

Errors are `denv.DenvError` subclasses (one list, in `denv.errors`); what calls return are
the frozen records and enums of `denv.types` (`Env`, `Version`, `Fork`, `EnvStatus`...),
re-exported here. Finding or starting the local server: `denv.local`.
"""

from . import errors, types
from .client import AsyncDenv, Denv
from .errors import *  # noqa: F403  (the error classes; one list, in denv.errors)
from .types import *  # noqa: F403  (the records and enums calls return; in denv.types)

__all__ = ["AsyncDenv", "Denv"]
__all__ += errors.__all__
__all__ += types.__all__
