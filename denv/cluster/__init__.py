"""denv on a Ray cluster: a node agent per Ray node and the control plane's view of them.

- ``agent``: ``NodeAgent``, the Ray actor that runs the node seam (``DockerNode``) on its
  own Ray node, with its own state dir and instance id;
- ``remote``: ``RemoteNode``, the node seam over an agent's actor handle;
- ``ray_cluster``: connect to Ray, find (and start) the agents, which nodes are alive;
- ``local``: a Ray cluster of N nodes on this machine (``denv cluster up|status|down``),
  its Ray nodes in ``ray_nodes`` and its processes' bookkeeping in ``processes``.
"""
