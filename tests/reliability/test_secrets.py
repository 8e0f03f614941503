"""Secrets never leak: a known API key (and the ingress tokens) appear nowhere they should not.

A server of its own runs with a key this test chose (``--api-key``), logging at DEBUG.
Scenarios with that key and near misses of it (the key plus a character, the key under
another auth scheme): envs that start, fail and crash, forks, ingress traffic, unknown
ids, the facade's and the provider's exceptions, and the CLI. Then the key and every
ingress token are searched for in the server's log files, every response body, every
exception text and repr, the CLI's output, and the recorded cassettes under
tests/cassettes: 0 occurrences.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from conftest import LocalDenv, start_server
from reliability_helpers import STANDIN, STANDIN_CMD, api, delete_all, ok, report, standin

pytestmark = pytest.mark.e2e

KEY = "dak_" + secrets.token_urlsafe(32)
CASSETTES = Path(__file__).resolve().parents[1] / "cassettes"
REAL_KEY = re.compile(r"dak_[A-Za-z0-9_-]{43}")
REAL_TOKEN = re.compile(r"/ingress/[A-Za-z0-9_-]{22,}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    with start_server(
        tmp_path_factory.mktemp("denv-secrets"), "--api-key", KEY, "--log-level", "DEBUG"
    ) as srv:
        assert srv.key == KEY
        yield srv


def test_known_key_and_tokens_appear_nowhere(
    server: LocalDenv, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from denv.openenv import DenvProvider

    from denv import Denv
    from denv.errors import DenvError

    texts: list[str] = []  # everything a user or an operator could see
    tokens: list[str] = []

    def seen(res: httpx.Response) -> httpx.Response:
        texts.append(res.text)
        texts.append(str(dict(res.headers)))
        return res

    with api(server) as c:
        env = standin(c)
        tokens.append(urlsplit(env["endpoints"][0]["url"]).path.split("/")[2])
        fork = ok(c.post(f"/v1/envs/{env['id']}/fork", json={"count": 2}))
        tokens += [urlsplit(e["endpoints"][0]["url"]).path.split("/")[2] for e in fork["envs"]]
        with httpx.Client(trust_env=False, timeout=10) as http:
            for e in [env, *fork["envs"]]:
                seen(http.get(e["endpoints"][0]["url"] + "/health"))
                seen(http.get(e["endpoints"][0]["url"] + "/no-such-file"))
            seen(http.get(f"{server.url}/ingress/{tokens[0][:-2]}/health"))
        crash = ["sh", "-c", f"echo crashing; echo {KEY[:8]}; exit 3"]
        seen(c.post("/v1/sandboxes", json={"image": STANDIN, "command": crash}))
        seen(c.post("/v1/sandboxes", json={"image": "denv-secrets-missing:0"}))
        seen(c.post("/v1/sandboxes", json={"image": STANDIN, "command": STANDIN_CMD, "x": 1}))
        seen(c.get("/v1/envs/env_01M8KZZZZZZZZZZZZZZZZZZZZZ"))
        for header in (f"Bearer {KEY}x", f"Basic {KEY}", KEY, f"Bearer  {KEY[:-1]}"):
            res = seen(httpx.get(f"{server.url}/v1/envs", headers={"Authorization": header}))
            assert res.status_code == 401, res.text

        # the facade and the provider: exception texts and reprs
        errors: list[BaseException] = []
        with Denv(server.url, KEY) as denv:
            texts.append(repr(denv))
            try:
                denv.get_env("env_01M8KZZZZZZZZZZZZZZZZZZZZZ")
            except DenvError as exc:
                errors.append(exc)
        for bad_server, bad_key in ((server.url, KEY + "x"), ("http://127.0.0.1:9", KEY)):
            try:
                with Denv(bad_server, bad_key, max_retries=0, timeout_s=5) as denv:
                    texts.append(repr(denv))
                    list(denv.list_envs())
            except DenvError as exc:
                errors.append(exc)
        provider = DenvProvider(server=server.url, api_key=KEY + "x")
        texts.append(repr(provider))
        try:
            provider.start_container(STANDIN)
        except Exception as exc:
            errors.append(exc)
        for exc in errors:
            texts += [str(exc), repr(exc), repr(exc.args)]
            texts += [str(getattr(exc, name, "")) for name in ("body", "request_id", "message")]
        assert len(errors) == 4, errors

        # the CLI, with the key in its environment and on its command line
        cli_env = {**os.environ, "DENV_SERVER": server.url, "DENV_API_KEY": KEY}
        for argv in (
            ["export", "--openenv", "nope@ver_01M8KZZZZZZZZZZZZZZZZZZZZZ", str(tmp_path / "x")],
            ["export", "--harbor", f"p@{env['version_id']}", str(tmp_path / "y")],
            ["export", "--openenv", "p@latest", "--api-key", KEY + "x", str(tmp_path / "z")],
            ["--help"],
        ):
            done = subprocess.run(
                [sys.executable, "-m", "denv", *argv],
                env=cli_env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            texts += [done.stdout, done.stderr]
        delete_all(c)

    logs = [p for p in server.state_dir.iterdir() if p.name.startswith(("server.l", "server.o"))]
    log_text = "".join(p.read_text(errors="replace") for p in logs)
    assert "listening at" in log_text  # the logs are really there
    cassettes = sorted(CASSETTES.glob("*.yaml"))
    cassette_text = "".join(p.read_text(errors="replace") for p in cassettes)
    needles = [KEY, *tokens]
    haystacks = {"logs": log_text, "outputs": "\n".join(texts), "cassettes": cassette_text}
    found = {where: sum(text.count(n) for n in needles) for where, text in haystacks.items()}
    real_in_cassettes = REAL_KEY.findall(cassette_text) + [
        t for t in REAL_TOKEN.findall(cassette_text) if not t.endswith(tuple("0123456789"))
    ]
    report(
        request,
        f"secrets: the key and {len(tokens)} ingress tokens searched in {len(logs)} log files "
        f"({len(log_text)} chars), {len(texts)} responses/exceptions/CLI outputs and "
        f"{len(cassettes)} cassettes: {sum(found.values())} occurrences, "
        f"{len(real_in_cassettes)} real-looking keys or tokens in cassettes",
    )
    leaked = [t[:300] for t in texts if any(n in t for n in needles)]
    assert found == {"logs": 0, "outputs": 0, "cassettes": 0}, (found, leaked)
    assert not real_in_cassettes, real_in_cassettes
