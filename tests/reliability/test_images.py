"""Images: anonymous pulls unless the operator allows its credentials; the image allowlist.

No registry is reachable here, so a small one runs on loopback (``FakeRegistry``): it asks
for Basic auth and records the ``Authorization`` header the Docker Engine sends for each
request, then answers that the image does not exist. What is checked is what the engine
was given (the operator's credentials, or none), through a real ``pull: true``; no image
is pulled. dockerd treats 127.0.0.0/8 as an insecure registry by default, so it speaks
plain HTTP to it.
"""

from __future__ import annotations

import base64
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import LocalDenv, docker_engine, start_server
from reliability_helpers import api, delete_all, ok, report

pytestmark = pytest.mark.e2e

USER, SECRET = "denv-operator", "op-secret-4711"
BASIC = "Basic " + base64.b64encode(f"{USER}:{SECRET}".encode()).decode()
ECHO = "denv-echo-env:latest"


class FakeRegistry:
    """A registry API on 127.0.0.1 that wants Basic auth and has no images."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []  # (path, Authorization or "")
        registry = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                auth = self.headers.get("Authorization", "")
                registry.seen.append((self.path, auth))
                if auth != BASIC:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="denv-test"')
                    body = b'{"errors": [{"code": "UNAUTHORIZED"}]}'
                elif self.path == "/v2/":
                    self.send_response(200)
                    body = b"{}"
                else:
                    self.send_response(404)
                    body = b'{"errors": [{"code": "MANIFEST_UNKNOWN"}]}'
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_HEAD = do_GET

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def registry() -> Iterator[FakeRegistry]:
    reg = FakeRegistry()
    yield reg
    reg.close()


@pytest.fixture(scope="module")
def docker_config(tmp_path_factory: pytest.TempPathFactory, registry: FakeRegistry) -> Path:
    """The operator's ~/.docker/config.json: credentials for the fake registry."""
    cfg = tmp_path_factory.mktemp("docker-config")
    auth = base64.b64encode(f"{USER}:{SECRET}".encode()).decode()
    (cfg / "config.json").write_text(json.dumps({"auths": {registry.address: {"auth": auth}}}))
    return cfg


def pull(srv: LocalDenv, image: str) -> httpx.Response:
    with api(srv) as c:
        return c.post("/v1/sandboxes", json={"image": image, "pull": True})


def test_pulls_are_anonymous_unless_the_operator_allows_its_credentials(
    tmp_path: Path,
    registry: FakeRegistry,
    docker_config: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    docker_engine(ECHO)
    image = f"{registry.address}/denv-test/probe:1"
    seen: dict[str, list[tuple[str, str]]] = {}
    for mode, extra in (("default", ()), ("--pull-credentials", ("--pull-credentials",))):
        registry.seen.clear()
        monkeypatch.setenv("DOCKER_CONFIG", str(docker_config))  # as the operator's server
        with start_server(tmp_path / mode.strip("-"), *extra) as srv:
            res = pull(srv, image)
        assert res.status_code == 422, res.text
        assert res.json()["code"] == "image_not_found", res.text
        seen[mode] = list(registry.seen)
    anonymous = [a for _, a in seen["default"]]
    credited = [a for _, a in seen["--pull-credentials"]]
    report(
        request,
        f"images: default server: {len(anonymous)} registry requests, "
        f"{anonymous.count(BASIC)} with the operator's credentials; with --pull-credentials: "
        f"{len(credited)} requests, {credited.count(BASIC)} with them",
    )
    assert anonymous, "the engine never asked the fake registry: the test saw nothing"
    assert all(a == "" for a in anonymous), seen["default"]
    assert BASIC in credited, seen["--pull-credentials"]


def test_the_allowlist_refuses_other_images(
    tmp_path: Path,
    registry: FakeRegistry,
    docker_config: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    docker_engine(ECHO)
    allow = ("--allow-image", "denv-*")
    monkeypatch.setenv("DOCKER_CONFIG", str(docker_config))
    with start_server(tmp_path / "allow", *allow) as srv:
        registry.seen.clear()
        with api(srv) as c:
            refused = c.post("/v1/sandboxes", json={"image": "busybox:latest"})
            pulled = c.post(
                "/v1/sandboxes", json={"image": f"{registry.address}/denv-x:1", "pull": True}
            )
            compose = (
                "x-denv: {agent: {service: app}}\n"
                "services:\n"
                f"  app: {{image: '{ECHO}', ports: [8000]}}\n"
                "  db: {image: 'redis:7'}\n"
            )
            deploy = c.post("/v1/projects/allowlist/deploy", json={"compose": compose})
            env = ok(c.post("/v1/sandboxes", json={"image": ECHO, "wait": "none"}))
            envs = delete_all(c)
    bodies = [r.json() for r in (refused, pulled, deploy)]
    n_refused = sum(r.status_code == 422 for r in (refused, pulled, deploy))
    report(
        request,
        f"images: --allow-image 'denv-*': {n_refused}/3 refused (sandbox, pull, compose "
        f"service), {ECHO} created ({env['status']}); "
        f"registry requests for the refused pull: {len(registry.seen)}",
    )
    for res, body in zip((refused, pulled, deploy), bodies, strict=True):
        assert res.status_code == 422, res.text
        assert body["code"] == "invalid_request", body
        assert "--allow-image" in body["message"] and "'denv-*'" in body["message"], body
    assert bodies[0]["details"]["path"] == "image"
    assert bodies[2]["details"]["path"] == "services.db.image"
    assert registry.seen == []  # refused before the engine was asked to pull
    assert envs == 1
