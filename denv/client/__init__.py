"""The client facade: `Denv`, `AsyncDenv` and everything they stand on (the calls, the
connection, retries, leases, the records they return and the errors they raise).

Users import it from `denv` (`from denv import Denv`), `denv.errors`, `denv.types` and
`denv.local`, which re-export this package's public names; the modules here are private.
The layer rules name this folder (pyproject.toml, [tool.importlinter]): the facade imports
neither the adapter nor the server, and they import it only through those public modules.
"""

from ._async import AsyncDenv
from ._client import Denv

__all__ = ["AsyncDenv", "Denv"]
