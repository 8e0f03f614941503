"""The server of an environment package written by ``denv export``.

``denv export`` copies this package into the exported directory as ``server/``; it needs
only OpenEnv (and its dependencies: pydantic, httpx, uvicorn, websockets), never denv.
"""
