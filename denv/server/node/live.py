"""Live forks as the node seam carries them: their error (``LiveError``), the rule of which
envs run live.

The mechanism (the launcher in the container, gates, clones, the children's plumbing) is
the Docker node's (``denv.server.docker.live``); the lifecycle sees only this.
"""

from __future__ import annotations

from denv.server.node.errors import LiveError as LiveError  # its tree: node.errors

# Live children of one root serve on ports counted up from here inside their container.
CHILD_PORT_BASE = 20000


def unsupported_reason(services: int) -> str | None:
    """Why an env cannot run live before it starts, or None. Whether its server can be copied
    (a Python ASGI app that uvicorn serves in one process) is known once it serves: the
    launcher takes it on however the image starts it, or says why not."""
    if services != 1:
        return "it is a compose project of several services (live forks copy one process)"
    return None
