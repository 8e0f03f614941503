"""gVisor isolation: every env of ``denv serve --isolation gvisor`` runs in a sandbox with its
own (user-space) kernel, on the Docker Engine through the runtime ``runtime.RUNTIME``.

The node is the Docker node: boots, warm spares, volume forks, egress, ingress, limits and
compose services are the same calls with one difference, the runtime each container is created
with (``Engine.runtime``). Live forks are the host-kernel launcher's, so a gvisor server starts
no env live (``live: true`` is refused, naming why); an ``auto`` fork saves the parent's
sandbox instead and restores each child from it (``checkpoint``: gVisor's saver for the Docker
node's checkpoints; the restore is the runtime script's), or forks by snapshot of /work.
See docs/isolation.md for what each isolation level separates and costs.
"""
