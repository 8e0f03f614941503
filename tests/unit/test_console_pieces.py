"""The console's and the host form's pieces without a server: labels, hosts, sessions, views.

The browser tests (tests/browser) run them together; these pin the rules one by one.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from starlette.requests import Request

from denv.ingress_host import host_base, host_label, token_of_label, web_url
from denv.server.console import page, tree
from denv.server.console.session import CSRF_HEADER, check_origin, check_transport
from denv.server.errors import ApiError
from denv.server.ingress.hosts import HostIngress, split_host
from denv.server.ingress.proxy import new_token
from denv.server.ingress.wire import HOST_FORM, PATH_FORM_CSP, response_headers, split_target

TOKEN = "su_MUEi0WaJFJjE806ce5e3yGXGZaytm"


def test_a_label_is_lowercase_dns_and_gives_its_token_back() -> None:
    for token in [TOKEN, *(new_token() for _ in range(50))]:
        label = host_label(token)
        assert label is not None and re.fullmatch(r"[a-z2-7]{39}", label)
        assert token_of_label(label) == token
        assert token_of_label(label.upper()) == token  # browsers may send any case


def test_what_is_not_a_label_names_no_token() -> None:
    assert host_label("not base64!") is None
    for label in ("localhost", "127", "api", "x" * 39, "a" * 70, "0" * 39):
        assert token_of_label(label) is None, label


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (f"http://127.0.0.1:7711/ingress/{TOKEN}", "http://{label}.localhost:7711/web/"),
        (f"http://localhost:7711/ingress/{TOKEN}/", "http://{label}.localhost:7711/web/"),
        (f"https://denv.example.org/ingress/{TOKEN}", "https://{label}.denv.example.org/web/"),
        (f"http://10.0.0.5:7711/ingress/{TOKEN}", None),  # an address has no subdomains
        ("http://127.0.0.1:7711/v1/envs", None),
    ],
)
def test_web_url_of_an_ingress_url(url: str, expected: str | None) -> None:
    label = host_label(TOKEN)
    assert web_url(url, "/web/") == (expected.format(label=label) if expected else None)


def test_host_base() -> None:
    assert host_base("127.0.0.1") == host_base("[::1]") == host_base("LOCALHOST") == "localhost"
    assert host_base("denv.example.org") == "denv.example.org"
    assert host_base("0.0.0.0") is None


def test_host_form_picks_its_token_and_leaves_other_hosts_alone() -> None:
    label = host_label(TOKEN)
    mw = HostIngress(app=None, proxy=None, bases={"localhost"})

    def scope(host: bytes) -> dict[str, Any]:
        return {"type": "http", "headers": [(b"host", host)], "path": "/web/"}

    assert mw.token(scope(f"{label}.localhost:7711".encode())) == TOKEN
    assert mw.token(scope(f"{label.upper()}.LOCALHOST".encode())) == TOKEN
    for host in (b"localhost:7711", b"127.0.0.1:7711", f"{label}.evil.test".encode(), b"[::1]"):
        assert mw.token(scope(host)) is None, host
    assert split_host(b"a.b.localhost:1") == ("a", "b.localhost")


def test_a_browser_opening_the_path_form_is_sent_to_the_host_form() -> None:
    label = host_label(TOKEN)
    mw = HostIngress(app=None, proxy=None, bases={"localhost"})

    def moved(
        path: str, host: str = "127.0.0.1:7711", method: str = "GET", mode: str = "navigate"
    ) -> str | None:
        raw = path.encode()
        path, _, query = raw.partition(b"?")
        headers = [(b"host", host.encode()), (b"sec-fetch-mode", mode.encode())]
        scope = {"type": "http", "method": method, "scheme": "http", "headers": headers}
        return mw.page_moved_to({**scope, "raw_path": path, "query_string": query})

    web = f"http://{label}.localhost:7711/web/"
    assert moved(f"/ingress/{TOKEN}/web/") == web
    assert moved(f"/ingress/{TOKEN}/web/?__theme=dark") == web + "?__theme=dark"
    assert moved(f"/ingress/{TOKEN}") == f"http://{label}.localhost:7711/"
    assert moved(f"/ingress/{TOKEN}/web/", host="localhost:7711", method="HEAD") == web
    # Clients (no Fetch Metadata), a script's fetch, a POST: proxied as they were.
    assert moved(f"/ingress/{TOKEN}/web/", mode="") is None
    assert moved(f"/ingress/{TOKEN}/web/gradio_api/info", mode="cors") is None
    assert moved(f"/ingress/{TOKEN}/reset", method="POST") is None
    # No host form this server answers: an address has no subdomains, another name is not its.
    assert moved(f"/ingress/{TOKEN}/web/", host="10.0.0.5:7711") is None
    assert moved(f"/ingress/{TOKEN}/web/", host="denv.example.org") is None
    assert moved("/ingress/not-a-token!/web/") is None
    assert moved("/ui") is None


def test_host_form_keeps_the_whole_path_and_its_redirects() -> None:
    scope = {
        HOST_FORM: True,
        "path_params": {"token": TOKEN},
        "raw_path": b"/web/gradio_api/queue?x",
    }
    assert split_target(scope) == (TOKEN, "/web/gradio_api/queue?x")
    raw = [(b"Location", b"http://172.30.0.2:8000/web/"), (b"Content-Type", b"text/html")]
    out = dict(response_headers(raw, scope, "172.30.0.2", 8000))
    assert out[b"location"] == b"/web/"
    assert b"content-security-policy" not in out  # its own origin: nothing to fence off


def test_the_path_form_fences_off_its_pages() -> None:
    scope = {"path_params": {"token": TOKEN}, "raw_path": f"/ingress/{TOKEN}/web/".encode()}
    out = dict(response_headers([(b"Location", b"/web/")], scope, "172.30.0.2", 8000))
    assert out[b"location"] == f"/ingress/{TOKEN}/web/".encode()
    assert out[b"content-security-policy"] == PATH_FORM_CSP


def _request(client: str, scheme: str = "http", method: str = "GET", **headers: str) -> Request:
    return Request(
        {
            "type": "http",
            "method": method,
            "scheme": scheme,
            "path": "/ui/api/envs",
            "headers": [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()],
            "client": (client, 50000),
            "server": ("127.0.0.1", 7711),
            "query_string": b"",
        }
    )


def test_a_session_only_from_this_machine_or_over_tls() -> None:
    check_transport(_request("127.0.0.1"))
    check_transport(_request("::1"))
    check_transport(_request("192.0.2.7", scheme="https"))
    with pytest.raises(ApiError) as err:
        check_transport(_request("192.0.2.7"))
    assert err.value.status == 403 and "TLS" in err.value.message


def test_a_changing_call_needs_the_console_header() -> None:
    check_origin(_request("127.0.0.1"))  # reads need none
    check_origin(_request("127.0.0.1", method="DELETE", **{CSRF_HEADER: "1"}))
    with pytest.raises(ApiError) as err:
        check_origin(_request("127.0.0.1", method="POST"))
    assert err.value.status == 403


def test_the_page_carries_its_view_safely_and_allows_only_its_own_script() -> None:
    hostile = {"id": "env_x", "labels": {"note": "</script><script>alert(1)</script><!--"}}
    html = page.html({"gen": 3, "nodes": [hostile]}).decode()
    inline = html.split('<script type="application/json" id="denv-view">', 1)[1]
    data = inline.split("</script>", 1)[0]
    assert "<" not in data
    assert json.loads(data)["nodes"][0] == hostile
    policy = page.headers()["content-security-policy"]
    assert "script-src 'sha256-" in policy and "unsafe-inline" not in policy
    assert "<!--view-->" in page.html(None).decode()  # signed out: no view


def _nodes(*pairs: tuple[str, str | None]) -> dict[str, tree.Node]:
    return {
        i: {"id": i, "kind": "env" if i[0] == "e" else "version", "parent": p} for i, p in pairs
    }


def test_changes_and_subtrees() -> None:
    before = _nodes(("v0", None), ("e1", "v0"), ("v1", "e1"), ("e2", "v1"), ("e3", "v1"))
    after = {k: dict(v) for k, v in before.items() if k != "e3"}
    after["e2"]["status"] = "deleted"
    after["e4"] = {"id": "e4", "kind": "env", "parent": "v1"}
    diff = tree.changes(before, after)
    assert {n["id"] for n in diff["upsert"]} == {"e2", "e4"} and diff["remove"] == ["e3"]
    order = tree.subtree(before, "e1")
    assert set(order) == {"e1", "v1", "e2", "e3"} and order[-1] == "e1"  # deepest first


def test_the_feed_makes_a_view_once_per_write(monkeypatch: pytest.MonkeyPatch) -> None:
    from denv.server.console import feed as feed_module

    made: list[str] = []
    monkeypatch.setattr(
        feed_module.tree, "view", lambda store, owner, base, keys: made.append(owner) or {}
    )

    class FakeStore:
        def watch(self, callback: Any) -> None:
            self.callback = callback

        def unwatch(self, callback: Any) -> None:
            pass

    store = FakeStore()
    feed = feed_module.Feed(store, "http://x", None)  # type: ignore[arg-type]
    assert feed.view("a")[0] == feed.view("a")[0] == 0
    assert made == ["a"]

    async def woken() -> bool:
        event = feed.subscribe()
        store.callback()  # a write, on the writing thread (here: this one)
        await asyncio.wait_for(event.wait(), 1)
        feed.unsubscribe(event)
        return True

    assert asyncio.run(woken())
    assert feed.view("a")[0] == 1 and made == ["a", "a"]
    assert feed.kept("a", 1) == {} and feed.kept("a", 0) is None


def test_cpu_is_the_share_of_a_core_between_two_samples() -> None:
    """The meter's arithmetic, with a node that reports fixed use (the node seam is where
    cgroups are read; the browser tests compare the real ones with the kernel's)."""
    from denv.server.console.usage import Meter, _Key, diff
    from denv.server.node.seam import Metered, Usage
    from denv.server.records import EnvRecord, EnvStatus, Runtime

    class Node:
        cpu = 10.0

        def usage(self, envs: list[Metered]) -> list[Usage]:
            return [Usage(env_id=e.env_id, memory_bytes=300 << 20, cpu_s=self.cpu) for e in envs]

    rec = EnvRecord(
        id="env_1",
        owner="o",
        version_id="ver_1",
        parent_id=None,
        project=None,
        agent_service="agent",
        egress="deny",
        labels={},
        status=EnvStatus.HEALTHY,
        start="cold",
        created_at="2026-01-01T00:00:00Z",
        expires_at="9999-12-31T00:00:00Z",
        runtime=Runtime(containers={"agent": "c1"}),
    )

    class Store:
        def list_envs(self, *args: Any) -> list[EnvRecord]:
            return [rec]

    node = Node()
    meter = Meter(Store(), node)  # type: ignore[arg-type]
    key = _Key()
    first = meter._sample("o", key)
    assert first == {"env_1": [300.0, None]}  # no CPU share before a second sample
    when, _ = key.cpu["env_1"]
    key.cpu["env_1"] = (when - 2.0, 9.0)  # 1 s of CPU in the 2 s before
    node.cpu = 10.0
    second = meter._sample("o", key)
    assert second["env_1"][1] == pytest.approx(50, abs=2)
    assert diff(first, second) == {"set": {"env_1": second["env_1"]}, "remove": []}
    assert diff(second, {}) == {"set": {}, "remove": ["env_1"]}


def test_docker_log_stamps_to_nanoseconds() -> None:
    from denv.server.docker.logtail import stamp_ns

    assert stamp_ns("1970-01-01T00:00:01.000000002Z") == 1_000_000_002
    assert stamp_ns("2026-12-03T06:13:21.5Z") - stamp_ns("2026-12-03T06:13:21Z") == 500_000_000
