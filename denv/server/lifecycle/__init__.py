"""The lifecycle of envs and versions: admission, create, fork, snapshot, deploy, delete.

Everything here works on records and reaches a machine only through the node seam
(``denv.server.node``): never ``docker``, ``net``, ``volumes`` or ``node.cluster``.
"""
