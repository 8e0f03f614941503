"""Envs booted before anyone asks for them: warm spares of a configuration, their volumes
mounted when a fork takes one (``warm``: every pool and its upkeep; ``pool``: one pool;
``spares``: one spare). Zygotes, idle live roots copied into new envs, drive envs and so
sit with live forks (``lifecycle.live.zygotes``)."""
