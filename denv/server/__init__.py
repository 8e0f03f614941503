"""The local denv server: the denv contract on the Docker Engine."""
