"""`denv envs`, `denv logs ENV`, `denv rm ENV... | --all | --label K=V` and `denv fork ENV -n N`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from rich.markup import escape
from rich.table import Table

from ._cli_common import (
    Command,
    Output,
    add_label_option,
    age,
    describe,
    id_problem,
    labels_text,
    status_text,
)
from .client._client import Denv
from .client.errors import APIStatusError
from .client.types import Env, EnvStatus, WaitFor


def env_table(envs: Sequence[Env], title: str | None = None) -> Table:
    """Envs as rows: id, status, start (warm/cold), version, parent, image, age, labels."""
    table = Table(title=title, title_justify="left", box=None, header_style="bold")
    for name in ("ENV", "STATUS", "START", "VERSION", "PARENT", "IMAGE", "AGE", "LABELS"):
        table.add_column(name, no_wrap=name in {"ENV", "VERSION", "PARENT"})
    for env in envs:
        agent = next((s for s in env.services if s.name == env.agent_service), None)
        image = env.project or (agent.image if agent else "")
        why = f" ({env.deletion.reason.value})" if env.deletion else ""  # e.g. lease_expired
        table.add_row(
            env.id,
            status_text(env.status) + why,
            env.start.value,
            env.version_id,
            env.parent_id or "-",
            escape(image),
            age(env.created_at),
            escape(labels_text(env.labels)),
        )
    return table


# -- denv envs


def _add_envs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--all", action="store_true", help="also list deleted envs")
    parser.add_argument(
        "--status", choices=[s.value for s in EnvStatus], help="only envs in this status"
    )
    parser.add_argument("--version", dest="version_id", help="only envs of this version")


def _envs(denv: Denv, args: argparse.Namespace, out: Output) -> int:
    problem = args.version_id and id_problem("--version", args.version_id, "version")
    if problem:
        out.error(f"denv envs: {problem}")
        return 2
    envs = list(
        denv.list_envs(status=args.status, version_id=args.version_id, include_deleted=args.all)
    )
    if out.as_json:
        out.json([env.to_dict() for env in envs])
        return 0
    if not envs:
        hint = "" if args.all else " (deleted ones are listed with --all)"
        out.print(f"no envs{hint}")
        return 0
    out.print(env_table(envs))
    return 0


ENVS = Command(_add_envs, _envs)


# -- denv logs ENV


def _add_logs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("env", metavar="ENV", help="the env's id (env_...)")
    parser.add_argument("--service", help="the service (default: the env's agent service)")
    parser.add_argument("--tail", type=int, default=100, help="how many lines (default 100)")


def _logs(denv: Denv, args: argparse.Namespace, out: Output) -> int:
    lines = denv.logs(args.env, service=args.service, tail=args.tail)
    if out.as_json:
        out.json({"env_id": args.env, "service": args.service, "lines": lines})
        return 0
    for line in lines:
        print(line)
    return 0


LOGS = Command(_add_logs, _logs)


# -- denv rm ENV... | --all | --label KEY=VALUE


def _add_rm(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("envs", metavar="ENV", nargs="*", help="the ids of the envs to delete")
    parser.add_argument(
        "--all", action="store_true", help="delete every env of this key on the server"
    )
    add_label_option(
        parser, "delete every env of this key with this label (repeatable: all must match)"
    )


def _rm(denv: Denv, args: argparse.Namespace, out: Output) -> int:
    """Delete the envs named, or every env of this key (--all), or those with the labels."""
    labels = dict(args.label)
    if args.envs and (args.all or labels):
        out.error("denv rm: give env ids, or --all, or --label KEY=VALUE: not both")
        return 2
    if args.all and labels:
        out.error("denv rm: --all deletes every env; --label only those with it: pass one")
        return 2
    if not (args.envs or args.all or labels):
        out.error("denv rm: name the envs to delete, or pass --all or --label KEY=VALUE")
        return 2
    if args.envs:
        return 1 if delete_envs(denv, args.envs, out, "rm") else 0
    chosen = [e.id for e in denv.list_envs() if labels.items() <= e.labels.items()]
    whose = "of this key" if args.all else f"with {labels_text(labels)}"
    if not chosen:
        if out.as_json:
            out.json([])
        else:
            out.print(f"no envs {whose} on {denv.server}: nothing to delete")
        return 0
    failed = delete_envs(denv, chosen, out, "rm")
    if not out.as_json:
        deleted = len(chosen) - len(failed)
        out.print(f"deleted {deleted} {envs_word(deleted)} {whose} on {denv.server}")
    return 1 if failed else 0


def delete_envs(denv: Denv, env_ids: Sequence[str], out: Output, command: str) -> list[str]:
    """Delete each env on its own, saying which went; the ids the server refused.

    One the server refuses does not stop the others (no server at all stops them all, as
    one error)."""
    results: list[dict[str, str]] = []
    for env_id in env_ids:
        try:
            denv.delete_env(env_id)
            results.append({"id": env_id, "status": "deleted"})
        except APIStatusError as exc:
            results.append({"id": env_id, "error": describe(exc)})
    if out.as_json:
        out.json(results)
    else:
        for r in results:
            if "error" in r:
                out.error(f"denv {command}: {r['id']}: {r['error']}")
            else:
                out.print(f"deleted {r['id']}")
    return [r["id"] for r in results if "error" in r]


def envs_word(n: int) -> str:
    return "env" if n == 1 else "envs"


RM = Command(_add_rm, _rm)


# -- denv fork ENV -n N


def _add_fork(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("env", metavar="ENV", help="the env to fork (env_...)")
    parser.add_argument("-n", "--count", type=int, default=1, help="how many children")
    parser.add_argument(
        "--no-wait", action="store_true", help="return at once, before the children are healthy"
    )
    parser.add_argument("--warm", type=int, default=0, help="booted spares to keep per child")


def _fork(denv: Denv, args: argparse.Namespace, out: Output) -> int:
    if args.count < 1:
        out.error(f"denv fork: -n must be 1 or more, not {args.count}")
        return 2
    wait = WaitFor.NONE if args.no_wait else WaitFor.HEALTHY
    fork = denv.fork(args.env, args.count, wait=wait, warm=args.warm)
    if out.as_json:
        out.json(fork.to_dict())
    else:
        out.print(
            f"forked {args.env} at version {fork.version.id} into {len(fork.envs)} "
            f"{'env' if len(fork.envs) == 1 else 'envs'}"
        )
        out.print(env_table(fork.envs))
    failed = [env for env in fork.envs if env.status is EnvStatus.FAILED]
    for env in failed:
        reason = env.error.message if env.error else "no reason given"
        out.error(f"denv fork: {env.id} failed: {reason} (see `denv logs {env.id}`)")
    return 1 if failed else 0


FORK = Command(_add_fork, _fork)
