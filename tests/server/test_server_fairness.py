"""The server's parts for issue 17's fairness, JSON bounds and TLS options, without Docker.

End-to-end checks through a real server are in tests/reliability (test_fairness.py,
test_json_bombs.py, test_flood.py, test_tls.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from pathlib import Path

import pytest

from denv.server.api import tls
from denv.server.api.json_limits import check_json
from denv.server.config import (
    MAX_JSON_DEPTH,
    MAX_JSON_NUMBER_CHARS,
    MAX_JSON_STRING_CHARS,
    MAX_JSON_VALUES,
    ServerConfig,
)
from denv.server.docker import engine_queue
from denv.server.docker.engine_queue import EngineQueue
from denv.server.errors import ApiError
from denv.server.lifecycle import fairness
from denv.server.lifecycle.fairness import Fairness


def test_every_body_the_contract_allows_passes_the_json_bounds() -> None:
    largest = {
        "image": "x" * 512,
        "command": ["y" * 100] * 256,
        "env": {f"V{i}": "z" * 100 for i in range(256)},
        "labels": {f"l{i}": "v" for i in range(32)},
        "ports": list(range(1, 17)),
        "volumes": [f"/v{i}" for i in range(8)],
    }
    assert check_json(json.dumps(largest).encode()) is None
    compose = {"compose": "a: b\n" * (MAX_JSON_STRING_CHARS // 5), "labels": {}}
    assert check_json(json.dumps(compose).encode()) is None
    assert check_json(b"") is None


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b"[" * (MAX_JSON_DEPTH + 1), f"nested deeper than {MAX_JSON_DEPTH}"),
        (b'{"a":' * (MAX_JSON_DEPTH + 1), f"nested deeper than {MAX_JSON_DEPTH}"),
        (b"[" + b"[]," * MAX_JSON_VALUES + b"[]]", f"more than {MAX_JSON_VALUES} JSON values"),
        (b'{"n": ' + b"9" * 5000 + b"}", f"longer than {MAX_JSON_NUMBER_CHARS} characters"),
        (
            json.dumps({"compose": "x" * (MAX_JSON_STRING_CHARS + 1)}).encode(),
            f"longer than {MAX_JSON_STRING_CHARS} characters",
        ),
        (b'{"image": "abc', "not terminated"),
    ],
)
def test_json_bombs_are_named(body: bytes, named: str) -> None:
    problem = check_json(body)
    assert problem is not None and named in problem, problem


def test_escapes_count_as_the_characters_they_stand_for() -> None:
    # 6 bytes per character on the wire, one character once decoded: within the bound.
    body = json.dumps({"compose": "\x01" * 100000}).encode()
    assert len(body) > MAX_JSON_STRING_CHARS
    assert check_json(body) is None


def config(tmp_path: Path, **caps: int) -> ServerConfig:
    return ServerConfig(state_dir=tmp_path, api_key="dak_x", **caps)  # type: ignore[arg-type]


def test_a_cap_is_per_key_and_says_when_to_come_back(tmp_path: Path) -> None:
    fair = Fairness(config(tmp_path, max_waits_per_key=2))
    fair.acquire("a", "waits")
    fair.acquire("a", "waits")
    with pytest.raises(ApiError) as caught:
        fair.acquire("a", "waits")
    err = caught.value
    assert (err.status, err.code) == (429, "rate_limited")
    assert "--max-waits-per-key" in err.message and "retry after" in err.message
    assert err.details is not None and err.details["retry_after_s"] >= 1
    fair.acquire("b", "waits")  # another key is not held back
    fair.release("a", "waits")
    fair.acquire("a", "waits")


def test_waits_of_all_keys_together_are_capped_so_they_never_take_every_thread(
    tmp_path: Path,
) -> None:
    fair = Fairness(config(tmp_path, max_waits_per_key=2, max_waits=3))
    fair.acquire("a", "waits")
    fair.acquire("a", "waits")
    fair.acquire("b", "waits")
    with pytest.raises(ApiError) as caught:
        fair.acquire("c", "waits")  # under its own cap, over the server's
    err = caught.value
    assert (err.status, err.code) == (429, "rate_limited")
    assert "--max-waits)" in err.message and "all API keys" in err.message
    assert err.details == {"limit": "server_waits", "max": 3, "retry_after_s": 1}
    fair.acquire("c", "creates")  # other kinds are not held back
    fair.release("a", "waits")
    fair.acquire("c", "waits")
    assert Fairness(config(tmp_path, max_waits=0)).try_acquire("a", "waits")  # 0: no cap


def test_zero_is_no_cap(tmp_path: Path) -> None:
    fair = Fairness(config(tmp_path, max_creates_per_key=0))
    for _ in range(1000):
        fair.acquire("a", "creates")
    assert fair.in_use("a", "creates") == 1000


def test_a_slot_is_held_until_the_work_ends_not_until_the_caller_leaves(tmp_path: Path) -> None:
    fair = Fairness(config(tmp_path, max_waits_per_key=1))
    release = threading.Event()

    async def main() -> None:
        task = asyncio.create_task(fair.run("a", "waits", release.wait, 10))
        await asyncio.sleep(0.1)
        task.cancel()  # the HTTP client disconnected: its thread still waits
        with pytest.raises(asyncio.CancelledError):
            await task
        assert fair.in_use("a", "waits") == 1
        with pytest.raises(ApiError):
            fair.acquire("a", "waits")
        release.set()
        for _ in range(100):
            if not fair.in_use("a", "waits"):
                break
            await asyncio.sleep(0.02)
        assert fair.in_use("a", "waits") == 0

    asyncio.run(main())


def serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    tls.add_arguments(parser)
    fairness.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_loopback_needs_no_tls(host: str) -> None:
    assert tls.check(serve_args("--host", host)) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "myhost.example"])
def test_beyond_loopback_needs_tls_or_insecure(host: str) -> None:
    problem = tls.check(serve_args("--host", host))
    assert problem is not None and "--tls-cert" in problem and "--insecure" in problem
    assert tls.check(serve_args("--host", host, "--insecure")) is None


def test_tls_options_go_together_and_must_load(tmp_path: Path) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("not a certificate")
    problem = tls.check(serve_args("--tls-cert", str(cert)))
    assert problem is not None and "go together" in problem
    problem = tls.check(serve_args("--tls-cert", str(cert), "--tls-key", str(cert)))
    assert problem is not None and "cannot load --tls-cert" in problem


def test_negative_caps_are_refused() -> None:
    with pytest.raises(ValueError, match="--max-waits-per-key"):
        fairness.config_fields(serve_args("--max-waits-per-key", "-1"))
    fields = fairness.config_fields(serve_args("--ingress-read-timeout", "0"))
    assert fields["ingress_read_timeout_s"] == 0
    with pytest.raises(ValueError, match="--ws-idle-timeout"):
        fairness.config_fields(serve_args("--ws-idle-timeout", "-1"))
    with pytest.raises(ValueError, match="--max-leases-per-key"):
        fairness.config_fields(serve_args("--max-leases-per-key", "-1"))
    fields = fairness.config_fields(serve_args("--ws-idle-timeout", "0"))
    assert fields["ws_idle_timeout_s"] == 0 and fields["max_leases_per_key"] == 1024


def test_the_engine_queue_serves_the_key_with_fewer_calls_in_flight_first() -> None:
    queue = EngineQueue(1)  # one slot, and one more for a key with nothing in flight
    order: list[str] = []
    release = {name: threading.Event() for name in ("a1", "a2", "b1", "b2")}

    def call(name: str) -> None:
        with queue.slot(name[0]):
            order.append(name)
            release[name].wait(10)

    def queued(n: int, ran: list[str]) -> None:  # until n calls wait and ``ran`` have run
        for _ in range(500):
            with queue._cond:
                if len(queue._waiting) == n and order == ran:
                    return
            time.sleep(0.01)
        raise AssertionError(f"not {n} waiting after {ran}: {order}")

    threads = {name: threading.Thread(target=call, args=(name,)) for name in release}
    threads["a1"].start()
    queued(0, ["a1"])
    threads["b1"].start()  # the slot is taken, but b has nothing in flight: it goes at once
    queued(0, ["a1", "b1"])
    threads["b2"].start()  # b has a call in flight now: it waits
    queued(1, ["a1", "b1"])
    threads["a2"].start()
    queued(2, ["a1", "b1"])
    release["a1"].set()  # a has nothing in flight: its call goes before b's older one
    queued(1, ["a1", "b1", "a2"])
    release["b1"].set()
    queued(0, ["a1", "b1", "a2", "b2"])
    for event in release.values():
        event.set()
    for t in threads.values():
        t.join(10)
    assert queue.in_flight("a") == queue.in_flight("b") == 0


def _call_in_thread(queue: EngineQueue, owner: str, ran: list[str], name: str) -> threading.Thread:
    def call() -> None:
        with queue.slot(owner):
            ran.append(name)

    thread = threading.Thread(target=call)
    thread.start()
    return thread


def _settle(ran: list[str], want: list[str]) -> None:
    for _ in range(300):
        if ran == want:
            return
        time.sleep(0.01)
    raise AssertionError(f"ran {ran}, expected {want}")


def test_a_key_making_more_envs_yields_the_engine_to_a_lighter_keys_boot() -> None:
    queue = EngineQueue(2)
    ran: list[str] = []
    with queue.active("a"), queue.active("a"):  # a makes two envs at once
        with queue.active("b"):  # b makes one: a starts no new call meanwhile
            waiting = _call_in_thread(queue, "a", ran, "a1")
            time.sleep(0.2)
            assert ran == [], "a key making more envs took a slot during a lighter key's boot"
            with queue.slot("b"):  # b's own calls go at once
                ran.append("b1")
            assert ran == ["b1"]
        _settle(ran, ["b1", "a1"])  # b's boot ended: a goes on
        waiting.join(5)
        # work of no key (a spare) is never yielded to; nor is a key making as many envs
        with queue.active(""), queue.active("c"), queue.active("c"):
            _call_in_thread(queue, "a", ran, "a2").join(5)
    assert ran == ["b1", "a1", "a2"]
    assert queue.in_flight("a") == queue.in_flight("b") == 0


def test_a_call_that_waited_long_for_its_own_keys_calls_still_yields(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A flooding key's calls wait for its own calls' slots, often longer than the yield's
    bound: the bound counts from the call's first yield, so they still yield to a lighter
    key's boot that begins after they joined the queue."""
    monkeypatch.setattr(engine_queue, "YIELD_MAX_S", 0.3)
    queue = EngineQueue(1)
    ran: list[str] = []
    release = threading.Event()

    def first() -> None:
        with queue.slot("a"):
            ran.append("a0")
            release.wait(10)

    with queue.active("a"), queue.active("a"):
        holder = threading.Thread(target=first)
        holder.start()
        _settle(ran, ["a0"])
        waiting = _call_in_thread(queue, "a", ran, "a1")  # waits for a's slot
        time.sleep(0.5)  # longer than the yield's bound, all of it waiting for a slot
        with queue.active("b"):  # b begins to make an env
            release.set()  # a's slot is free, but b is lighter: a1 yields
            time.sleep(0.15)
            assert ran == ["a0"], "a call that had waited for its own key's slot did not yield"
            with queue.slot("b"):
                ran.append("b1")
        _settle(ran, ["a0", "b1", "a1"])
        holder.join(5)
        waiting.join(5)
    assert queue.in_flight("a") == queue.in_flight("b") == 0


