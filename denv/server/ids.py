"""Prefixed ULIDs: ``env_`` / ``ver_`` / ``req_`` / ``lyr_`` + 26 Crockford base32 characters.

A ULID is 48 bits of milliseconds then 80 random bits, so ids sort by creation time:
lists are ordered by id, and a page cursor is simply the last id of the previous page.
"""

from __future__ import annotations

import re
import secrets
import threading
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_ULID_RE = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}$")

_lock = threading.Lock()
_last_ms = 0
_last_rand = 0


def _encode(value: int, length: int) -> str:
    chars = []
    for _ in range(length):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def ulid() -> str:
    """A new ULID, monotonic within this process (same millisecond: random part + 1)."""
    global _last_ms, _last_rand
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            ms = _last_ms
            rand = (_last_rand + 1) & ((1 << 80) - 1)
        else:
            rand = secrets.randbits(80)
        _last_ms, _last_rand = ms, rand
    return _encode(ms, 10) + _encode(rand, 16)


def new_id(prefix: str) -> str:
    """``new_id("env")`` → ``env_01J...``."""
    return f"{prefix}_{ulid()}"


def is_id(value: str, prefix: str) -> bool:
    """Whether ``value`` is a well-formed id with this prefix."""
    head, sep, tail = value.partition("_")
    return sep == "_" and head == prefix and bool(_ULID_RE.match(tail))
