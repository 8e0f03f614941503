"""The OpenEnv adapter: DenvProvider, fork, from_denv_version."""
