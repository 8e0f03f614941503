"""`make e2e-frameworks`: the provider plumbing with a stand-in for an OpenEnv image.

The image (envs/http-standin) is plain `python -m http.server` answering GET /health,
so this checks what every framework relies on from a provider (start, ready, stop,
nothing left behind) without any OpenEnv server code. It speaks no WebSocket, so the
provider is told so (`websocket=False`).
"""

from __future__ import annotations

import httpx
import pytest
from conftest import LocalDenv, leftovers
from denv.openenv import DenvProvider

from denv import Denv

IMAGE = "denv-http-standin:latest"

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("egress", ["deny", "allow"])
def test_standin_starts_gets_ready_and_stops(denv_server: LocalDenv, egress: str) -> None:
    url, key, state_dir = denv_server[:3]
    provider = DenvProvider(server=url, api_key=key, egress=egress, websocket=False)  # type: ignore[arg-type]
    base_url = provider.start_container(IMAGE)
    env_id = provider.env_id
    assert env_id is not None
    try:
        provider.wait_for_ready(base_url, timeout_s=60)
        answer = httpx.get(f"{base_url}/health", timeout=10, trust_env=False)
        assert answer.status_code == 200
        assert answer.text.strip() == "ok"
        via = "/ingress/" if egress == "deny" else "http://127.0.0.1:"
        assert via in base_url
    finally:
        provider.stop_container()
    provider.stop_container()  # a second stop is harmless

    with Denv(url, key) as denv:
        assert denv.get_env(env_id).status.value == "deleted"
    assert not _answers(f"{base_url}/health"), "the env still answers after stop"
    left = leftovers(state_dir)
    assert not any(left.values()), left


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=10, trust_env=False).is_success
    except httpx.TransportError:  # a published port that is gone refuses the connection
        return False
