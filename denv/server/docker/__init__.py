"""The Docker Engine node: boot, the engine's containers and images, cgroups, live forks.

Implements the node seam on this machine's Docker Engine, using ``net`` and ``volumes``.
``live/launcher/`` is not imported by the server: it is mounted into env containers and runs
under the image's own Python (standard library only).
"""
