"""``python -m denv.server [serve] [--port 0] ...``: the same as ``denv serve``."""

import sys

from denv.server.serve_cli import run

sys.exit(run())