def test_a_key_making_more_envs_has_one_call_in_flight_while_a_lighter_key_is_about() -> None:
    """Alone, a key making many envs has every slot; while a key making fewer has worked on
    an env within ``RECENT_S`` (it is between two creates, say), one call at a time: the
    lighter key's next boot then overlaps at most one of its calls."""
    queue = EngineQueue(2)
    ran: list[str] = []
    release = threading.Event()

    def call(name: str) -> None:
        with queue.slot("a"):
            ran.append(name)
            release.wait(10)

    with queue.active("a"), queue.active("a"):
        alone = [threading.Thread(target=call, args=(f"a{i}",)) for i in (1, 2)]
        for t in alone:
            t.start()
        _settle(sorted(ran), ["a1", "a2"])  # alone: both at once
        release.set()
        for t in alone:
            t.join(5)
        release.clear()
        with queue.active("b"):
            pass  # b made an env a moment ago, and may make the next
        shared = [threading.Thread(target=call, args=(f"a{i}",)) for i in (3, 4)]
        for t in shared:
            t.start()
        time.sleep(0.2)
        assert len(ran) == 3, f"two calls of the heavier key in flight: {ran}"
        release.set()  # the first ends: the second goes
        for t in shared:
            t.join(5)
        assert len(ran) == 4
    assert queue.in_flight("a") == 0


def test_a_key_yields_for_a_bounded_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream of lighter keys' boots cannot starve a busy key: its call goes after
    ``YIELD_MAX_S`` whatever runs."""
    monkeypatch.setattr(engine_queue, "YIELD_MAX_S", 0.3)
    queue = EngineQueue(2)
    ran: list[str] = []
    with queue.active("a"), queue.active("a"), queue.active("b"):
        started = time.monotonic()
        _call_in_thread(queue, "a", ran, "a1").join(5)
        waited = time.monotonic() - started
    assert ran == ["a1"]
    assert 0.3 <= waited < 3, waited
