"""The web console (/ui) and an env's own OpenEnv web page, in a real headless Chromium.

One server of its own, one key, two echo envs: a live one and 84 live forks of it
(milliseconds each) for the tree of 85 envs and deletes from the page, and one with
OpenEnv's web interface on, whose page steps the env through the host form of ingress (and
which is made busy, and snapshotted, for what the lists show of use and size). Chromium is
Debian's (/usr/bin/chromium, `make test` installs it: scripts/ensure-chromium.sh), driven
by Playwright. With DENV_SCREENSHOTS=1 the tests also write docs/images/console-*.png.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from ipaddress import ip_address
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from conftest import LocalDenv, docker_engine, start_server

from denv import Denv
from denv.ingress_host import web_url
from denv.server.auth import create_api_key

pytestmark = pytest.mark.e2e

ECHO_IMAGE = "denv-echo-env:latest"
CHROMIUM = os.environ.get("DENV_CHROMIUM", "/usr/bin/chromium")
DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
TIMEOUT_MS = 30_000  # generous: CI shares 2 cores with the rest of the suite
#: The browser resolves no name but this machine's: a page's own requests elsewhere (Gradio's
#: stylesheet on fonts.googleapis.com) fail at once instead of sending a DNS query out of
#: the machine, and a slow or blocked resolver can no longer hold up a page that waits for
#: that stylesheet. The console's 127.0.0.1 is excluded too: the rule would map it.
LOCAL_NAMES_ONLY = "--host-resolver-rules=" + ", ".join(
    ("MAP * ~NOTFOUND", "EXCLUDE localhost", "EXCLUDE *.localhost", "EXCLUDE 127.0.0.1")
)
#: OpenEnv's web interface on, as the Hub's envs set it. Not the live root: Gradio starts
#: threads at import (analytics, unless GRADIO_ANALYTICS_ENABLED=False), and live forks of
#: its server slowed down and timed out past 40 children here.
WEB_ENV = {"ENABLE_WEB_INTERFACE": "true"}


def shot(page: Any, name: str) -> None:
    """A screenshot for docs/console.md, only when asked (CI leaves the tree clean)."""
    if os.environ.get("DENV_SCREENSHOTS") == "1":
        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(DOCS_IMAGES / f"console-{name}.png"))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="install the dev group")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: install it (scripts/ensure-chromium.sh)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", LOCAL_NAMES_ONLY])
        yield b
        b.close()


class Keyed:
    """A key of its own on the session's server, its client, and its live echo env."""

    def __init__(self, server: LocalDenv, key: str, denv: Denv, root: Any, web: Any) -> None:
        self.server = server
        self.key = key
        self.denv = denv
        self.root = root  # live: the fork tree's root
        self.web = web  # OpenEnv's web interface on

    def live_ids(self) -> set[str]:
        return {e.id for e in self.denv.list_envs() if str(e.status) != "deleted"}


@pytest.fixture(scope="module")
def console_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    """A server of this module's own: a tree of 85 envs passes the default 64 per key."""
    docker_engine(ECHO_IMAGE)
    state = tmp_path_factory.mktemp("console-state")
    with start_server(state, "--max-envs-per-key", "200") as srv:
        yield srv


@pytest.fixture(scope="module")
def keyed(console_server: LocalDenv) -> Iterator[Keyed]:
    key = create_api_key(console_server.state_dir)
    with Denv(console_server.url, key) as denv:
        # The web env boots while the live root does (it is waited for where it is used).
        web = denv.create_sandbox(ECHO_IMAGE, ports=[8000], env=WEB_ENV, wait="running")
        root = denv.create_sandbox(ECHO_IMAGE, ports=[8000], live=True)
        yield Keyed(console_server, key, denv, root, web)


