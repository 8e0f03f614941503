"""The fork demo (`make demo`): branch a live OpenEnv episode eight ways.

It runs the echo environment on denv through the real OpenEnv client,
steps a prefix, forks eight branches from that exact state, steps each
branch differently, prints their states side by side, and compares how long
the fork took with replaying the prefix in a fresh environment. The forks are
`DenvProvider()`'s default, live: each branch is a copy of the running server.
`--volume` forks from snapshots of `/work` onto booted spares instead, `--cold`
onto fresh boots. Everything it starts is deleted at the end, also when it fails.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from denv.openenv import DenvProvider, fork_clients
from openenv.core import GenericEnvClient

IMAGE = "denv-echo-env:latest"


def say(text: str) -> None:
    print(text, flush=True)


def show_pool(pool: Any) -> None:
    """One progress line each time the warm pool's count changes."""
    say(f"   spares: {pool.ready}/{pool.target} ready, {pool.booting} booting")


def start(image: str, warm: int = 0, fork: Literal["auto", "volume"] = "auto") -> Any:
    provider = DenvProvider(warm=warm, fork=fork)
    base_url = provider.start_container(image)
    try:
        provider.wait_for_ready(base_url)
    except BaseException:
        provider.stop_container()
        raise
    return GenericEnvClient(base_url=base_url, provider=provider).sync()


def replay(image: str, prefix: int) -> float:
    """Seconds for a fresh env to reach the root's state by replaying the prefix."""
    started = time.perf_counter()
    client = start(image)
    try:
        client.reset()
        for i in range(prefix):
            client.step({"message": f"prefix {i}"})
        return time.perf_counter() - started
    finally:
        client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default=IMAGE)
    parser.add_argument("--prefix", type=int, default=200, help="steps before forking")
    parser.add_argument("--branches", type=int, default=8)
    parser.add_argument(
        "--volume", action="store_true", help="volume forks onto booted spares, not live ones"
    )
    parser.add_argument("--cold", action="store_true", help="volume forks without spares")
    parser.add_argument(
        "--warm-timeout", type=float, default=600.0, help="seconds to wait for the spares"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    fork: Literal["auto", "volume"] = "volume" if args.volume or args.cold else "auto"
    warm = args.branches if args.volume and not args.cold else 0
    # The baseline first, on a quiet machine: booted spares refilling in the
    # background would slow it down and flatter the fork.
    say(f"0. baseline: a fresh env replaying a prefix of {args.prefix} steps ...")
    replay_s = replay(args.image, args.prefix)
    say(f"   {replay_s:.2f}s to reach step {args.prefix} by replay")

    how_forks = {
        "auto": ", forking live (each branch a copy of the running server)",
        "volume": f", with {warm} booted spares for forks" if warm else ", forking cold",
    }[fork]
    say(f"1. starting {args.image} on denv{how_forks} (egress denied, through ingress) ...")
    t = time.perf_counter()
    root = start(args.image, warm=warm, fork=fork)
    branches: list[Any] = []
    try:
        say(f"   ready in {time.perf_counter() - t:.1f}s at {root.async_client.base_url}")
        root.reset()
        t = time.perf_counter()
        for i in range(args.prefix):
            root.step({"message": f"prefix {i}"})
        step_ms = (time.perf_counter() - t) / max(args.prefix, 1) * 1000
        say(f"2. stepped a prefix of {args.prefix} steps ({step_ms:.1f} ms a step)")
        root_state = root.state()

        if warm:
            # Timing a fork while its spares still boot would time boots, not a warm fork.
            say(f"   waiting for {warm} booted spares (they boot in the background) ...")
            t = time.perf_counter()
            pool = root.provider.wait_warm(timeout_s=args.warm_timeout, progress=show_pool)
            say(f"   {pool.ready}/{pool.target} spares ready after {time.perf_counter() - t:.1f}s")

        say(f"3. forking {args.branches} branches from step {args.prefix} ...")
        t = time.perf_counter()
        branches = fork_clients(root, args.branches)
        fork_s = time.perf_counter() - t
        starts = [branch.provider.start for branch in branches]
        how = ", ".join(
            f"{starts.count(kind)} {kind} ({what})"
            for kind, what in [
                ("live", "copies of the running server"),
                ("warm", "from spares"),
                ("cold", "booted"),
            ]
            if kind in starts
        )
        say(f"   {args.branches} ready branches in {fork_s:.2f}s: {how}")

        def walk(n_client: tuple[int, Any]) -> tuple[Any, Any]:
            n, client = n_client
            result = None
            for i in range(n + 1):
                result = client.step({"message": f"branch {n} says {'!' * (i + 1)}"})
            return client.state(), result

        with ThreadPoolExecutor(max_workers=args.branches) as pool:
            outcomes = list(pool.map(walk, enumerate(branches)))

        say("4. each branch stepped differently (branch n steps n+1 times):")
        say(f"   {'':8} {'step_count':>10}  {'episode_id':<38} last echo")
        say(f"   {'root':8} {root_state['step_count']:>10}  {root_state['episode_id']!s:<38} -")
        for n, (state, result) in enumerate(outcomes):
            echoed = (result.observation or {}).get("echoed_message", "") if result else ""
            name = f"branch {n}"
            say(f"   {name:8} {state['step_count']:>10}  {state['episode_id']!s:<38} {echoed}")
        unchanged = root.state() == root_state
        say(f"   root unchanged by its branches: {'yes' if unchanged else 'NO'}")

        say("5. fork against replay:")
        say(
            f"   fork: {args.branches} branches in {fork_s:.2f}s ({how}); "
            f"replay: {replay_s:.2f}s for ONE branch, so about {replay_s * args.branches:.1f}s "
            f"for {args.branches} one after another"
        )
        return 0 if unchanged else 1
    finally:
        say("6. cleaning up ...")
        for client in [*branches, root]:
            client.close()
        say("   done: every env this demo started is deleted")


if __name__ == "__main__":
    sys.exit(main())
