"""denv's shapes env: an OpenEnv env with the shapes real envs have (see ``environment``)."""
