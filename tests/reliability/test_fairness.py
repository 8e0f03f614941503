"""Fairness per API key through a real server: each cap answers 429 with Retry-After.

One server with every cap at 1 (or a few): a second create while one is in flight, a
second env while one is starting, a second wait, a fork asking for more warm spares than
allowed, a version past the limit, a second ingress connection: each is refused with 429
(``rate_limited``, or ``quota_exceeded`` for what only a delete frees), a Retry-After
header, and a message naming the ``denv serve`` flag; meanwhile another key is served. The
server's cap on open waits of all keys together (``--max-waits``) refuses another key's wait
at once, while that key's other calls are answered (the wait pins no thread); a key's third
lease is refused (``--max-leases-per-key``). An env that goes silent mid-request is cut off
by the ingress read timeout (502), not waited on. A WebSocket through ingress that idles
past ``--ws-idle-timeout`` is closed on both sides (1001, a reason naming the flag) and its
ingress slot is freed, while a real OpenEnv client that pings stays connected past it.
Nothing is left afterwards. The flood comparison is in test_flood.py.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from conftest import LocalDenv, start_server
from reliability_helpers import (
    ECHO,
    STANDIN,
    STANDIN_CMD,
    api,
    assert_nothing_left,
    delete_all,
    ok,
    report,
    standin,
)
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from denv.server.auth import create_api_key

pytestmark = pytest.mark.e2e

SLOW_CMD = ["sh", "-c", "sleep 3; exec python3 -m http.server 8000 --directory /srv/www"]
# Answers /health at once and holds /stall silent for a minute.
STALL_APP = """
import http.server, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/stall":
            time.sleep(60)
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers()
        self.wfile.write(b"ok")
