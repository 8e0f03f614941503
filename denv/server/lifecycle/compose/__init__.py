"""The compose subset denv deploys: parsed (``parse``), one service key by key
(``services``), what a parsed file is (``spec``), and YAML read with bounds
(``bounded_yaml``)."""

from denv.server.lifecycle.compose.parse import parse_compose
from denv.server.lifecycle.compose.spec import ComposeError, ComposeService, ComposeSpec

__all__ = ["ComposeError", "ComposeService", "ComposeSpec", "parse_compose"]
