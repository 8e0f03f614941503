"""Secrets never leak: a known API key (and the ingress tokens) appear nowhere they should not.

A server of its own runs with a key this test chose (``--api-key-file``), logging at DEBUG.
Scenarios with that key and near misses of it (the key plus a character, the key under
another auth scheme): envs that start, fail and crash, forks, ingress traffic, unknown
ids, the facade's and the provider's exceptions, and the CLI. Then the key, every ingress
token and its host-form label are searched for in every file under the server's state
directory (its logs, console, database with its WAL, server.json, layers: whatever the
server wrote), every response body, every exception text and repr and the CLI's output: 0
occurrences. Only two files are meant to hold a secret and are left out: ``api_key`` (the
key, mode 0600) and ``ingress_key`` (the secret tokens are derived from, never a token);
so are volume disk images (``*.img``: sparse files of 10 GiB holding only what envs wrote).

The cassettes under tests/cassettes were recorded in other runs with other keys, so they
are checked by shape instead: no ``dak_`` key, ``Bearer`` value, ingress token or other
secret-shaped string but the recorder's placeholders. And the recorder's scrubbing
(scripts/record_cassettes.py) runs on a live recording made here with the known key: the
raw recording holds the key and the tokens, the scrubbed one none of them.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import re
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from urllib.parse import urlsplit

import httpx
import pytest
from conftest import LocalDenv, start_server
from reliability_helpers import STANDIN, STANDIN_CMD, api, delete_all, ok, report, standin
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from denv.ingress_host import host_label

pytestmark = pytest.mark.e2e

KEY = "dak_" + secrets.token_urlsafe(32)
ROOT = Path(__file__).resolve().parents[2]
CASSETTES = ROOT / "tests" / "cassettes"
RECORDER = ROOT / "scripts" / "record_cassettes.py"
# Any run of URL-safe base64 as long as a 128-bit token (keys and tokens are longer) ...
SECRET_SHAPED = re.compile(r"[A-Za-z0-9_-]{22,}")
# ... unless it is a scrubbed id (zero-padded) or an image digest (sha256:<64 hex>), or
# a page cursor (base64 of a scrubbed id).
SCRUBBED_ID = re.compile(r"(?:env|ver|req|lyr|lse)_0{10}[0-9A-Z]{16}")
# ... or lowercase words joined by hyphens (a header's name: content-security-policy).
NOT_SECRET = re.compile(rf"{SCRUBBED_ID.pattern}|(?<=sha256:)[0-9a-f]{{64}}|\b[a-z]+(?:-[a-z]+)+\b")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    key_file = tmp_path_factory.mktemp("denv-secrets-key") / "key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    state_dir = tmp_path_factory.mktemp("denv-secrets")
    with start_server(state_dir, "--api-key-file", str(key_file), "--log-level", "DEBUG") as srv:
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
        # the host form: the token as a label in a WebSocket's Host header (logged at DEBUG;
        # the stand-in speaks no WebSocket, so the proxy refuses it with 502)
        label = host_label(tokens[0])
        port = urlsplit(server.url).port
        assert label is not None and port is not None
        hosted = socket.create_connection(("127.0.0.1", port), timeout=30)
        with pytest.raises(InvalidStatus) as refused:
            ws_connect(f"ws://{label}.localhost:{port}/ws", sock=hosted, open_timeout=30)
        assert refused.value.response.status_code == 502
        texts.append(str(refused.value))
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

    files = written_files(server.state_dir)
    names = {p.name for p in files}
    assert {"server.log", "server.out", "denv.db", "server.json"} <= names, names
    log_text = (server.state_dir / "server.log").read_text()
    assert "listening at" in log_text  # the logs are there, with the host form's header
    shown = f"host: sha256:{hashlib.sha256(tokens[0].encode()).hexdigest()[:8]}.localhost"
    assert shown in log_text.lower()
    needles = [KEY, *tokens, *(host_label(t) or t for t in tokens)]
    in_files = {
        str(p.relative_to(server.state_dir)): n
        for p in files
        if (n := sum(p.read_bytes().count(x.encode()) for x in needles))
    }
    outputs = sum("\n".join(texts).count(n) for n in needles)
    size = sum(p.stat().st_size for p in files)
    report(
        request,
        f"secrets: the key, {len(tokens)} ingress tokens and their labels searched in "
        f"{len(files)} files under the state dir ({size // 1024} KiB: "
        f"{', '.join(sorted(str(p.relative_to(server.state_dir)) for p in files)[:12])}) "
        f"and {len(texts)} responses/exceptions/CLI outputs: "
        f"{sum(in_files.values()) + outputs} occurrences",
    )
    leaked = [t[:300] for t in texts if any(n in t for n in needles)]
    assert not in_files and outputs == 0, (in_files, leaked)


# What holds a secret by design (the key; the ingress secret), and volume disk images.
NOT_SCANNED = ("api_key", "ingress_key")


def written_files(state_dir: Path) -> list[Path]:
    """Every regular file under the server's state directory but those meant to hold a
    secret, and volume disk images (their contents are what envs wrote)."""
    out: list[Path] = []
    for root, _, names in os.walk(state_dir):
        for name in names:
            path = Path(root) / name
            if path.is_symlink() or not path.is_file():
                continue
            if path.parent == state_dir and name in NOT_SCANNED:
                assert path.stat().st_mode & 0o077 == 0, f"{path} is readable by others"
                continue
            if name.endswith(".img"):
                continue
            out.append(path)
    return out


def secrets_in_cassette(text: str, recorder: ModuleType) -> list[str]:
    """What in a cassette's text looks like a key, a bearer value or a token but is no
    placeholder of the recorder's."""
    placeholder = recorder.CASSETTE_KEY
    found = [k for k in re.findall(r"dak_[A-Za-z0-9_-]*", text) if k != placeholder]
    found += [v for v in re.findall(r"Bearer\s+(\S*)", text) if v != placeholder]
    found += [
        t
        for t in re.findall(r"/ingress/([^/\s\"'?]*)", text)
        if not re.fullmatch(r"INGRESS_TOKEN_\d+", t)
    ]
    rest = NOT_SECRET.sub("", text.replace(placeholder, ""))
    return found + [r for r in SECRET_SHAPED.findall(rest) if not _is_cursor(r)]


