"""Rules of live forks and warm pools that need no engine: which envs may run live before
they start, and the warm pools' back-off."""

from __future__ import annotations

import itertools

from denv.server.lifecycle.pools.pool import retry_delay
from denv.server.node import live


def test_one_service_can_run_live_and_a_compose_project_cannot() -> None:
    """Which servers can be copied is known once they serve (test_live_start_forms.py)."""
    assert live.unsupported_reason(1) is None
    reason = live.unsupported_reason(2)
    assert reason is not None and "compose project" in reason


def test_a_failing_warm_pool_backs_off_and_never_gives_up() -> None:
    delays = [retry_delay(n) for n in range(3, 12)]
    assert delays[0] == 15.0
    assert all(b == min(600.0, 2 * a) for a, b in itertools.pairwise(delays))
    assert delays[-1] == 600.0  # bounded, and still a retry
