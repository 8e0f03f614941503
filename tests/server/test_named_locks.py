"""Per-env and per-layer locks last while in use, not for the server's life.

Found by the long soak (bench/soak_long.py): the server kept one lock per env it ever ran in
three maps (the lifecycle's, the Docker node's BootControl, the layer transfers'), about
190 bytes each, so a server running for weeks of training grew by them without end.
"""

from __future__ import annotations

import threading

from denv.server.docker.boot import BootControl
from denv.server.locks import NamedLocks


def test_a_name_s_lock_goes_once_no_one_holds_it() -> None:
    locks = NamedLocks()
    for i in range(5000):
        with locks(f"env_{i:026d}"):
            assert len(locks) == 1
    assert len(locks) == 0
    control = BootControl()  # the Docker node's: each env's boot and teardown take it
    for i in range(1000):
        with control.lock(f"env_{i:026d}"):
            pass
    assert len(control._locks) == 0


def test_callers_of_a_name_in_use_share_its_lock() -> None:
    locks = NamedLocks()
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with locks("env_a"):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(10)
    second = locks("env_a")
    assert not second.acquire(blocking=False)  # the same lock, held by the other thread
    assert locks("env_b").acquire(blocking=False)  # another name: another lock
    release.set()
    thread.join()
    assert second.acquire(timeout=5)  # kept alive by this caller's reference
    second.release()
