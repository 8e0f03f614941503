"""The web console at ``/ui``: envs, versions, live fork trees, logs and actions.

A page of plain HTML and one small script (``static/``, shipped in the wheel; nothing is
fetched from elsewhere), signed in with an API key kept in an HttpOnly cookie
(``session``), fed by a Server-Sent Events stream of the key's records (``tree``,
``routes``). Above the node seam, like the API: it calls the same ``Service``.
"""

from __future__ import annotations

from denv.server.console.routes import router

__all__ = ["router"]
