"""`denv conformance`: prove that an OpenEnv environment behaves on denv.

For each target (an image, a version id, or a compose file to deploy) and
each fork mode (cold, warm, live) it runs one episode through the real OpenEnv
client stack and checks, in order: start, ready, reset, step k times, the
warm pool (warm mode: every spare booted; children then start warm, and in cold
mode cold; live mode: an image started with `DenvProvider(fork="live")`, whose
children are copies of its running server, start `live`), fork, fork(n),
`state()` equal across the root and every branch, branches stepped
differently diverge while the root is unchanged, close, and nothing left on
the server. It prints a table (target x check, pass/fail with timings) and
writes the same as JSON.

Example::

    denv conformance denv-echo-env:latest --action '{"message": "hi {branch}.{i}"}'
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

CHECKS = (
    "start",
    "ready",
    "reset",
    "step",
    "spares",
    "fork",
    "fork_n",
    "state_equal",
    "diverge",
    "close",
    "nothing_left",
)
DEFAULT_ACTION = '{"message": "conformance {branch}.{i}"}'
#: Seconds the warm mode waits for its booted spares before it forks.
SPARES_TIMEOUT_S = 300.0


class CheckFailed(Exception):
    """A conformance check did not hold."""


@dataclass
class CheckResult:
    name: str
    passed: bool
    seconds: float
    detail: str = ""


@dataclass
class TargetReport:
    target: str
    mode: str
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return len(self.checks) == len(CHECKS) and all(c.passed for c in self.checks)


def make_action(template: str, branch: str, i: int) -> dict[str, Any]:
    """Fill `{branch}` and `{i}` in every string of a JSON action template."""

    def fill(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace("{branch}", branch).replace("{i}", str(i))
        if isinstance(value, dict):
            return {k: fill(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fill(v) for v in value]
        return value

    action = fill(json.loads(template))
    if not isinstance(action, dict):
        raise ValueError(f"--action must be a JSON object, got {template!r}")
    return action


class _Run:
    """One target in one mode: the clients it opened and the env ids it saw."""

    def __init__(self, report: TargetReport) -> None:
        self.report = report
        self.clients: list[Any] = []
        self.env_ids: list[str] = []

    @contextmanager
    def check(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        except Exception as exc:
            seconds = time.perf_counter() - started
            detail = f"{type(exc).__name__}: {exc}"
            self.report.checks.append(CheckResult(name, False, seconds, detail[:2000]))
            raise
        self.report.checks.append(CheckResult(name, True, time.perf_counter() - started))

    def track(self, client: Any) -> Any:
        self.clients.append(client)
        env_id = getattr(_provider_of(client), "env_id", None)
        if env_id:
            self.env_ids.append(env_id)
        return client

    def close_all(self) -> None:
        for client in reversed(self.clients):
            try:
                client.close()
            except Exception:  # cleanup continues; the close check reports failures
                logger.debug("closing a client failed", exc_info=True)
        self.clients.clear()


def _provider_of(client: Any) -> Any:
    inner = getattr(client, "async_client", client)
    return getattr(inner, "_provider", None)


def _state(client: Any) -> Any:
    state = client.state()
    return state.model_dump() if hasattr(state, "model_dump") else state


def _start_root(target: str, provider: Any) -> Any:
    from openenv.core import GenericEnvClient

    from . import from_denv_version

    if target.startswith("ver_"):
        client = from_denv_version(GenericEnvClient, target, provider=provider)
    else:
        base_url = provider.start_container(target)
        provider.wait_for_ready(base_url)
        client = GenericEnvClient(base_url=base_url, provider=provider)
    return client.sync() if hasattr(client, "sync") else client


def run_target(
    target: str,
    *,
    mode: str,
    steps: int,
    branches: int,
    action_template: str,
    provider_factory: Callable[..., Any],
) -> TargetReport:
    """Run every check on one target in one mode; stops at the first failure."""
    from . import fork_client, fork_clients

    report = TargetReport(target=target, mode=mode)
    run = _Run(report)
    warm = branches + 1 if mode == "warm" else 0
    provider = provider_factory(warm=warm, fork="live" if mode == "live" else "volume")
    try:
        with run.check("start"):
            root = run.track(_start_root(target, provider))
        with run.check("ready"):
            _expect_health(provider.base_url)
        with run.check("reset"):
            root.reset()
        with run.check("step"):
            for i in range(steps):
                root.step(make_action(action_template, "root", i))
        root_state = _state(root)
        with run.check("spares"):
            # Warm: every spare booted, so the forks below are warm; a version declared
            # `fork: cold` asks for none (state none) and forks cold in both modes.
            pool = provider.wait_warm(timeout_s=SPARES_TIMEOUT_S)
            start = "warm" if mode == "warm" and pool.state.value != "none" else "cold"
            if mode == "live":  # the children are copies of the root's running server
                start = "live"
        with run.check("fork"):
            child = run.track(fork_client(root))
            _expect_equal(_state(child), root_state, "the forked child's state()")
            _expect_start([child], start)
        with run.check("fork_n"):
            children = [run.track(c) for c in fork_clients(root, branches)]
            _expect_start(children, start)
        with run.check("state_equal"):
            for n, c in enumerate(children):
                _expect_equal(_state(c), root_state, f"branch {n}'s state()")
        with run.check("diverge"):
            _diverge(children, action_template)
            _expect_equal(_state(root), root_state, "the root's state() after its branches stepped")
        with run.check("close"):
            run.close_all()
        with run.check("nothing_left"):
            _expect_deleted(provider, run.env_ids)
    except Exception:
        logger.info("conformance: %s (%s) stopped at its first failed check", target, mode)
    finally:
        run.close_all()
    return report


def _diverge(children: list[Any], action_template: str) -> None:
    # Branch n steps n+1 times with its own messages: every pair must differ.
    states = []
    for n, c in enumerate(children):
        for i in range(n + 1):
            c.step(make_action(action_template, f"b{n}", i))
        states.append(json.dumps(_state(c), sort_keys=True, default=str))
    if len(set(states)) != len(states):
        raise CheckFailed("branches stepped differently ended in equal states")


def _expect_equal(got: Any, want: Any, what: str) -> None:
    if got != want:
        raise CheckFailed(f"{what} is {got!r}, expected the root's {want!r}")


def _expect_start(clients: list[Any], start: str) -> None:
    starts = [_provider_of(c).start for c in clients]
    if any(s != start for s in starts):
        raise CheckFailed(f"children started {starts}, expected every one {start}")


def _expect_health(base_url: str) -> None:
    import httpx

    response = httpx.get(f"{base_url.rstrip('/')}/health", timeout=10.0)
    if response.status_code != 200:
        raise CheckFailed(f"GET /health answered {response.status_code}")


def _expect_deleted(provider: Any, env_ids: list[str]) -> None:
    from denv import Denv, NotFound

    with Denv(provider.server, provider.api_key) as denv:
        left = []
        for env_id in env_ids:
            try:
                if denv.get_env(env_id).status.value != "deleted":
                    left.append(env_id)
            except NotFound:
                continue
    if left:
        raise CheckFailed(f"{len(left)} env(s) still live after close: {', '.join(left)}")


def format_table(reports: list[TargetReport]) -> str:
    """A plain-text table: one row per target and mode, one column per check."""
    header = ["target", "mode", *CHECKS]
    rows = [header]
    for r in reports:
        by_name = {c.name: c for c in r.checks}
        cells = []
        for name in CHECKS:
            c = by_name.get(name)
            cells.append("-" if c is None else f"{'pass' if c.passed else 'FAIL'} {c.seconds:.2f}s")
        rows.append([r.target, r.mode, *cells])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    for r in reports:
        for c in r.checks:
            if not c.passed:
                lines.append(f"{r.target} ({r.mode}) {c.name}: {c.detail}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "targets",
        nargs="+",
        metavar="IMAGE_OR_VERSION",
        help="an image on the server's engine, a version id (ver_...), or a compose file to deploy",
    )
    parser.add_argument("--steps", type=int, default=5, help="steps before forking (default 5)")
    parser.add_argument("--branches", type=int, default=3, help="children for fork(n) (default 3)")
    parser.add_argument(
        "--action",
        action="append",
        help="the step action as a JSON object; {branch} and {i} are filled in strings. "
        "Give it once for every target, or once per target in order "
        f"(default {DEFAULT_ACTION})",
    )
    parser.add_argument(
        "--mode",
        choices=["cold", "warm", "live", "both", "all"],
        default="both",
        help="fork from freshly started children, from booted spares, both (default), live "
        "(copies of the running server: an image whose command is uvicorn MODULE:APP), or all",
    )
    parser.add_argument("--egress", choices=["deny", "allow"], default="deny")
    parser.add_argument(
        "--json", type=Path, default=Path("conformance.json"), help="where to write results"
    )
    parser.add_argument(
        "--server", default=None, help="denv server URL (default: DENV_SERVER or local)"
    )


def _resolve_target(target: str, server: str | None) -> str:
    """A compose file is deployed as a project; its new version is the target."""
    path = Path(target)
    if path.suffix in {".yaml", ".yml"} and path.is_file():
        from denv import Denv

        project = path.resolve().parent.name.lower().replace("_", "-")
        with Denv(server) as denv:
            version = denv.deploy(project, path.read_text())
        logger.info("conformance: deployed %s as %s (%s)", path, project, version.id)
        return version.id
    return target


def main(args: argparse.Namespace) -> int:
    from . import DenvProvider

    actions = args.action or [DEFAULT_ACTION]
    if len(actions) == 1:
        actions = actions * len(args.targets)
    if len(actions) != len(args.targets):
        print(
            f"denv conformance: {len(actions)} --action values for {len(args.targets)} targets: "
            "give one for all targets or one per target",
            file=sys.stderr,
        )
        return 2
    for template in actions:  # reject a bad template before starting anything
        try:
            make_action(template, "root", 0)
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            print(f"denv conformance: bad --action {template!r}: {exc}", file=sys.stderr)
            return 2
    modes = {"both": ["cold", "warm"], "all": ["cold", "warm", "live"]}.get(args.mode, [args.mode])
    reports = []
    for raw, action in zip(args.targets, actions, strict=True):
        target = _resolve_target(raw, args.server)
        for mode in modes:
            print(f"conformance: {raw} ({mode}) ...", flush=True)
            reports.append(
                run_target(
                    target,
                    mode=mode,
                    steps=args.steps,
                    branches=args.branches,
                    action_template=action,
                    provider_factory=lambda warm, fork: DenvProvider(
                        server=args.server, egress=args.egress, warm=warm, fork=fork
                    ),
                )
            )
    print(format_table(reports))
    args.json.write_text(json.dumps([asdict(r) | {"passed": r.passed} for r in reports], indent=2))
    print(f"conformance: results written to {args.json}")
    return 0 if all(r.passed for r in reports) else 1
