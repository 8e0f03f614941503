"""The console's one page: ``static/index.html`` with its stylesheet and script inside.

One response carries everything the page needs (for a signed-in key, its view too:
``routes.page``), so nothing waits for a second request. The content security policy
allows exactly that script and that stylesheet, by their SHA-256 digests, and nothing
from elsewhere: no inline handler, no other origin, no framing.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
from importlib import resources
from typing import Any

_VIEW = b"<!--view-->"


def _static(name: str) -> str:
    return resources.files("denv.server.console").joinpath("static", name).read_text()


def _digest(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


@functools.cache
def _assembled() -> tuple[bytes, dict[str, str]]:
    css, js = _static("console.css"), _static("console.js")
    html = (
        _static("index.html")
        .replace("<!--style-->", f"<style>{css}</style>")
        .replace("<!--script-->", f"<script>{js}</script>")
    )
    policy = (
        f"default-src 'none'; script-src {_digest(js)}; style-src {_digest(css)}; "
        "connect-src 'self'; img-src data:; frame-ancestors 'none'; base-uri 'none'; "
        "form-action 'self'"
    )
    headers = {
        "content-security-policy": policy,
        "x-content-type-options": "nosniff",
        "referrer-policy": "no-referrer",
        "cache-control": "no-store",  # it may hold the key's view
    }
    return html.encode(), headers


def headers() -> dict[str, str]:
    """The page's response headers (its content security policy above all)."""
    return dict(_assembled()[1])


def html(view: dict[str, Any] | None) -> bytes:
    """The page, with ``view`` (``{"gen", "nodes"}``) inside for a signed-in key."""
    page = _assembled()[0]
    if view is None:
        return page
    # Inside <script> no "<" may start a tag or a comment: written \u003c (the same JSON).
    data = json.dumps(view, separators=(",", ":")).replace("<", "\\u003c")
    inline = f'<script type="application/json" id="denv-view">{data}</script>'
    return page.replace(_VIEW, inline.encode(), 1)