def signed_in(browser: Any, server: LocalDenv, key: str) -> Any:
    """A page of a fresh browser context, signed in to the console with ``key``."""
    page = browser.new_context(viewport={"width": 1280, "height": 760}).new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(f"{server.url}/ui")
    page.wait_for_selector("#sign-in:not([hidden])")
    page.fill("#key", key)
    page.click("#sign-in button")
    page.wait_for_selector("#live.on")
    return page


class Requests:
    """Every request a page makes from now on: its status, and Chromium's failure
    (``net::ERR_...``) when it failed; a request still open (an event stream) has neither."""

    def __init__(self, page: Any) -> None:
        self.made: list[Any] = []
        self.status: dict[Any, int] = {}
        self.failure: dict[Any, str] = {}
        page.on("request", lambda r: self.made.append(r))
        page.on("response", lambda r: self.status.__setitem__(r.request, r.status))
        page.on("requestfailed", lambda r: self.failure.__setitem__(r, r.failure or "failed"))

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.made]

    def failed(self) -> list[str]:
        """``"<status or failure> <url>"`` of each request that failed: a status >= 400, or
        a failure. Not counted: a stream the page itself closed after its answer (ERR_ABORTED
        after a status below 400: Gradio's queue stream once its events are in), and a request
        to a name that is not this machine's (a stylesheet on the internet: LOCAL_NAMES_ONLY
        refuses it, as a machine without a network would). A request to an address (an
        env's container) or to localhost counts."""
        out = []
        for request in self.made:
            status = self.status.get(request)
            failure = self.failure.get(request)
            if failure is None:
                if status is not None and status >= 400:
                    out.append(f"{status} {request.url}")
                continue
            if failure == "net::ERR_ABORTED" and status is not None and status < 400:
                continue
            host = urlsplit(request.url).hostname or ""
            local = host == "localhost" or host.endswith(".localhost") or _is_address(host)
            if failure == "net::ERR_NAME_NOT_RESOLVED" and not local:
                continue
            out.append(f"{failure} {request.url}")
        return out


def _is_address(host: str) -> bool:
    try:
        ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def row_ids(page: Any, selector: str) -> set[str]:
    return set(page.eval_on_selector_all(selector, "els => els.map(e => e.dataset.id)"))


MIB = 1 << 20


def cgroup_mib(pattern: str) -> float:
    """Memory in use (MiB) of the one cgroup ``pattern`` (under the v1 memory hierarchy,
    as on this machine's hosts) names: read here, beside what the page shows."""
    [path] = Path("/sys/fs/cgroup/memory").glob(f"{pattern}/memory.usage_in_bytes")
    return int(path.read_text()) / MIB


def live_mib(env_id: str) -> float:
    """A live env's memory as the console counts it: its server's own cgroup; for its
    container's first server (the env its container is labelled with), also what the
    container holds outside every server's cgroup."""
    [own] = Path("/sys/fs/cgroup/memory").glob(f"*/*/denv-live/{env_id}")
    container = own.parent.parent
    mib = cgroup_mib(str(own.relative_to("/sys/fs/cgroup/memory")))
    if container_of(env_id) == container.name:
        servers = [d for d in own.parent.iterdir() if d.is_dir()]
        mib += cgroup_mib(str(container.relative_to("/sys/fs/cgroup/memory")))
        mib -= sum(cgroup_mib(str(d.relative_to("/sys/fs/cgroup/memory"))) for d in servers)
    return mib


def shown_mib(page: Any, env_id: str) -> float:
    """The memory the env list shows for ``env_id``, once it shows one."""
    cell = f"#env-rows .row[data-id='{env_id}'] .mem"
    page.wait_for_function(f'() => /MiB/.test(document.querySelector("{cell}")?.textContent)')
    return float(page.inner_text(cell).split()[0])


def container_of(env_id: str) -> str:
    out = subprocess.run(
        ["docker", "ps", "-q", "--no-trunc", "--filter", f"label=denv.env={env_id}"],
        capture_output=True,
        text=True,
        check=True,
    )
    [cid] = out.stdout.split()
    return cid


