"""More time for a warm spare past its boot's time limit while it still uses CPU
(``more_time``): at a low CPU weight under load a spare boots slowly, but it boots; failing
it at a fixed limit wasted the work and stalled the pool."""

from __future__ import annotations

import threading
import time

from denv.server.docker import cgroups

SPARE_EXTRA_STEP_S = 30.0  # more time for a spare past its limit that is still using CPU
SPARE_PROGRESS_CPU_S = 0.5  # CPU seconds per step that count as still booting
SPARE_MAX_EXTRA_S = 480.0  # at most this much more in all


class _Progress:
    """Whether a spare past its time limit is still booting (using CPU): then it gets more
    time, up to SPARE_MAX_EXTRA_S in all."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[float, float, float]] = {}  # cid -> (cpu s, at, extra)
        self._lock = threading.Lock()

    def more_time(self, cid: str) -> float:
        cpu = cgroups.cpu_seconds(cid)
        now = time.monotonic()
        with self._lock:
            last = self._seen.get(cid)
            if cpu is None:
                return 0.0
            if last is None:  # the first look: measure again one step on
                self._seen[cid] = (cpu, now, SPARE_EXTRA_STEP_S)
                return SPARE_EXTRA_STEP_S
            cpu0, _, extra = last
            if cpu - cpu0 < SPARE_PROGRESS_CPU_S or extra >= SPARE_MAX_EXTRA_S:
                self._seen.pop(cid, None)
                return 0.0
            self._seen[cid] = (cpu, now, extra + SPARE_EXTRA_STEP_S)
            return SPARE_EXTRA_STEP_S


_progress = _Progress()
more_time = _progress.more_time
