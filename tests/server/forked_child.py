"""Run a function in a forked child of the test process and get back what it returned.

A child of ``os.fork()`` holds only the forking thread: what it checks sees no thread that
pytest or an earlier test left in this process, and whatever it changes is gone with it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any


def in_a_child(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``fn()``'s answer (JSON) from a forked child, which exits at once after it."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer and leave at once, whatever happens
        try:
            os.write(write, json.dumps(fn()).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        data = f.read()
    os.waitpid(pid, 0)
    answer: dict[str, Any] = json.loads(data)
    return answer