http.server.ThreadingHTTPServer(("", 8000), H).serve_forever()
"""
CAPS = {
    "--max-creates-per-key": "1",
    "--max-starting-per-key": "1",
    "--max-waits-per-key": "1",
    "--max-spares-per-key": "1",
    "--max-ingress-per-key": "1",
    "--max-versions-per-key": "6",
    "--ingress-read-timeout": "2",
    "--max-waits": "1",
    "--max-leases-per-key": "2",
    "--ws-idle-timeout": "2",
}
IDLE_S = float(CAPS["--ws-idle-timeout"])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    args = [x for pair in CAPS.items() for x in pair]
    with start_server(tmp_path_factory.mktemp("denv-fairness"), *args) as srv:
        yield srv


def refused(res: httpx.Response, code: str, flag: str) -> dict[str, Any]:
    assert res.status_code == 429, (res.status_code, res.text[:300])
    body: dict[str, Any] = res.json()
    assert body["code"] == code, body
    assert flag in body["message"], body["message"]
    assert int(res.headers["retry-after"]) >= 1, res.headers
    return body


def in_background(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.setdefault("res", fn()))
    thread.start()
    time.sleep(1.0)  # the request is in flight
    return thread, out


def test_each_cap_answers_429_with_retry_after(
    server: LocalDenv, request: pytest.FixtureRequest
) -> None:
    other_key = create_api_key(server.state_dir)
    checked: list[str] = []
    with api(server) as c, api(server, other_key) as other:
        env = standin(c, warm_fork=True)

        # a create in flight: the key's next create waits; another key's does not
        slow = {"image": STANDIN, "command": SLOW_CMD}
        thread, out = in_background(lambda: c.post("/v1/sandboxes", json=slow))
        refused(c.post("/v1/sandboxes", json=slow), "rate_limited", "--max-creates-per-key")
        ok(other.post("/v1/sandboxes", json={"image": STANDIN, "command": STANDIN_CMD}))
        thread.join()
        ok(out["res"])
        checked.append("creates")

        # an env starting (wait: none returns at once): the key's next env waits
        starting = ok(c.post("/v1/sandboxes", json={**slow, "wait": "none"}))
        assert starting["status"] in ("creating", "starting"), starting
        refused(c.post("/v1/sandboxes", json=slow), "rate_limited", "--max-starting-per-key")
        checked.append("starting")

        # an open wait: the key's next wait is refused, another key's is served
        wait = {"until": "healthy", "timeout_s": 30}
        thread, out = in_background(lambda: c.post(f"/v1/envs/{starting['id']}/wait", json=wait))
        refused(
            c.post(f"/v1/envs/{env['id']}/wait", json=wait), "rate_limited", "--max-waits-per-key"
        )
        thread.join()
        assert ok(out["res"], 200)["status"] == "healthy"
        checked.append("waits")

        # a wait open (until its timeout): another key's wait is past the server's cap, and
        # refused at once instead of taking a thread; that key's other calls are served
        wait = {"until": "deleted", "timeout_s": 3}
        thread, out = in_background(lambda: c.post(f"/v1/envs/{env['id']}/wait", json=wait))
        body = refused(
            other.post(f"/v1/envs/{env['id']}/wait", json=wait), "rate_limited", "--max-waits)"
        )
        assert body["details"]["limit"] == "server_waits", body
        ok(other.get("/v1/envs"), 200)
        thread.join()
        assert ok(out["res"], 200)["status"] == "healthy"  # its timeout passed
        checked.append("server waits")

        # leases: a key's third open lease is refused; another key's is not; closing frees one
        leases = [ok(c.post("/v1/leases", json={}))["id"] for _ in range(2)]
        body = refused(c.post("/v1/leases", json={}), "quota_exceeded", "--max-leases-per-key")
        assert body["details"] == {"limit": "leases", "max": 2, "retry_after_s": 30}, body
        assert "close clients you no longer use" in body["message"]
        other_lease = ok(other.post("/v1/leases", json={}))["id"]
        assert other.delete(f"/v1/leases/{other_lease}").status_code == 204
        assert c.delete(f"/v1/leases/{leases[0]}").status_code == 204
        leases[0] = ok(c.post("/v1/leases", json={}))["id"]
        for lease in leases:
            assert c.delete(f"/v1/leases/{lease}").status_code == 204
        checked.append("leases")

        # warm spares past the key's cap, refused before the fork's snapshot is made
        versions = len(ok(c.get("/v1/versions"), 200)["items"])
        res = c.post(f"/v1/envs/{env['id']}/fork", json={"warm": 2})
        refused(res, "quota_exceeded", "--max-spares-per-key")
        assert len(ok(c.get("/v1/versions"), 200)["items"]) == versions
        checked.append("spares")

        # one ingress connection held open (a body that never finishes): the next is refused
        url = env["endpoints"][0]["url"]
        held = hold_ingress_connection(url)
        try:
            res = httpx.get(f"{url}/health", trust_env=False, timeout=30)
            refused(res, "rate_limited", "--max-ingress-per-key")
        finally:
            held.close()
        assert eventually_ok(f"{url}/health"), "the slot was not freed when the client left"
        checked.append("ingress")

        # an env that goes silent: the proxy gives up after --ingress-read-timeout
        stall = ok(
            c.post(
                "/v1/sandboxes",
                json={"image": STANDIN, "command": ["python3", "-c", STALL_APP]},
            )
        )
        started = time.monotonic()
        res = httpx.get(f"{stall['endpoints'][0]['url']}/stall", trust_env=False, timeout=50)
        silent_s = time.monotonic() - started
        assert res.status_code == 502, (res.status_code, res.text[:300])
        checked.append("ingress read timeout")

        # versions past the cap: refused until some are deleted
        made = 0
        while (res := c.post(f"/v1/envs/{env['id']}/snapshot", json={})).status_code == 201:
            made += 1
            assert made <= int(CAPS["--max-versions-per-key"]), "no versions cap"
        refused(res, "quota_exceeded", "--max-versions-per-key")
        total = len(ok(c.get("/v1/versions"), 200)["items"])
        assert total == int(CAPS["--max-versions-per-key"]), total
        checked.append("versions")

        delete_all(c)
        delete_all(other)
    report(
        request,
        f"fairness: {len(checked)} caps answered 429 with Retry-After ({', '.join(checked)}); "
        f"another key served meanwhile; a silent env cut off after {silent_s:.1f} s "
        f"(--ingress-read-timeout {CAPS['--ingress-read-timeout']})",
    )
    assert_nothing_left(request, server.state_dir, "fairness: after", quiet=True)


def test_an_idle_websocket_is_closed_and_a_pinging_openenv_client_is_not(
    server: LocalDenv, request: pytest.FixtureRequest
) -> None:
    from openenv.core.generic_client import GenericEnvClient

    with api(server, create_api_key(server.state_dir)) as c:  # the other test's versions cap
        # one OpenEnv session at a time: the env's side of a WebSocket must be closed too
        body = {"image": ECHO, "ports": [8000], "env": {"MAX_CONCURRENT_ENVS": "1"}}
        url = ok(c.post("/v1/sandboxes", json=body))["endpoints"][0]["url"]
        ws_url = "ws" + url.removeprefix("http") + "/ws"

        # a client that neither sends nor pings (its library still answers the server's pings)
        with ws_connect(ws_url, ping_interval=None, open_timeout=30) as idle:
            opened = time.monotonic()
            with pytest.raises(ConnectionClosed) as closed:
                idle.recv(timeout=30)
            idle_s = time.monotonic() - opened
        rcvd = closed.value.rcvd
        assert rcvd is not None and rcvd.code == 1001, closed.value
        assert "--ws-idle-timeout" in rcvd.reason and "no message and no ping" in rcvd.reason
        # the key's only ingress slot (--max-ingress-per-key 1) is free again
        assert eventually_ok(f"{url}/health"), "the idle WebSocket's slot was not freed"

        # a real OpenEnv session that pings: open past the idle timeout, then it steps on, in
        # the env's one session (the idle socket's is gone)
        client = GenericEnvClient(base_url=url, websocket_ping_interval_s=IDLE_S / 4)
        with client.sync() as env:
            env.reset()
            time.sleep(IDLE_S * 1.5)
            assert env.step({"message": "still here"}).observation["echoed_message"] == (
                "still here"
            )
        delete_all(c)
    report(
        request,
        f"ingress: an idle WebSocket closed after {idle_s:.1f} s (--ws-idle-timeout "
        f"{IDLE_S:g}: 1001 {rcvd.reason!r}), its slot freed; an OpenEnv client pinging every "
        f"{IDLE_S / 4:g} s kept its session for {IDLE_S * 1.5:g} s",
    )


def hold_ingress_connection(url: str) -> socket.socket:
    """An HTTP request through ingress whose body never finishes: the proxy waits on it."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    head = (
        f"POST {parts.path}/upload HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        "Content-Length: 1000\r\nContent-Type: text/plain\r\n\r\npartial"
    )
    sock.sendall(head.encode())
    time.sleep(1.0)  # the proxy has the request and is reading its body
    return sock


def eventually_ok(url: str, within_s: float = 10) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if httpx.get(url, trust_env=False, timeout=10).status_code == 200:
            return True
        time.sleep(0.2)
    return False
