"""denv: run RL environments as sandboxes and fork their live state."""
