"""The errors of the denv client and its OpenEnv adapter (defined in `denv.client.errors`):
the one list, shaped by how a caller recovers. `except denv.DenvError` catches every one.
"""

from .client.errors import *  # noqa: F403  (the public door; the list is denv.client.errors)
from .client.errors import __all__ as __all__
