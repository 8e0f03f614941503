"""What DenvProvider does in each provider cassette, shared by the recorder and the replay.

scripts/record_provider_cassettes.py runs each scenario against a real local server (a key
of its own per scenario) and saves the HTTP that went over the wire as
tests/cassettes/provider_<name>.yaml; test_provider_cassettes.py runs the same function on
the replayed cassette. Running the very same code is what makes the replayed requests line up.

The WebSocket half of readiness is a seam (`DenvProvider.ws_probe`): vcrpy records HTTP
only, so the recorder runs the real probe against the real env and the replay passes a
stand-in that notes which URLs it was asked about.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from denv.openenv import DenvProvider, EnvReadyTimeout, EnvStartError
from denv.openenv._readiness import WebSocketProbe

from denv import DenvError

# Equal to facade_scenarios / scripts/record_cassettes.py (what the scrubber writes).
CASSETTE_SERVER = "http://127.0.0.1:7711"
CASSETTE_KEY = "dak_CASSETTE_KEY"

IMAGE = "denv-echo-env:latest"
PROBE_IMAGE = "denv-base-probe:latest"
MISSING_IMAGE = "denv-no-such-image:latest"
BAD_KEY = "dak_" + "x" * 43
CRASH_LATER = [
    "python3",
    "-c",
    "import sys, time; print('booting', flush=True); time.sleep(1.5); "
    "print('boom: lost the database', flush=True); sys.exit(3)",
]
NEVER_LISTENS = ["python3", "-c", "import time; print('booting', flush=True); time.sleep(600)"]
READY_TIMEOUT_S = 3.0

Scenario = Callable[[str, str, WebSocketProbe], Any]
SCENARIOS: dict[str, Scenario] = {}


def scenario(fn: Scenario) -> Scenario:
    SCENARIOS[fn.__name__] = fn
    return fn


def _provider(server: str, key: str, ws_probe: WebSocketProbe, **kw: Any) -> DenvProvider:
    # Detached, as the facade's cassettes: a lease's renewals come on a timer, which no
    # recording can line up (tests/e2e/test_leases.py covers them on a real server).
    provider = DenvProvider(
        server=server, api_key=key, labels={"cassette": "provider"}, detach=True, **kw
    )
    provider.ws_probe = ws_probe
    return provider


def _failure(call: Callable[[], object]) -> BaseException:
    try:
        call()
    except (DenvError, EnvStartError, EnvReadyTimeout) as exc:
        return exc
    raise AssertionError("expected the call to fail")


@scenario
def start(server: str, key: str, ws_probe: WebSocketProbe) -> dict[str, Any]:
    with _provider(server, key, ws_probe) as provider:
        base_url = provider.start_container(IMAGE, env_vars={"GREETING": "hi"})
        return {"base_url": base_url, "env_id": provider.env_id}


@scenario
def ready(server: str, key: str, ws_probe: WebSocketProbe) -> dict[str, Any]:
    with _provider(server, key, ws_probe) as provider:
        base_url = provider.start_container(IMAGE)
        provider.wait_for_ready(base_url)
        return {"base_url": base_url, "env_id": provider.env_id}


@scenario
def fork(server: str, key: str, ws_probe: WebSocketProbe) -> dict[str, Any]:
    with _provider(server, key, ws_probe) as provider:
        provider.wait_for_ready(provider.start_container(IMAGE))
        child = provider.fork()
        found = {"parent": provider.env_id, "child": child.env_id, "url": child.base_url}
        found["same_config"] = child.config is provider.config  # copied whole
        found["start"] = child.start
        child.close()
        return found


@scenario
def fork_n(server: str, key: str, ws_probe: WebSocketProbe) -> dict[str, Any]:
    with _provider(server, key, ws_probe) as provider:
        provider.wait_for_ready(provider.start_container(IMAGE))
        children = provider.fork(3)
        found = {
            "parent": provider.env_id,
            "children": [c.env_id for c in children],
            "urls": [c.base_url for c in children],
            "starts": [c.start for c in children],
        }
        for child in children:
            child.close()
        return found


@scenario
def stop(server: str, key: str, ws_probe: WebSocketProbe) -> dict[str, Any]:
    provider = _provider(server, key, ws_probe)
    provider.wait_for_ready(provider.start_container(IMAGE))
    env_id = provider.env_id
    provider.stop_container()
    return {"env_id": env_id, "after": provider.env_id}


@scenario
def double_stop(server: str, key: str, ws_probe: WebSocketProbe) -> dict[str, Any]:
    from denv import Denv

    provider = _provider(server, key, ws_probe)
    first = provider.start_container(IMAGE)
    provider.stop_container()
    provider.stop_container()  # nothing left to stop: no request
    provider.close()
    # An env deleted behind the provider's back: its stop still succeeds.
    second = provider.start_container(IMAGE)
    with Denv(server, key, detach=True) as denv:
        denv.delete_env(str(provider.env_id))
    provider.stop_container()
    provider.stop_container()
    return {"urls": [first, second], "after": provider.env_id}


@scenario
def unknown_image(server: str, key: str, ws_probe: WebSocketProbe) -> BaseException:
    with _provider(server, key, ws_probe) as provider:
        return _failure(lambda: provider.start_container(MISSING_IMAGE))


@scenario
def refused_key(server: str, key: str, ws_probe: WebSocketProbe) -> BaseException:
    with _provider(server, BAD_KEY, ws_probe) as provider:
        return _failure(lambda: provider.start_container(IMAGE))


@scenario
def crash_during_start(server: str, key: str, ws_probe: WebSocketProbe) -> BaseException:
    with _provider(server, key, ws_probe, image=PROBE_IMAGE) as provider:
        return _failure(lambda: provider.wait_for_ready(provider.start_container(cmd=CRASH_LATER)))


@scenario
def readiness_timeout(server: str, key: str, ws_probe: WebSocketProbe) -> BaseException:
    with _provider(server, key, ws_probe, timeout_s=READY_TIMEOUT_S) as provider:
        return _failure(
            lambda: provider.wait_for_ready(
                provider.start_container(PROBE_IMAGE, command=NEVER_LISTENS)
            )
        )
