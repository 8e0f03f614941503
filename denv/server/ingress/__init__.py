"""Ingress: the proxy that reaches an env's published port at ``/ingress/<token>/...``.

The route table, what goes on the wire, and the WebSocket half. Same rule as ``api``: it
reaches envs through addresses the lifecycle registered, never through a node's internals.
"""