def _is_cursor(run: str) -> bool:
    try:
        inner = base64.urlsafe_b64decode(run + "=" * (-len(run) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        return False
    return SCRUBBED_ID.fullmatch(inner) is not None


def load_recorder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("record_cassettes", RECORDER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_cassettes_hold_only_placeholders(request: pytest.FixtureRequest) -> None:
    recorder = load_recorder()
    cassettes = sorted(CASSETTES.glob("*.yaml"))
    assert cassettes, f"no cassettes under {CASSETTES}"
    found = {p.name: secrets_in_cassette(p.read_text(), recorder) for p in cassettes}
    keys = sum(p.read_text().count(recorder.CASSETTE_KEY) for p in cassettes)
    report(
        request,
        f"secrets: {len(cassettes)} committed cassettes, {keys} keys all the placeholder, "
        f"{sum(map(len, found.values()))} secret-shaped strings",
    )
    assert not any(found.values()), {k: v for k, v in found.items() if v}


def test_recorder_scrubs_a_live_recording(
    server: LocalDenv, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    import vcr

    recorder = load_recorder()
    path = tmp_path / "live.yaml"
    live = vcr.VCR(record_mode="all", match_on=["method", "path"], decode_compressed_response=True)
    with live.use_cassette(str(path)), api(server) as c:
        env = standin(c)
        token = urlsplit(env["endpoints"][0]["url"]).path.split("/")[2]
        ok(c.get(f"/v1/envs/{env['id']}"), 200)
        with httpx.Client(trust_env=False, timeout=10) as http:
            assert http.get(env["endpoints"][0]["url"] + "/health").status_code == 200
            res = http.get(f"{server.url}/v1/envs", headers={"Authorization": f"Bearer {KEY}x"})
            assert res.status_code == 401
        delete_all(c)
    raw = path.read_text()
    # the control: the live recording holds what the scrubbing must take out
    assert KEY in raw and token in raw and server.url in raw, "the recording missed a secret"
    assert secrets_in_cassette(raw, recorder)
    recorder.scrub_file(path, server.url)
    scrubbed = path.read_text()
    left = [n for n in (KEY, token, server.url) if n in scrubbed]
    found = secrets_in_cassette(scrubbed, recorder)
    report(
        request,
        f"secrets: a live recording of {raw.count('- request:')} requests held the key "
        f"{raw.count(KEY)} and its ingress token {raw.count(token)} times; scrubbed: "
        f"{len(left)} of them left, {len(found)} secret-shaped strings",
    )
    assert not left and not found, (left, found)
    assert scrubbed.count(recorder.CASSETTE_KEY) >= raw.count(KEY)
