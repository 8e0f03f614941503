"""What the denv client returns: plain frozen records and enums (defined in
`denv.client.types`, by what they describe), imported from here.
"""

from .client.types import *  # noqa: F403  (the public door; the records are in denv.client.types)
from .client.types import __all__ as __all__
