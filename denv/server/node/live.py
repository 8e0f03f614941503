"""Live forks as the node seam carries them: their errors, the rule of which envs run live.

The mechanism (the launcher in the container, gates, clones, the children's plumbing) is
the Docker node's (``denv.server.docker.live``); the lifecycle sees only this.
"""

from __future__ import annotations

import os

# Live children of one root serve on ports counted up from here inside their container.
CHILD_PORT_BASE = 20000


class LiveError(Exception):
    """A live fork could not be made; ``code`` is the API's error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def unsupported_reason(argv: list[str] | None, services: int) -> str | None:
    """Why an env of this command cannot be live-forked, or None when it can."""
    if services != 1:
        return "it is a compose project of several services (live forks copy one process)"
    if not argv:
        return "its image has no command"
    name = os.path.basename(argv[0])
    if name == "uvicorn" or (name.startswith("python") and argv[1:3] == ["-m", "uvicorn"]):
        if any(a == "--reload" or a.startswith("--workers") or a == "--uds" for a in argv):
            return "its uvicorn runs with --reload, --workers or --uds"
        return None
    return (
        f"its command ({' '.join(argv[:3])}...) is not a Python ASGI server started by "
        "`uvicorn MODULE:APP` or `python -m uvicorn MODULE:APP`"
    )
