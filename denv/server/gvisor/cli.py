"""``denv gvisor``: put gVisor's runtime on this machine's Docker Engine (``install``) or say
whether ``denv serve --isolation gvisor`` can start (``check``)."""

from __future__ import annotations

import argparse
import sys

import docker

from denv.server.gvisor import runtime


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        choices=("install", "check"),
        help=f"install: add the runtime {runtime.RUNTIME} to the Docker Engine (as root; needs "
        f"apt-get install {runtime.PACKAGE}); check: say whether it is there",
    )


def engine_runtimes() -> list[str]:
    """The runtimes the local Docker Engine has."""
    client = docker.from_env(timeout=30)
    try:
        return list(client.info().get("Runtimes", {}))
    finally:
        client.close()


def main(args: argparse.Namespace) -> int:
    try:
        if args.action == "install":
            runtime.install(engine_runtimes)
        else:
            runtime.check(engine_runtimes())
            print(f"ok: the Docker Engine has {runtime.RUNTIME}; runsc is {runtime.runsc()}")
    except (runtime.GvisorUnavailable, OSError) as exc:
        print(f"denv gvisor {args.action}: {exc}", file=sys.stderr)
        return 1
    except docker.errors.DockerException as exc:
        print(
            f"denv gvisor {args.action}: the Docker Engine is not reachable ({exc})",
            file=sys.stderr,
        )
        return 1
    return 0