def test_sign_in_and_the_env_list_matches_the_api(browser: Any, keyed: Keyed) -> None:
    page = browser.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(f"{keyed.server.url}/ui")
    page.wait_for_selector("#sign-in:not([hidden])")
    shot(page, "sign-in")
    page.fill("#key", "dak_" + "x" * 43)  # a wrong key: refused, nothing shown
    page.click("#sign-in button")
    page.wait_for_selector("#sign-in-error:has-text('not known')")
    assert page.locator("#env-rows .row").count() == 0
    page.fill("#key", keyed.key)
    page.click("#sign-in button")
    page.wait_for_selector(f"#env-rows .row[data-id='{keyed.root.id}']")
    assert row_ids(page, "#env-rows .row") == keyed.live_ids()
    row = page.locator(f"#env-rows .row[data-id='{keyed.root.id}']")
    assert "live" in row.inner_text()
    assert "denv-echo-env:latest" in row.inner_text()
    # The key is in no URL and in no cookie a script can read.
    assert keyed.key not in page.url
    assert page.evaluate("document.cookie") == ""
    cookie = next(c for c in page.context.cookies() if c["name"] == "denv_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
    # What the live env uses, from the cgroups as read here.
    shown = shown_mib(page, keyed.root.id)
    actual = live_mib(keyed.root.id)
    assert abs(shown - actual) <= max(0.25 * actual, 8), (shown, actual)
    page.wait_for_selector(f"#env-rows .row[data-id='{keyed.root.id}'] .cpu:has-text('%')")
    # An env's logs, tailing, beside its facts: a line the env writes shows without reload.
    row.locator("button[data-act='logs']").click()
    page.wait_for_selector("#detail-facts dd")
    page.wait_for_selector("#logs-state:has-text('tailing')")
    assert keyed.root.id in page.inner_text("#detail-title")
    marker = f"console-tail-{secrets.token_hex(4)}"
    assert marker not in page.inner_text("#logs")
    httpx.get(f"{keyed.root.endpoints[0].url}/health?{marker}", timeout=10)  # its access log
    page.wait_for_selector(f"#logs:has-text('{marker}')", timeout=10_000)
    shot(page, "logs")
    page.context.close()


def test_fork_tree_of_85_renders_and_grows(browser: Any, keyed: Keyed) -> None:
    denv, root = keyed.denv, keyed.root
    # 1 + 4 + 4 * 20 = 85 envs; versions: the root's, and one per fork call (5).
    level = [c.id for c in denv.fork(root.id, 4, kind="live", wait="running").envs]
    level = [c.id for p in level for c in denv.fork(p, 20, kind="live", wait="running").envs]
    page = signed_in(browser, keyed.server, keyed.key)
    page.wait_for_selector("#count-envs:text('86')")  # the tree's 85 and the web env
    page.wait_for_selector("#env-rows .row .mem:has-text('MiB')")  # live forks' use too
    shot(page, "envs")
    page.goto(f"{keyed.server.url}/ui#tree/{root.id}")
    page.wait_for_selector("#tree-counts[data-envs='85']")
    assert page.get_attribute("#tree-counts", "data-versions") == "6"
    assert page.get_attribute("#tree", "data-rows") == "91"  # each env and version a row
    # Only the rows on screen are in the page; the last one is there once scrolled to.
    page.eval_on_selector("#tree", "el => { el.scrollTop = el.scrollHeight; }")
    page.wait_for_selector(f"#tree .node[data-id='{level[-1]}']")
    page.eval_on_selector("#tree", "el => { el.scrollTop = 0; }")
    shot(page, "tree")
    # A fork made through the API appears without a reload: pushed, not polled.
    t0 = time.monotonic()
    child = denv.fork(level[0], 1, kind="live", wait="running").envs[0]
    answered = time.monotonic()
    page.wait_for_selector(f"#tree .node[data-id='{child.id}']")
    seen = time.monotonic()
    assert page.get_attribute("#tree-counts", "data-envs") == "86"
    print(f"fork answered in {answered - t0:.3f} s, in the tree {seen - answered:.3f} s later")
    page.context.close()


def test_delete_from_the_page_and_the_api_agrees(browser: Any, keyed: Keyed) -> None:
    denv = keyed.denv
    fork = denv.fork(keyed.root.id, 2, kind="live", wait="running")
    one, other = (e.id for e in fork.envs)
    grand = denv.fork(other, 2, kind="live", wait="running").envs
    page = signed_in(browser, keyed.server, keyed.key)
    page.on("dialog", lambda d: d.accept())
    page.click(f"#env-rows .row[data-id='{one}'] button[data-act='delete']")
    page.wait_for_selector(f"#notice:has-text('deleted {one}')")
    page.wait_for_selector(f"#env-rows .row[data-id='{one}']", state="detached")
    assert str(denv.get_env(one).status) == "deleted"
    # A subtree: the env and both its children, from the tree view.
    page.goto(f"{keyed.server.url}/ui#tree/{other}")
    page.click(f"#tree .node[data-id='{other}'] button[data-act='delete-subtree']")
    page.wait_for_selector("#notice:has-text('deleted 3 envs')")
    for env_id in (other, *(g.id for g in grand)):
        assert str(denv.get_env(env_id).status) == "deleted"
    page.context.close()


def test_echo_web_page_through_ingress_steps_the_env(browser: Any, keyed: Keyed) -> None:
    from openenv.core import GenericEnvClient

    # Gradio makes its boot slow: on 2 busy cores it has taken more than the default 60 s.
    web = keyed.denv.wait_env(keyed.web.id, "healthy", timeout_s=240)
    assert str(web.status) == "healthy"
    page = signed_in(browser, keyed.server, keyed.key)
    # Its row, wherever it is in the list: the tree view of an env scrolls to it.
    page.goto(f"{keyed.server.url}/ui#tree/{keyed.web.id}")
    link = page.get_attribute(f"#tree .node[data-id='{keyed.web.id}'] a.web", "href")
    ingress = keyed.web.endpoints[0].url
    assert link == web_url(ingress, "/web/")
    # `denv open ENV` prints the same URL.
    cli = subprocess.run(
        [sys.executable, "-m", "denv", "open", keyed.web.id],
        env={**os.environ, "DENV_SERVER": keyed.server.url, "DENV_API_KEY": keyed.key},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.strip() == link
    # Chromium fails every request in flight when an address of this machine changes
    # (net::ERR_NETWORK_CHANGED), and the tests beside this one add and remove bridges all
    # the time: the page is loaded again then, at most twice; any other failure is the page's.
    for attempt in range(3):
        requests = Requests(page)
        # Opened as a client's base URL gives it (the path form, a DenvProvider's base_url
        # plus /web/), the page is sent to the host form, where its absolute paths are the env's.
        page.goto(f"{ingress}/web/")
        stepped: Exception | None = None
        try:
            page.get_by_role("button", name="Reset").click()
            page.locator("textarea").first.fill(f"stepped from the browser {attempt}")
            page.get_by_role("button", name="Run step").click()
            page.get_by_text(f"stepped from the browser {attempt}").nth(1).wait_for()
        except Exception as exc:
            stepped = exc
        failed = requests.failed()
        changed = bool(failed) and all("ERR_NETWORK_CHANGED" in f for f in failed)
        if not changed or attempt == 2:
            break
    if stepped is not None:  # say what the page got, not only what it did not show
        raise AssertionError(f"the page did not step the env; failed: {failed}") from stepped
    shot(page, "echo-web")
    # Its document, scripts, theme, API calls and event stream: all through ingress.
    assert failed == [], f"{len(failed)} of the page's requests failed:\n" + "\n".join(failed)
    assert page.url == link
    assert any(u.startswith(link + "theme.css") for u in requests.urls), requests.urls
    with GenericEnvClient(base_url=ingress).sync() as client:
        state = client.state()
    state = dict(state.model_dump() if hasattr(state, "model_dump") else state)
    assert state["last_message"] == f"stepped from the browser {attempt}"
    assert state["step_count"] >= 1
    page.context.close()


def test_another_key_and_no_key_see_nothing(browser: Any, keyed: Keyed) -> None:
    import httpx

    url = keyed.server.url
    other = create_api_key(keyed.server.state_dir)
    page = signed_in(browser, keyed.server, other)
    assert row_ids(page, "#env-rows .row") == set()
    mine = keyed.live_ids()
    seen = page.evaluate(
        """async (id) => {
            const r = await fetch('/ui/api/envs/' + id);
            return r.status;
        }""",
        keyed.root.id,
    )
    assert seen == 404
    page.goto(f"{url}/ui#tree/{keyed.root.id}")
    page.wait_for_selector("#tree-counts")
    assert row_ids(page, "#tree .node") & mine == set()
    page.context.close()
    # Without a cookie: 401 for every call, and the stream says nothing.
    with httpx.Client(base_url=url, timeout=10) as http:
        for path in ("/ui/api/whoami", "/ui/api/events", f"/ui/api/envs/{keyed.root.id}"):
            assert http.get(path).status_code == 401, path
        http.cookies.set("denv_console", "dak_" + "y" * 43)
        assert http.get("/ui/api/whoami").status_code == 401
        # A changing call without the console's header is refused even with the cookie.
        http.cookies.set("denv_console", keyed.key)
        assert http.get("/ui/api/whoami").status_code == 200
        assert http.delete(f"/ui/api/envs/{keyed.root.id}").status_code == 403
    assert keyed.root.id in keyed.live_ids()


def test_the_lists_show_use_and_size(browser: Any, keyed: Keyed) -> None:
    """A busy env's CPU and its memory in the env list, a version's size in the Versions tab,
    against what the kernel and the API say. The web env: a container of its own."""
    web = keyed.denv.wait_env(keyed.web.id, "healthy", timeout_s=240)
    cid = container_of(web.id)
    # What the env's volume holds, then a version of it: its size is what the disk holds.
    write = "head -c 3000000 /dev/urandom > /work/console-blob"
    subprocess.run(["docker", "exec", cid, "sh", "-c", write], check=True, timeout=60)
    version = keyed.denv.snapshot(web.id)
    assert version.size_bytes >= 3_000_000
    # A busy process in the env, for 45 s at most (or until the env is deleted).
    spin = "import time; end = time.time() + 45\nwhile time.time() < end: pass"
    subprocess.run(["docker", "exec", "-d", cid, "python", "-c", spin], check=True, timeout=60)
    page = signed_in(browser, keyed.server, keyed.key)
    page.goto(f"{keyed.server.url}/ui#envs")
    # The oldest env is the list's last row: shown once scrolled to.
    page.wait_for_selector("#env-rows .row")
    page.eval_on_selector("#env-rows", "el => { el.scrollTop = el.scrollHeight; }")
    busy = f"#env-rows .row[data-id='{web.id}'] .cpu"
    # Sampled by the server every few seconds and pushed: >= 15% of a core for a spinning
    # process on 2 shared cores.
    page.wait_for_function(
        f'() => parseInt(document.querySelector("{busy}")?.textContent) >= 15',
        timeout=30_000,
    )
    shown = shown_mib(page, web.id)
    actual = cgroup_mib(f"*/{cid}")
    assert abs(shown - actual) <= max(0.25 * actual, 8), (shown, actual)
    shot(page, "envs-use")
    page.goto(f"{keyed.server.url}/ui#versions")
    size = f"#version-rows .row[data-id='{version.id}'] .size"
    page.wait_for_selector(size)
    assert page.inner_text(size) == f"{version.size_bytes / MIB:.1f} MiB"
    shot(page, "versions")
    page.context.close()
