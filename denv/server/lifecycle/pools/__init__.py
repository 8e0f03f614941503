"""Envs made before anyone asks for them: warm spares (``warm``, ``spares``: booted envs of a
configuration, their volumes mounted when a fork takes one) and zygotes (``zygotes``: an
idle live root per configuration, copied into new envs)."""
