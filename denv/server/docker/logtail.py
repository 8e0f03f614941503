"""A container's log as it is written: the Docker node's ``logs_after``.

The cursor is the timestamp of the last line handed out, in nanoseconds (Docker stamps each
line so). New lines come from a follow stream opened from that instant: it wakes the caller
as soon as a line is written, and is closed once a line came (and the few right behind it)
or the wait is over. Docker's ``since`` keeps microseconds only, so lines at or before the
cursor that it sends again are dropped here.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

import docker.errors

from denv.server.docker.sdk import engine_errors

#: After the first new line, how long to keep reading for the lines right behind it.
LINGER_S = 0.05


def stamp_ns(stamp: str) -> int:
    """Docker's RFC 3339 timestamp with nanoseconds, as nanoseconds since the epoch."""
    whole, _, frac = stamp.rstrip("Z").partition(".")
    seconds = datetime.fromisoformat(whole).replace(tzinfo=UTC).timestamp()
    return int(seconds) * 1_000_000_000 + int((frac + "000000000")[:9])


def _split(line: str) -> tuple[int, str] | None:
    stamp, _, text = line.partition(" ")
    try:
        return stamp_ns(stamp), text
    except ValueError:
        return None


def last_lines(api: Any, cid: str, tail: int) -> tuple[list[str], str] | None:
    """The last ``tail`` lines and the cursor after them; None when there is no container."""
    now = time.time_ns()  # before reading: a line written meanwhile comes again, not never
    with engine_errors():
        try:
            raw = api.logs(cid, stdout=True, stderr=True, timestamps=True, tail=tail)
        except docker.errors.NotFound:
            return None
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    stamped = [s for s in map(_split, text.splitlines()) if s is not None]
    cursor = stamped[-1][0] if stamped else now
    return [t for _, t in stamped], str(cursor)


def lines_after(
    api: Any, cid: str, cursor: str, tail: int, wait_s: float
) -> tuple[list[str], str] | None:
    """Lines written after ``cursor`` (the last ``tail``), waiting up to ``wait_s`` for the
    first, and the new cursor; None when there is no container or it no longer runs."""
    after = int(cursor)
    with engine_errors():
        try:
            stream = api.logs(
                cid,
                stdout=True,
                stderr=True,
                timestamps=True,
                stream=True,
                follow=True,
                since=max(after // 1000 / 1e6, 1e-6),  # microseconds: Docker's precision
            )
        except docker.errors.NotFound:
            return None
    closed = threading.Event()  # by us: the wait is over; else Docker ended the stream

    def close() -> None:
        closed.set()
        stream.close()

    timer = threading.Timer(wait_s, close)
    timer.daemon = True
    timer.start()
    got: list[tuple[int, str]] = []
    buffer = ""
    try:
        for chunk in stream:
            buffer += chunk.decode("utf-8", "replace") if isinstance(chunk, bytes) else chunk
            *whole, buffer = buffer.split("\n")
            for line in whole:
                stamped = _split(line)
                if stamped is not None and stamped[0] > after:
                    got.append(stamped)
            if got and timer.interval != LINGER_S:
                timer.cancel()
                timer = threading.Timer(LINGER_S, close)
                timer.daemon = True
                timer.start()
    except Exception:  # closed under the reader: the wait is over
        pass
    finally:
        timer.cancel()
        stream.close()
    if not got:
        # Docker ends a follow stream of its own only when the container stops: no more log.
        return ([], cursor) if closed.is_set() else None
    return [t for _, t in got[-tail:]], str(got[-1][0])
