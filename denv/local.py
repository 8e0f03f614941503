"""Where a client finds its denv server, and the local server it can find or start (defined in
`denv.client.local`): `resolve_server`, `state_dir`, `read_local_server`,
`ensure_local_server`, `stop_local_server`.
"""

from .client.local import *  # noqa: F403  (the public door; the code is denv.client.local)
from .client.local import __all__ as __all__
