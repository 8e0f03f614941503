#!/usr/bin/env python3
"""Record the facade's HTTP cassettes against a real local denv server (`make cassettes`).

    .venv/bin/python scripts/record_cassettes.py              # every scenario
    .venv/bin/python scripts/record_cassettes.py fork logs    # only these

Needs Docker and the image the scenarios run (denv-echo-env:latest; `make images`). It starts
`python -m denv.server --port 0` on a temporary state directory (the fixture code of
tests/conftest.py, which also removes every container, network and mount afterwards), runs each
scenario of tests/unit/facade_scenarios.py with an API key of its own under vcrpy
(record_mode="all"), and rewrites the cassette so that nothing secret or volatile stays in it:

* API keys (`dak_...`, the Authorization header) become one fixed placeholder;
* ingress tokens, ids (env_/ver_/req_/lyr_/lse_ ULIDs, also inside page cursors), timestamps,
  Idempotency-Keys and container addresses become numbered placeholders, numbered in order of
  first appearance in the cassette, so the same recording gives the same file and a
  re-recording gives a small diff;
* the server's random port becomes CASSETTE_SERVER; Date and Server headers are dropped and
  Content-Length is recomputed.

Replays (tests/unit/cassette_match.py) match on method, URL with its query, JSON body,
Authorization and Idempotency-Key. They line up because the ids and cursors a replayed client
sends come from the scrubbed responses. The API key and Idempotency-Key are placeholders in
the cassette, so the replay checks the shape of what the client sends there, not its value.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import importlib.util
import logging
import re
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CASSETTES = ROOT / "tests" / "cassettes"
# Kept equal to tests/unit/facade_scenarios.py (the replay tests use those).
CASSETTE_SERVER = "http://127.0.0.1:7711"
CASSETTE_KEY = "dak_CASSETTE_KEY"

_ID = re.compile(r"\b(env|ver|req|lyr|lse)_([0-9A-HJKMNP-TV-Z]{26})\b")
_PLACEHOLDER_ID = re.compile(r"^(env|ver|req|lyr|lse)_0{10}")
_KEY = re.compile(r"dak_[A-Za-z0-9_\-]+")
_INGRESS = re.compile(r"/ingress/([A-Za-z0-9_\-]+)")
_TIMESTAMP = re.compile(
    r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?"
)
_ADDRESS = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}:\d{1,5}\b")
_CURSOR_JSON = re.compile(r'("next_cursor"\s*:\s*")([A-Za-z0-9_\-=]+)(")')
_CURSOR_QUERY = re.compile(r"([?&]cursor=)([A-Za-z0-9_\-%]+)")
_DROPPED_HEADERS = {"date", "server"}
_TIME_ZERO = datetime(2000, 1, 1, tzinfo=UTC)

log = logging.getLogger("record_cassettes")


class Scrubber:
    """Rewrites one cassette's volatile and secret strings; one instance per cassette."""

    def __init__(self, server_url: str) -> None:
        self.server_url = server_url.rstrip("/")
        self.server_netloc = self.server_url.split("://", 1)[1]
        self._maps: dict[str, dict[str, str]] = {}

    def _placeholder(self, kind: str, value: str, make: Any) -> str:
        table = self._maps.setdefault(kind, {})
        if value not in table:
            table[value] = make(len(table) + 1)
        return table[value]

    def _id(self, match: re.Match[str]) -> str:
        whole = match.group(0)
        if _PLACEHOLDER_ID.match(whole):
            return whole
        kind = match.group(1)
        return self._placeholder(kind, whole, lambda n: f"{kind}_{n:026d}")

    def _cursor(self, raw: str) -> str:
        """Page cursors wrap an id in base64: rewrite the id inside, keep the wrapping."""
        try:
            padded = raw + "=" * (-len(raw) % 4)
            inner = base64.urlsafe_b64decode(padded).decode()
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return raw
        if not _ID.fullmatch(inner):
            return raw
        encoded = base64.urlsafe_b64encode(_ID.sub(self._id, inner).encode()).decode()
        return encoded if raw.endswith("=") else encoded.rstrip("=")

    def _timestamp(self, match: re.Match[str]) -> str:
        return self._placeholder(
            "time",
            match.group(0),
            lambda n: (_TIME_ZERO + timedelta(seconds=n)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )

    def _address(self, match: re.Match[str]) -> str:
        if match.group(0) == CASSETTE_SERVER.split("://", 1)[1]:
            return match.group(0)
        return self._placeholder("addr", match.group(0), lambda n: f"192.0.2.{n}:{40000 + n}")

    def text(self, value: str) -> str:
        value = value.replace(self.server_url, CASSETTE_SERVER)
        value = value.replace(self.server_netloc, CASSETTE_SERVER.split("://", 1)[1])
        value = _KEY.sub(CASSETTE_KEY, value)
        value = _CURSOR_JSON.sub(
            lambda m: m.group(1) + self._cursor(m.group(2)) + m.group(3), value
        )
        value = _CURSOR_QUERY.sub(lambda m: m.group(1) + self._cursor(m.group(2)), value)
        value = _INGRESS.sub(
            lambda m: "/ingress/"
            + self._placeholder("ingress", m.group(1), lambda n: f"INGRESS_TOKEN_{n}"),
            value,
        )
        value = _ID.sub(self._id, value)
        value = _TIMESTAMP.sub(self._timestamp, value)
        return _ADDRESS.sub(self._address, value)

    def headers(self, headers: dict[str, Any], body: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, values in headers.items():
            lower = name.lower()
            if lower in _DROPPED_HEADERS:
                continue
            listed = values if isinstance(values, list) else [values]
            if lower == "idempotency-key":
                listed = [
                    self._placeholder("idem", str(v), lambda n: f"idempotency-key-{n}")
                    for v in listed
                ]
            elif lower == "user-agent":
                listed = ["denv-python"]
            elif lower == "content-length" and body is not None:
                listed = [str(len(body.encode()))]
            else:
                listed = [self.text(str(v)) for v in listed]
            out[name] = listed if isinstance(values, list) else listed[0]
        return out

    def cassette(self, data: dict[str, Any]) -> dict[str, Any]:
        for interaction in data.get("interactions", []):
            request, response = interaction["request"], interaction["response"]
            request["uri"] = self.text(request["uri"])
            body = request.get("body")
            if isinstance(body, bytes):
                body = body.decode("utf-8", errors="replace")
            request["body"] = self.text(body) if body else body
            request["headers"] = self.headers(request.get("headers", {}), request["body"])
            payload = response.get("body", {}).get("string")
            if isinstance(payload, bytes):
                payload = payload.decode("utf-8", errors="replace")
            if payload is not None:
                response["body"]["string"] = self.text(payload)
            response["headers"] = self.headers(
                response.get("headers", {}), response["body"].get("string")
            )
        return data


def scrub_file(path: Path, server_url: str) -> None:
    from vcr.serializers import yamlserializer

    data = yamlserializer.deserialize(path.read_text())
    path.write_text(yamlserializer.serialize(Scrubber(server_url).cassette(data)))


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def record(names: list[str], out: Path) -> None:
    """Record `names` (every scenario when empty) into `out`."""
    import vcr

    from denv import Denv
    from denv.server.auth import create_api_key

    scenarios = _load("facade_scenarios", ROOT / "tests" / "unit" / "facade_scenarios.py")
    server = _load("denv_test_server", ROOT / "tests" / "conftest.py")
    names = names or list(scenarios.SCENARIOS)
    unknown = sorted(set(names) - set(scenarios.SCENARIOS))
    if unknown:
        raise SystemExit(f"no such scenario: {', '.join(unknown)} (see {scenarios.__file__})")
    recorder = vcr.VCR(
        record_mode="all", match_on=["method", "path"], decode_compressed_response=True
    )
    out.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="denv-cassettes-") as tmp,
        server.start_server(Path(tmp) / "state") as srv,
    ):
        log.info("recording against %s", srv.url)
        for name in names:
            key = create_api_key(srv.state_dir)
            path = out / f"{name}.yaml"
            path.unlink(missing_ok=True)
            started = time.monotonic()
            with recorder.use_cassette(str(path)), Denv(srv.url, key, detach=True) as denv:
                scenarios.SCENARIOS[name](denv)
            scrub_file(path, srv.url)
            log.info("%s: %s (%.1fs)", name, path.relative_to(ROOT), time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="scenarios to record (default: all)")
    parser.add_argument("--out", type=Path, default=CASSETTES, help="default %(default)s")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("httpx", "vcr"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    record(args.names, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
