"""docs/openenv-provider.md lists every option of `DenvProvider`, in order, with its default
and where the keyword-only ones start, so the page cannot drift from the signature; and
`pull=`, which the server's "image not found" advice names, is an option that reaches the
create and whose advice reads in the provider's words.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

from denv.openenv import DenvProvider
from denv.openenv._operations import image_not_found

from denv.errors import InvalidRequest

DOC = Path(__file__).parents[2] / "docs" / "openenv-provider.md"
# One option a line: `    name=default,   # what it does`; `    *,` starts the keyword-only ones.
OPTION = re.compile(r"^\s+(\w+)=(.+?),\s*(?:#.*)?$")
KEYWORD_ONLY = "*"


def documented_options() -> list[tuple[str, Any]]:
    """The `DenvProvider(...)` block under "## Configuration": (name, default) in order, with
    ("*", None) where the keyword-only options start."""
    text = DOC.read_text()
    section = text[text.index("## Configuration") :]
    block = section[section.index("```python\nDenvProvider(") : section.index("\n)\n```")]
    options: list[tuple[str, Any]] = []
    for line in block.splitlines()[2:]:
        if line.strip() == "*,":
            options.append((KEYWORD_ONLY, None))
            continue
        found = OPTION.match(line)
        assert found, f"not an option line in {DOC.name}: {line!r}"
        options.append((found.group(1), ast.literal_eval(found.group(2))))
    return options


def signature_options() -> list[tuple[str, Any]]:
    options: list[tuple[str, Any]] = []
    params = list(inspect.signature(DenvProvider.__init__).parameters.values())[1:]  # self
    for param in params:
        if param.kind is param.KEYWORD_ONLY and (KEYWORD_ONLY, None) not in options:
            options.append((KEYWORD_ONLY, None))
        options.append((param.name, param.default))
    return options


def test_the_doc_lists_every_option_with_its_default() -> None:
    assert documented_options() == signature_options()


def test_pull_reaches_the_create() -> None:
    assert DenvProvider().config.pull is False
    provider = DenvProvider(server="http://denv.test", api_key="dak_x", pull=True)
    assert provider.config.sandbox_options(None, None, {})["pull"] is True


def _image_not_found(message: str) -> InvalidRequest:
    return InvalidRequest(message, status=422, code="image_not_found", request_id="req_1")


def test_the_image_advice_is_in_the_providers_words() -> None:
    server_says = (
        "image 'x:1' is not on the Docker Engine: build or load it first (docker build / "
        "docker load; see docker images), or pass pull: true"
    )
    not_pulled = image_not_found(_image_not_found(server_says), pulled=False)
    assert not_pulled.message.endswith("or pass DenvProvider(pull=True)")
    assert not_pulled.code == "image_not_found" and not_pulled.request_id == "req_1"
    # After a pull that failed, asking for a pull is no advice: the pull's error is.
    failed_pull = server_says.replace("Engine:", "Engine (pulling it failed: no such host):")
    pulled = image_not_found(_image_not_found(failed_pull), pulled=True)
    assert "pulling it failed: no such host" in pulled.message
    assert "pull" not in pulled.message.split("):", 1)[1]
