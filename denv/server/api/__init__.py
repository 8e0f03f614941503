"""The HTTP API: the contract's routes, idempotency, request limits, TLS.

Routes only translate HTTP to the lifecycle's calls and back. May import the lifecycle and
the root's shared modules; never a node implementation (``docker``, ``net``, ``volumes``,
``node.cluster``): the import contracts in pyproject.toml say so.
"""
