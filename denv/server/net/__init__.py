"""Networks of envs: egress firewall rules, the host guard, network policy, subnets.

A leaf: knows neither the seam (``node/``) nor the Docker node nor the cluster. The egress
policy's rules (``egress_rules.EnvRule``, ``PRIVATE_RANGES``) are defined here and the seam's
``node/egress.py`` imports them.
"""
