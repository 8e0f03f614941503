"""Replaying a cassette so that it checks what the client sends, not only where it sends it.

A recorded answer plays only for a request equal to the recorded one in method, URL
(scheme, host, port, path and every query parameter) and JSON body, with the headers that
carry meaning: the API key, and the Idempotency-Key of a create. Values that differ on every
run by design are checked for their shape instead of their value:

* `Authorization` is sent exactly where it was recorded, as `Bearer dak_<key chars>`: the
  recorder writes every key as CASSETTE_KEY, so the recorded header is `Bearer dak_CASSETTE_KEY`;
  a request recorded without one (the env's ingress) must not carry one either;
* `Idempotency-Key` is sent exactly where it was recorded (as `idempotency-key-<n>`), as
  `denv-<uuid4>`; one recorded key stands for one sent key (checked after the replay);
* `timeout_s` of a `.../wait` body is what is left of a deadline when the call goes out: a
  positive number no larger than the recorded one rounded up to a whole second.

`replay()` also notes the requests the client really sent (vcrpy's own `cassette.requests`
are the recorded ones), and fails when any request found no recording, even one whose
CannotOverwriteExistingCassetteException the code under test caught and logged.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import vcr
from vcr.cassette import Cassette
from vcr.request import Request

CASSETTES = Path(__file__).resolve().parents[1] / "cassettes"
# What scripts/record_cassettes.py writes in place of every API key.
RECORDED_AUTHORIZATION = "Bearer dak_CASSETTE_KEY"
# The keys the recorder scrubs (its `_KEY`), behind the scheme the client sends them with.
SENT_AUTHORIZATION = re.compile(r"Bearer dak_[A-Za-z0-9_\-]+")
RECORDED_IDEMPOTENCY_KEY = re.compile(r"idempotency-key-[0-9]+")
SENT_IDEMPOTENCY_KEY = re.compile(
    r"denv-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
)
_WAIT_PATH = re.compile(r"/v1/envs/[^/]+/wait")


def _header(request: Request, name: str) -> str | None:
    value = request.headers.get(name)
    if isinstance(value, bytes):
        return value.decode()
    return None if value is None else str(value)


def authorization(sent: Request, recorded: Request) -> None:
    """The API key goes where it went when recorded, and nowhere else."""
    want, got = _header(recorded, "authorization"), _header(sent, "authorization")
    if want is None:
        assert got is None, "sent an Authorization header the recording has none of"
        return
    assert want == RECORDED_AUTHORIZATION, f"recorded Authorization {want!r} is not scrubbed"
    assert got is not None, "sent no Authorization header"
    assert SENT_AUTHORIZATION.fullmatch(got), "sent Authorization is not 'Bearer dak_<key>'"


def idempotency_key(sent: Request, recorded: Request) -> None:
    """An Idempotency-Key exactly where one was recorded, shaped as the facade makes them."""
    want, got = _header(recorded, "idempotency-key"), _header(sent, "idempotency-key")
    if want is None:
        assert got is None, f"sent Idempotency-Key {got!r}; the recording has none"
        return
    assert RECORDED_IDEMPOTENCY_KEY.fullmatch(want), f"recorded Idempotency-Key {want!r}"
    assert got is not None, "sent no Idempotency-Key"
    assert SENT_IDEMPOTENCY_KEY.fullmatch(got), f"sent Idempotency-Key {got!r} is not denv-<uuid4>"


def _document(request: Request) -> Any:
    raw = request.body or b""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw  # compared byte for byte


def _remaining_s(sent: Any, recorded: Any) -> str | None:
    """What is wrong with a `timeout_s` that is a deadline's remainder, if anything."""
    if isinstance(sent, bool) or not isinstance(sent, int | float):
        return f"timeout_s {sent!r} is not a number"
    limit = math.ceil(recorded) if isinstance(recorded, int | float) else None
    if limit is None or not 0 < sent <= limit:
        return f"timeout_s {sent!r} is not in (0, {limit}] (recorded {recorded!r})"
    return None


