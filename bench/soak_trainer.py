"""One GRPO-shaped trainer of the long soak (bench/soak_long.py), run as its own process so
that the soak can SIGKILL it in the middle of a round.

    python bench/soak_trainer.py URL KEY IMAGE GROUP STEPS MESSAGE_BYTES

It reads ``go N`` lines on stdin and runs round N for each: start the group's prompt env
(a live create, which the server answers with a copy of its zygote once it has one), step
it, live-fork it into GROUP children, step every child STEPS times at once (each on its own
WebSocket session through the server's ingress), then delete the group. ``go N hold`` runs
the round up to its delete and waits there (for a line, or the end of stdin): the soak
sends it for a round whose trainer it will SIGKILL, so that the kill, wherever it lands in
the round, finds every env the round made still alive, and not already being deleted.
Every env is held by the lease of the trainer's one ``Denv``: when the soak kills the
trainer, only the lease can clean up. It prints one JSON line per event, flushed at once:

    {"round": N, "event": "envs", "ids": [...]}         as soon as envs exist
    {"round": N, "event": "done", "steps": [s, ...], "seconds": s}
    {"round": N, "event": "retry", "error": "...", "stage": "fork"}   then tried again
    {"round": N, "event": "error", "error": "...", "stage": "fork"}   its last try failed

Each step sends MESSAGE_BYTES of text; the echo env saves its episode (the last message) to
/work after every step, so each env and each fork version holds about that much disk.

The sessions speak OpenEnv's WebSocket protocol (``{"type": "step", "data": ...}``) with
the ``websockets`` package directly: importing OpenEnv's client imports its server side
(gradio), 8 s of CPU per process, and the soak starts a new trainer after every kill.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from websockets.sync.client import ClientConnection, connect

from denv import Denv, Env

STEP_TIMEOUT_S = 60.0
ATTEMPTS = 6  # tries of one round, 2, 4, 8, 16 and 20 s apart (a server restart)


def say(**event: Any) -> None:
    print(json.dumps(event), flush=True)


class Session:
    """One OpenEnv WebSocket session on an env (its ingress URL)."""

    def __init__(self, ws: ClientConnection, message_bytes: int) -> None:
        self.ws = ws
        self.pad = "x" * message_bytes

    def send(self, message: dict[str, Any]) -> dict[str, Any]:
        self.ws.send(json.dumps(message))
        answer: dict[str, Any] = json.loads(self.ws.recv(timeout=STEP_TIMEOUT_S))
        if answer.get("type") == "error":
            raise RuntimeError(f"the env answered an error: {answer.get('data')}")
        return answer

    def step(self) -> float:
        """One step; its seconds, from send to answer. The answer must echo the message."""
        tag = uuid.uuid4().hex
        t0 = time.perf_counter()
        answer = self.send({"type": "step", "data": {"message": tag + self.pad}})
        took = time.perf_counter() - t0
        echoed = answer["data"]["observation"]["echoed_message"]
        if not echoed.startswith(tag):
            raise RuntimeError(f"a step's answer echoed another message ({echoed[:32]!r})")
        return took


def steps(env: Env, count: int, message_bytes: int, reset: bool = False) -> list[float]:
    url = env.endpoints[0].url.replace("http", "ws", 1) + "/ws"
    with connect(url, open_timeout=STEP_TIMEOUT_S, max_size=None, proxy=None) as ws:
        session = Session(ws, message_bytes)
        if reset:
            session.send({"type": "reset", "data": {}})
        took = [session.step() for _ in range(count)]
        ws.send(json.dumps({"type": "close"}))
        return took


class Round:
    """Round ``n`` of one trainer: its envs, and those a failed attempt could not delete."""

    def __init__(
        self, denv: Denv, n: int, image: str, group: int, count: int, size: int, hold: bool
    ) -> None:
        self.denv, self.n, self.image, self.hold = denv, n, image, hold
        self.group, self.count, self.size = group, count, size
        self.made: list[str] = []
        self.stage = "start"

    def run(self) -> None:
        t0 = time.perf_counter()
        self.stage = "start"
        root = self.denv.create_sandbox(self.image, live=True)
        self.made.append(root.id)
        say(round=self.n, event="envs", ids=[root.id])
        if root.status != "healthy":
            raise RuntimeError(f"the group's env {root.id} is {root.status}: {root.error}")
        self.stage = "prompt"
        took = steps(root, 1, self.size, reset=True)  # the prompt: the group's prefix
        self.stage = "fork"
        children = self.denv.fork(root.id, self.group, kind="live").envs
        self.made += [e.id for e in children]
        say(round=self.n, event="envs", ids=[e.id for e in children])
        bad = [f"{e.id} {e.status}" for e in children if e.status != "healthy"]
        if bad:
            raise RuntimeError(f"fork children not healthy: {bad}")
        self.stage = "step"
        with ThreadPoolExecutor(self.group) as pool:
            for got in pool.map(lambda e: steps(e, self.count, self.size), children):
                took += got
        self.stage = "close"
        if self.hold:  # the soak kills this trainer: it must not delete first
            sys.stdin.readline()
        self.delete()
        say(round=self.n, event="done", steps=took, seconds=time.perf_counter() - t0)

    def delete(self) -> None:
        """Delete the round's envs (those gone already count as deleted)."""
        with ThreadPoolExecutor(max(1, min(len(self.made), self.group))) as pool:
            list(pool.map(self.denv.delete_env, self.made))
        self.made = []


def one_round(
    denv: Denv, n: int, image: str, group: int, count: int, size: int, hold: bool = False
) -> None:
    """Round ``n``; a failed attempt (the server restarting, say) is said, cleaned up and
    tried again, up to ``ATTEMPTS`` times. ``hold``: wait before the delete (see above)."""
    r = Round(denv, n, image, group, count, size, hold)
    for attempt in range(1, ATTEMPTS + 1):
        try:
            r.run()
            return
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"[:500]
            last = attempt == ATTEMPTS
            say(round=n, event="error" if last else "retry", stage=r.stage, error=error)
            if last:
                break
            time.sleep(min(2.0**attempt, 20.0))
            with contextlib.suppress(Exception):  # else tried again after the next attempt
                r.delete()
    with contextlib.suppress(Exception):  # else held by the lease, closed at the exit
        r.delete()


def main() -> None:
    url, key, image, group, count, message_bytes = sys.argv[1:7]
    with Denv(url, key) as denv:
        say(event="ready")
        for line in sys.stdin:
            verb, *args = line.split()
            if verb != "go":
                break
            hold = args[1:] == ["hold"]
            one_round(denv, int(args[0]), image, int(group), int(count), int(message_bytes), hold)


if __name__ == "__main__":
    main()
