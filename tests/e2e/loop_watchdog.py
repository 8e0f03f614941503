"""A watchdog for tests that claim never to block the event loop.

A task ticks every `TICK_S` on the loop; a gap between two ticks longer than `MAX_GAP_S`
means something held the loop (a sync HTTP call, finding the server, a sleep). A thread
beside it looks at the loop thread while a tick is late and keeps the stack it was in, so
the failure names the call that blocked instead of only saying that something did.

(This machine's test process runs in the root CPU cgroup while every container shares the
`docker` group, so containers booting do not starve the loop into false alarms.)
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import TypeVar

TICK_S = 0.05
MAX_GAP_S = 0.5
T = TypeVar("T")


@asynccontextmanager
async def watchdog(max_gap_s: float = MAX_GAP_S) -> AsyncIterator[list[float]]:
    """Yields the gaps between ticks seen so far; fails if the loop stalled past `max_gap_s`,
    with the loop thread's stack while it stalled."""
    gaps: list[float] = []
    last = [time.monotonic()]
    stalls: list[str] = []
    loop_thread = threading.get_ident()
    done = threading.Event()

    async def tick() -> None:
        while True:
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            gaps.append(now - last[0])
            last[0] = now

    def look() -> None:
        seen_at = None
        while not done.wait(TICK_S):
            late_since = last[0]
            if time.monotonic() - late_since > max_gap_s and seen_at != late_since:
                seen_at = late_since
                frame = sys._current_frames().get(loop_thread)
                stack = traceback.format_stack(frame)[-8:] if frame else ["(no frame)"]
                stalls.append("".join(stack))

    task = asyncio.create_task(tick())
    looker = threading.Thread(target=look, name="loop-watchdog", daemon=True)
    looker.start()
    try:
        yield gaps
    finally:
        task.cancel()
        done.set()
        looker.join()
    gaps.append(time.monotonic() - last[0])  # a stall after the last tick counts too
    where = f"; the loop thread was in:\n{stalls[0]}" if stalls else ""
    assert max(gaps) <= max_gap_s, f"the event loop was blocked for {max(gaps):.2f}s{where}"


async def watched(call: Awaitable[T]) -> T:
    async with watchdog():
        return await call
