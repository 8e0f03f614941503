"""A live fork's gate and the server's own threads (the soak saw a 409 `fork_unsafe` right
after a step, which a retry then passed: a thread that was about to end).

The launcher's real gate (`_denv_live.Live._gate`) runs in a forked child of this process,
where the only threads are the ones the test starts (pytest's process may hold others): a
thread that ends within the wait lets the fork go on; one that stays still refuses it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from forked_child import in_a_child

from denv.server.docker.live.launcher import _denv_live as launcher


def _gate_in_a_child(thread_lives_s: float | None) -> dict[str, Any]:
    """The gate's answer in a fresh child process, with one thread of the server's own
    that ends after ``thread_lives_s`` (None: never, until the answer)."""

    def gate_answer() -> dict[str, Any]:
        stop = threading.Event()
        lives = thread_lives_s if thread_lives_s is not None else 3600.0
        threading.Thread(target=stop.wait, args=(lives,), name="server-own").start()

        async def gate() -> dict[str, Any]:
            g = launcher.Gate(inner=None)
            g.bind()
            started = time.perf_counter()
            answer = await launcher.Live(None, g, "env_test")._gate(5.0)
            return {**answer, "waited_s": time.perf_counter() - started}

        out = asyncio.run(gate())
        stop.set()
        return out

    return in_a_child(gate_answer)


def test_a_thread_about_to_end_is_waited_for_not_refused() -> None:
    answer = _gate_in_a_child(0.2)
    assert answer.get("ok") is True, answer


def test_a_thread_that_stays_still_makes_the_fork_unsafe() -> None:
    answer = _gate_in_a_child(None)
    assert answer["error"] == "fork_unsafe", answer
    assert "server-own" in answer["message"]
    assert answer["waited_s"] >= launcher.STRANGERS_WAIT_S  # it waited before refusing
