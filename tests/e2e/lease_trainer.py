"""A stand-in trainer for tests/e2e/test_leases.py, run as its own process.

    python lease_trainer.py URL KEY ROOT_ID kill    # 32 live forks and a warm env, then waits
    python lease_trainer.py URL KEY ROOT_ID pause   # 2 live forks on a 5 s lease; after a line
                                                    # on stdin, forks again and says what it got

Each mode prints one JSON line once its envs are ready: {"envs": [...], "lease": "lse_..."}.
It imports the typed client only (`denv`): the provider's import of OpenEnv takes ~15 s of
CPU, and its envs are held by the same lease of its `Denv`.
"""

from __future__ import annotations

import json
import sys
import time

from denv import Denv, DenvError

IMAGE = "denv-echo-env:latest"


def kill_mode(denv: Denv, root: str) -> None:
    # An env that asks for a warm spare: the spare (no record of its own) must go too. It
    # boots while the live forks are made; the trainer says it is ready once both run.
    warm = denv.create_sandbox(IMAGE, warm=1, warm_fork=True, wait="none")
    envs = [e.id for _ in range(2) for e in denv.fork(root, 16, kind="live").envs]
    deadline = time.monotonic() + 180
    while denv.warm_pool(warm.id).state != "ready" and time.monotonic() < deadline:
        time.sleep(0.2)
    print(json.dumps({"envs": envs, "warm": warm.id, "lease": denv.lease_id}), flush=True)
    time.sleep(3600)


def pause_mode(denv: Denv, root: str) -> None:
    envs = [e.id for e in denv.fork(root, 2, kind="live").envs]
    print(json.dumps({"envs": envs, "lease": denv.lease_id}), flush=True)
    sys.stdin.readline()  # the test paused this process past its lease, then resumed it
    try:
        denv.fork(root, 1, kind="live")
        print(json.dumps({"error": None}), flush=True)
    except DenvError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)


def main() -> None:
    url, key, root, mode = sys.argv[1:5]
    if mode == "kill":
        kill_mode(Denv(url, key), root)
    else:
        with Denv(url, key, lease_timeout_s=5) as denv:
            pause_mode(denv, root)


if __name__ == "__main__":
    main()
