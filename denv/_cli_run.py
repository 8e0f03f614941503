"""`denv run IMAGE [-- COMMAND...]`: create an env from an image and say where to reach it."""

from __future__ import annotations

import argparse
import re

from rich.markup import escape

from ._cli_common import Command, Output, add_label_option
from .client._client import Denv
from .client._requests import EgressArg
from .client.errors import InvalidRequest
from .client.types import Env, EnvStatus, WaitFor

_DURATION = re.compile(r"^(\d+)([smhd]?)$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_arg(text: str) -> int:
    """`--ttl` (argparse `type`): seconds, or a number with s, m, h or d (`90`, `10m`, `2h`)."""
    found = _DURATION.match(text.strip())
    if not found or int(found.group(1)) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: give seconds (600) or a number with s, m, h or d (10m)"
        )
    return int(found.group(1)) * _UNIT_S[found.group(2)]


def egress_arg(text: str) -> EgressArg:
    """`--egress`: deny, allow, or the allowlist `HOST[:PORT],CIDR,...` (only those)."""
    if text in ("deny", "allow"):
        return "deny" if text == "deny" else "allow"
    entries = [e.strip() for e in text.split(",") if e.strip()]
    if not entries:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an egress: give deny, allow, or HOST[:PORT],CIDR,... to allow "
            "only those"
        )
    return {"allow": entries}


def env_var_arg(text: str) -> tuple[str, str]:
    """`-e NAME=VALUE` (argparse `type`)."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE (e.g. -e LOG_LEVEL=debug)")
    return name, value


def _add_run(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("image", metavar="IMAGE", help="the image to run (on the server's engine)")
    parser.add_argument(
        "cmd",  # not "command": that is the subcommand's name (denv.cli)
        metavar="COMMAND",
        nargs="*",
        help="the command to run instead of the image's (after --: denv run IMAGE -- CMD ARGS)",
    )
    parser.add_argument(
        "-p",
        "--port",
        dest="ports",
        type=int,
        action="append",
        default=[],
        help="a container port to reach through the ingress (repeatable; default: the "
        "image's exposed ports)",
    )
    parser.add_argument(
        "-e",
        "--env",
        dest="env_vars",
        metavar="NAME=VALUE",
        type=env_var_arg,
        action="append",
        default=[],
        help="an environment variable (repeatable)",
    )
    add_label_option(parser, "a label on the env (repeatable); `denv rm --label` deletes by it")
    parser.add_argument(
        "--egress",
        type=egress_arg,
        default="deny",
        help="deny (default: no outward connections), allow, or HOST[:PORT],CIDR,... (only those)",
    )
    parser.add_argument(
        "--ttl",
        dest="ttl_s",
        metavar="DURATION",
        type=duration_arg,
        default=None,
        help="delete the env after this long: seconds, or 10m, 2h, 1d (default: the "
        "server's, an hour)",
    )
    parser.add_argument(
        "--wait",
        choices=[w.value for w in WaitFor],
        default=WaitFor.HEALTHY.value,
        help="answer once the env is healthy (default), running, or at once (none)",
    )
    parser.add_argument(
        "--wait-timeout",
        dest="wait_timeout_s",
        metavar="SECONDS",
        type=float,
        default=None,
        help="how long --wait may take (default: the server's, 120)",
    )
    parser.add_argument(
        "--health-path", default=None, help="the path that answers 200 when ready (/health)"
    )
    parser.add_argument(
        "--live",
        action="store_true",
        help="run the image's uvicorn server under denv's launcher, so `denv fork` can copy "
        "the running process (docs/live-forks.md)",
    )
    parser.add_argument(
        "--pull", action="store_true", help="pull the image when the engine does not have it"
    )
    parser.add_argument(
        "--warm", type=int, default=0, help="booted spares to keep for forks of this env"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the env's id")


def _run(denv: Denv, args: argparse.Namespace, out: Output) -> int:
    try:
        env = _create(denv, args)
    except InvalidRequest as exc:
        if exc.code != "image_not_found":
            raise
        # The server's advice names the API's `pull: true`; here it is --pull, and after a
        # pull that failed, the pull's error is the advice.
        advice = "" if args.pull else ", or pass --pull"
        out.error(f"denv run: {exc.message.replace(', or pass pull: true', advice)}")
        return 1
    if out.as_json:
        out.json(env.to_dict())
    elif args.quiet:
        print(env.id)
    else:
        print_env(out, env, args.image)
    if env.status is EnvStatus.FAILED:
        reason = env.error.message if env.error else "no reason given"
        tail = "".join(f"\n  | {line}" for line in (env.error.log_tail if env.error else []))
        out.error(
            f"denv run: {env.id} failed: {reason}{tail}\n"
            f"(its logs: `denv logs {env.id}`; delete it with `denv rm {env.id}`)"
        )
        return 1
    return 0


def _create(denv: Denv, args: argparse.Namespace) -> Env:
    return denv.create_sandbox(
        args.image,
        ports=args.ports or None,
        env=dict(args.env_vars) or None,
        egress=args.egress,
        command=args.cmd or None,
        labels=dict(args.label) or None,
        ttl_s=args.ttl_s,
        wait=args.wait,
        wait_timeout_s=args.wait_timeout_s,
        health_path=args.health_path,
        pull=args.pull,
        warm=args.warm,
        live=args.live,
    )


def print_env(out: Output, env: Env, image: str) -> None:
    """The env's id and status, then each address it is reached at."""
    out.print(f"{env.id} {env.status.value} ({escape(image)})")
    if not env.endpoints:
        out.print("no ports published: pass --port PORT to reach one through the ingress")
    for endpoint in env.endpoints:
        # The URL holds the env's ingress capability: whoever has it reaches the env.
        where = f"{endpoint.service} port {endpoint.port}"
        out.print(f"{endpoint.via.value}: {endpoint.url}  ({where})")


RUN = Command(_add_run, _run)
