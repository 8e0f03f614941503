"""Live forks on the Docker node: a live env's server process copied into children.

- ``node``: ``LiveDocker``, the node's live calls (``DockerNode.live_*`` hand them here);
- ``fork``: one fork's steps on the node (limits, capture, mounts, each child placed,
  released when it failed), and the parts every fork works with;
- ``launcher_ctl``: the launcher's container settings, and what the node asks of it from
  the host (find the server, its trial copy, modules, preload), by pid and start time;
- ``launcher_fork``: a fork's exchange with the launcher (gate, fork, plumb each child);
- ``cgroups``: each live server's cgroups and limits;
- ``port_rules``: live servers kept off each other's ports (``--live-netns off``);
- ``netns``: a network namespace per child (``--live-netns on``), its requests in
  ``netlink``;
- ``rootfs``: what each child's root filesystem overlay stands on;
- ``launcher/``: not imported by the server: mounted read-only into env containers
  (``/.denv/bin``), where it runs under the image's own Python (standard library only).

Nothing here imports the rest of ``docker/`` (whose boot and engine use the launcher's
settings): the engine and the env locks come in as the protocols ``rootfs.Inspects`` and
``fork.EnvLocks``.
"""
