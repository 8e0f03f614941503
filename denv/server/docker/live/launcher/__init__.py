"""denv's live-fork launcher, mounted read-only into env containers (never imported)."""