def json_body(sent: Request, recorded: Request) -> None:
    """The same body (as JSON: key order and spacing aside), volatile fields checked for shape."""
    got, want = _document(sent), _document(recorded)
    if want is not None:
        sent_type, recorded_type = _header(sent, "content-type"), _header(recorded, "content-type")
        assert sent_type == recorded_type, f"content-type {sent_type!r} != {recorded_type!r}"
    both = isinstance(got, dict) and isinstance(want, dict)
    if both and _WAIT_PATH.fullmatch(sent.path) and "timeout_s" in got and "timeout_s" in want:
        problem = _remaining_s(got["timeout_s"], want["timeout_s"])
        assert problem is None, problem
        got, want = {**got, "timeout_s": "<remaining>"}, {**want, "timeout_s": "<remaining>"}
    if got == want:
        return
    if isinstance(got, dict) and isinstance(want, dict):
        missing = object()
        changed = sorted(
            k for k in got.keys() | want.keys() if got.get(k, missing) != want.get(k, missing)
        )
        raise AssertionError(f"body differs in {changed}: sent {got!r}, recorded {want!r}")
    raise AssertionError(f"body differs: sent {got!r}, recorded {want!r}")


MATCH_ON = [
    "method",
    "scheme",
    "host",
    "port",
    "path",
    "query",
    "json_body",
    "authorization",
    "idempotency_key",
]
REPLAY = vcr.VCR(
    cassette_library_dir=str(CASSETTES),
    record_mode="none",
    match_on=MATCH_ON,  # each recorded answer plays once (vcr's default)
)
REPLAY.register_matcher("json_body", json_body)
REPLAY.register_matcher("authorization", authorization)
REPLAY.register_matcher("idempotency_key", idempotency_key)


@dataclass
class Replayed:
    """What went over the (replayed) wire: each request sent, paired with the one it matched."""

    cassette: Cassette
    sent: list[Request] = field(default_factory=list)
    matched: list[Request] = field(default_factory=list)
    unmatched: list[Request] = field(default_factory=list)

    def uris(self) -> list[str]:
        return [request.uri for request in self.sent]


def _other_clients_lease(request: Request) -> bool:
    """A lease call seen in a replay: the replayed clients are detached (they hold no lease),
    so it is another client's renewal, on its own thread and timer (pytest runs e2e clients
    in the same process, and vcrpy's stubs see every httpx request while a cassette plays)."""
    return "/v1/leases" in urlsplit(request.uri).path


def _watch(cassette: Cassette, replayed: Replayed) -> None:
    """Note each request the client sends; vcrpy's httpx stub asks these two methods."""
    can_play, play = cassette.can_play_response_for, cassette.play_response
    # A fork readies its children on threads: one request at a time through the counters.
    lock = threading.Lock()

    def can_play_response_for(request: Request) -> bool:
        with lock:
            found = bool(can_play(request))
            if not found and not _other_clients_lease(request):
                replayed.unmatched.append(request)
            return found

    def play_response(request: Request) -> Any:
        with lock:
            before = dict(cassette.play_counts)
            response = play(request)
            (index,) = [i for i, n in cassette.play_counts.items() if n != before.get(i, 0)]
            replayed.sent.append(request)
            replayed.matched.append(cassette.requests[index])
            return response

    cassette.can_play_response_for = can_play_response_for
    cassette.play_response = play_response


def _check_idempotency_keys(replayed: Replayed) -> None:
    """One recorded key per sent key: a retry reuses its key, two creates never share one."""
    pairs = {
        (_header(recorded, "idempotency-key"), _header(sent, "idempotency-key"))
        for sent, recorded in zip(replayed.sent, replayed.matched, strict=True)
        if _header(recorded, "idempotency-key") is not None
    }
    assert len({r for r, _ in pairs}) == len({s for _, s in pairs}) == len(pairs), (
        f"Idempotency-Keys sent do not pair one to one with the recorded ones: {sorted(pairs)}"
    )


@contextmanager
def replay(filename: str) -> Iterator[Replayed]:
    """Play tests/cassettes/`filename` to the code run inside; check all of it was asked for."""
    if not (CASSETTES / filename).exists():
        pytest.fail(f"cassette {filename} is missing: record it with `make cassettes` (Docker)")
    with REPLAY.use_cassette(filename) as cassette:
        replayed = Replayed(cassette)
        _watch(cassette, replayed)
        yield replayed
    lost = "; ".join(f"{r.method} {r.uri} {(r.body or b'').decode()}" for r in replayed.unmatched)
    assert not lost, f"{filename}: requests no recording matched: {lost}"
    assert cassette.all_played, f"{filename}: the client skipped requests the recording holds"
    assert cassette.play_count == len(cassette)
    _check_idempotency_keys(replayed)
