"""An env's endpoints behind ingress: the one place a port's token, endpoint and route are made.

Every kind of env (a cold start, an adopted spare, a live child) is reached the same way:
its token is derived from the server's secret, the env id, the service and the port
(``denv.server.tokens``), so its record keeps no token, and the route the ingress table
serves points at the host and port the env listens on.
"""

from __future__ import annotations

from denv.server.records import Endpoint
from denv.server.tokens import IngressKeys

Route = tuple[str, str, int, str]  # ingress token, service, port, host


def ingress_endpoint(
    keys: IngressKeys, env_id: str, service: str, port: int, host: str
) -> tuple[Endpoint, Route]:
    """The endpoint a record keeps (its URL rendered later) and the route ingress serves."""
    token = keys.token(env_id, service, port)
    endpoint = Endpoint(service=service, port=port, url="", via="ingress")
    return endpoint, (token, service, port, host)
