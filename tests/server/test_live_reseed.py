"""A live child's global generators (issue 24 item 3): fresh entropy, or the parent's state.

The launcher's clone runs CPython's at-fork hooks as ``os.fork()`` does, so ``os.fork()``
here stands in for it (no namespaces needed to check what the child draws); the child then
runs the launcher's own ``reseed_or_keep``, as a live child does before it serves.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
from forked_child import in_a_child

from denv.server.docker.live.launcher import _denv_live as launcher


def _child_draws(reseed: bool) -> dict[str, Any]:
    """Fork like a live fork with ``reseed``: the child's next draws of random and NumPy."""
    kept = launcher.random_state() if not reseed else None

    def draws() -> dict[str, Any]:
        launcher.reseed_or_keep(reseed, kept)
        return {"random": random.random(), "numpy": float(np.random.random())}

    return in_a_child(draws)


def test_reseeded_children_draw_apart_and_kept_ones_draw_the_parents_next() -> None:
    random.seed(7)
    np.random.seed(7)
    a, b = _child_draws(True), _child_draws(True)
    assert a["random"] != b["random"] and a["numpy"] != b["numpy"]
    # Kept: each child draws what the parent draws next (the parent's state is untouched).
    k1, k2 = _child_draws(False), _child_draws(False)
    assert k1 == k2 == {"random": random.random(), "numpy": float(np.random.random())}
