"""The node seam: what one machine does for the envs placed on it, in plain records.

``seam`` is the protocol, ``egress`` and ``live`` the policies and errors it carries. Its
implementations live beside it: the Docker Engine node (``denv.server.docker``) and many
nodes behind one seam (``node.cluster``). Nothing here imports the API or the lifecycle.
"""
