"""One GRPO-shaped trainer of the long soak (bench/soak_long.py), run as its own process so
that the soak can SIGKILL it in the middle of a round.

    python bench/soak_trainer.py URL KEY IMAGE GROUP STEPS MESSAGE_BYTES

It reads ``go N`` lines on stdin and runs round N for each: start the group's prompt env
(a live create, which the server answers with a copy of its zygote once it has one), step
it, live-fork it into GROUP children, step every child STEPS times at once (each on its own
WebSocket session through the server's ingress), then delete the group. Every env is held
by the lease of the trainer's one ``Denv``: when the soak kills the trainer, only the lease
can clean up. It prints one JSON line per event, flushed at once:

    {"round": N, "event": "envs", "ids": [...]}         as soon as envs exist
    {"round": N, "event": "done", "steps": [s, ...], "seconds": s}
    {"round": N, "event": "error", "error": "...", "stage": "fork"}

Each step sends MESSAGE_BYTES of text; the echo env saves its episode (the last message) to
/work after every step, so each env and each fork version holds about that much disk.

The sessions speak OpenEnv's WebSocket protocol (``{"type": "step", "data": ...}``) with
the ``websockets`` package directly: importing OpenEnv's client imports its server side
(gradio), 8 s of CPU per process, and the soak starts a new trainer after every kill.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from websockets.sync.client import connect

from denv import Denv, Env

STEP_TIMEOUT_S = 60.0


def say(**event: Any) -> None:
    print(json.dumps(event), flush=True)


class Session:
    """One OpenEnv WebSocket session on an env (its ingress URL)."""

    def __init__(self, env: Env, message_bytes: int) -> None:
        url = env.endpoints[0].url
        self.ws = connect(
            url.replace("http", "ws", 1) + "/ws",
            open_timeout=STEP_TIMEOUT_S,
            max_size=None,
            proxy=None,
        )
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

    def close(self) -> None:
        try:
            self.ws.send(json.dumps({"type": "close"}))
        finally:
            self.ws.close()


def steps(env: Env, count: int, message_bytes: int, reset: bool = False) -> list[float]:
    session = Session(env, message_bytes)
    try:
        if reset:
            session.send({"type": "reset", "data": {}})
        return [session.step() for _ in range(count)]
    finally:
        session.close()


def one_round(
    denv: Denv, n: int, image: str, group: int, count: int, message_bytes: int
) -> None:
    t0 = time.perf_counter()
    made: list[str] = []
    stage = "start"
    try:
        root = denv.create_sandbox(image, live=True)
        made.append(root.id)
        say(round=n, event="envs", ids=[root.id])
        if root.status != "healthy":
            raise RuntimeError(f"the group's env {root.id} is {root.status}: {root.error}")
        stage = "prompt"
        took = steps(root, 1, message_bytes, reset=True)  # the prompt: the group's prefix
        stage = "fork"
        children = denv.fork(root.id, group, kind="live").envs
        made += [e.id for e in children]
        say(round=n, event="envs", ids=[e.id for e in children])
        bad = [e.id for e in children if e.status != "healthy"]
        if bad:
            raise RuntimeError(f"fork children not healthy: {bad}")
        stage = "step"
        with ThreadPoolExecutor(group) as pool:
            for got in pool.map(lambda e: steps(e, count, message_bytes), children):
                took += got
        stage = "close"
        with ThreadPoolExecutor(group) as pool:
            list(pool.map(denv.delete_env, made))
        say(round=n, event="done", steps=took, seconds=time.perf_counter() - t0)
    except Exception as exc:  # a round that fails says why; its envs go, the trainer goes on
        say(round=n, event="error", stage=stage, error=f"{type(exc).__name__}: {exc}"[:500])
        for env_id in made:
            try:
                denv.delete_env(env_id)
            except Exception:
                pass  # the server is away (a restart): its lease reaps it if we cannot


def main() -> None:
    url, key, image, group, count, message_bytes = sys.argv[1:7]
    with Denv(url, key) as denv:
        say(event="ready")
        for line in sys.stdin:
            verb, _, n = line.partition(" ")
            if verb != "go":
                break
            one_round(denv, int(n), image, int(group), int(count), int(message_bytes))


if __name__ == "__main__":
    main()
