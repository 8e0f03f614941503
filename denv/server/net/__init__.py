"""Networks of envs: egress firewall rules, the host guard, network policy, subnets.

A leaf: knows neither the Docker node nor the cluster, only what the seam's records say.
"""
