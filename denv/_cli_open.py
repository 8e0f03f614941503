"""`denv open [ENV]`: the URL to open in a browser, an env's web page or the console.

An env's web page (OpenEnv's Gradio app at `/web`) is opened through the host form of its
ingress URL, `http://<label>.localhost:7711/web/` (`denv.ingress_host`): the path form that
clients use breaks apps that ask for their assets at absolute paths. Without ENV, the
server's console (`/ui`).
"""

from __future__ import annotations

import argparse
import webbrowser

from ._cli_common import Command, Output, id_problem
from .client._client import Denv
from .client.types import Env
from .ingress_host import web_url


def _add_open(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "env", metavar="ENV", nargs="?", help="the env's id (env_...); none: the console"
    )
    parser.add_argument(
        "--path", default="/web/", help="the page in the env (default /web/, OpenEnv's web UI)"
    )
    parser.add_argument("--port", type=int, help="the env's port (default: its first one)")
    parser.add_argument("--browser", action="store_true", help="also open it in a browser")


def env_page(env: Env, path: str, port: int | None = None) -> str | None:
    """The browser URL of ``path`` in ``env`` (its agent service's port, or ``port``)."""
    endpoints = [e for e in env.endpoints if port is None or e.port == port]
    endpoints.sort(key=lambda e: e.service != env.agent_service)
    if not endpoints:
        return None
    e = endpoints[0]
    if e.via.value == "ingress":
        return web_url(e.url, path)
    return e.url.rstrip("/") + "/" + path.lstrip("/")


def _open(denv: Denv, args: argparse.Namespace, out: Output) -> int:
    if args.env is None:
        url = f"{denv.server.rstrip('/')}/ui"
    else:
        problem = id_problem("ENV", args.env, "env")
        if problem:
            out.error(f"denv open: {problem}")
            return 2
        env = denv.get_env(args.env)
        found = env_page(env, args.path, args.port)
        if found is None:
            what = f"port {args.port}" if args.port else "port"
            out.error(
                f"denv open: env {env.id} has no {what} a browser can reach "
                "(an env's ports are in `denv envs --json`; a server addressed by an IP "
                "other than loopback has no host-form ingress URLs)"
            )
            return 1
        url = found
    if out.as_json:
        out.json({"url": url})
    else:
        print(url)
    if args.browser:
        webbrowser.open(url)
    return 0


OPEN = Command(_add_open, _open)
