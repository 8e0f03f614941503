"""End to end: how DenvProvider fails, and that a failed start leaves nothing behind.

Unknown image, refused key, unknown start options, an env that crashes while starting
(at once, and after it got an address), one that never answers (readiness timeout), one
that answers /health but has no OpenEnv WebSocket, and stopping twice. A failed start also
closes the lease it opened.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from conftest import LocalDenv
from denv.openenv import DenvProvider, EnvReadyTimeout, EnvStartError, _connection
from openenv.core import GenericEnvClient
from provider_helpers import ECHO_IMAGE, PROBE_APP, PROBE_IMAGE, assert_gone, live_env_ids

from denv import Denv, InvalidRequest, Unauthorized
from denv.client import _lease
from denv.server.auth import create_api_key

pytestmark = pytest.mark.e2e

LABEL = ("suite", "test-provider-failures")
CRASH_AT_ONCE = ["python3", "-c", "import sys; print('boom: no config'); sys.exit(3)"]
CRASH_LATER = [
    "python3",
    "-c",
    "import sys, time; print('booting', flush=True); time.sleep(1.5); "
    "print('boom: lost the database', flush=True); sys.exit(3)",
]
NEVER_LISTENS = ["python3", "-c", "import time; print('booting', flush=True); time.sleep(600)"]


def provider(server: LocalDenv, **kwargs: object) -> DenvProvider:
    return DenvProvider(server=server.url, api_key=server.key, labels=dict([LABEL]), **kwargs)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def nothing_left(denv_server: LocalDenv) -> object:
    yield
    assert live_env_ids(denv_server, LABEL) == []


def test_unknown_image(denv_server: LocalDenv) -> None:
    with pytest.raises(InvalidRequest) as info:
        GenericEnvClient.from_docker_image(
            "denv-no-such-image:latest", provider=provider(denv_server)
        ).sync()
    assert info.value.code == "image_not_found"
    assert "denv-no-such-image:latest" in str(info.value) and "docker images" in str(info.value)


def test_refused_key_fails_at_once(denv_server: LocalDenv) -> None:
    refused = DenvProvider(server=denv_server.url, api_key="dak_" + "x" * 43)
    with pytest.raises(Unauthorized) as info:
        GenericEnvClient.from_docker_image(ECHO_IMAGE, provider=refused).sync()
    assert "x" * 43 not in str(info.value)
    assert refused.env_id is None


def test_unknown_start_option_is_named(denv_server: LocalDenv) -> None:
    with pytest.raises(ValueError, match="replicas"):
        GenericEnvClient.from_docker_image(
            ECHO_IMAGE, provider=provider(denv_server), replicas=2
        ).sync()


@pytest.mark.parametrize("command", [CRASH_AT_ONCE, CRASH_LATER], ids=["at-once", "later"])
def test_crash_while_starting_reports_its_logs(denv_server: LocalDenv, command: list[str]) -> None:
    p = provider(denv_server, image=PROBE_IMAGE)
    with pytest.raises(EnvStartError) as info:
        base_url = p.start_container(command=command)
        p.wait_for_ready(base_url)
    error = info.value
    assert isinstance(error, RuntimeError) and error.env_id
    assert any(line.startswith("boom:") for line in error.log_tail)
    assert "boom:" in str(error) and "deleted" in str(error)
    assert p.env_id is None
    assert_gone(denv_server, [error.env_id])


def test_readiness_timeout(denv_server: LocalDenv) -> None:
    p = provider(denv_server, image=PROBE_IMAGE, timeout_s=3.0)
    with pytest.raises(EnvReadyTimeout) as info:
        GenericEnvClient.from_docker_image(PROBE_IMAGE, provider=p, command=NEVER_LISTENS).sync()
    error = info.value
    assert isinstance(error, TimeoutError) and error.env_id
    assert "booting" in error.log_tail and "timeout_s" in str(error)
    assert_gone(denv_server, [error.env_id])


def test_health_alone_is_not_ready(denv_server: LocalDenv) -> None:
    # /health answers 200 but there is no OpenEnv WebSocket at /ws: not usable by a client.
    # (fork="volume": the 4 s are for the WebSocket check, not for the launcher's look at a
    # server that is not uvicorn.)
    p = provider(denv_server, timeout_s=4.0, fork="volume")
    base_url = p.start_container(PROBE_IMAGE, command=["python3", "-c", PROBE_APP])
    env_id = p.env_id
    with pytest.raises(EnvReadyTimeout, match=r"WebSocket upgrade on /ws"):
        p.wait_for_ready(base_url)
    assert p.env_id is None
    assert_gone(denv_server, [str(env_id)])


def test_stop_twice_and_after_close(denv_server: LocalDenv) -> None:
    p = provider(denv_server)
    client = GenericEnvClient.from_docker_image(ECHO_IMAGE, provider=p).sync()
    env_id = p.env_id
    client.close()  # stops the provider
    p.stop_container()
    p.stop_container()
    p.close()
    assert p.env_id is None and p.base_url is None
    assert_gone(denv_server, [str(env_id)])


@pytest.mark.parametrize(
    ("image", "command", "error"),
    [
        ("denv-no-such-image:latest", None, InvalidRequest),  # the create fails
        (PROBE_IMAGE, CRASH_AT_ONCE, EnvStartError),  # the readiness wait fails
    ],
    ids=["create", "ready"],
)
def test_a_failed_start_closes_the_lease_it_opened(
    denv_server: LocalDenv,
    monkeypatch: pytest.MonkeyPatch,
    image: str,
    command: list[str] | None,
    error: type[Exception],
) -> None:
    """A provider that a failed start leaves with no env lets go of its connection, as
    stop_container does: once the connection has idled, the lease the start opened is
    closed, instead of renewing until the process exits (by when its server may be gone)."""
    monkeypatch.setattr(_connection, "IDLE_KEEP_S", 0.2)  # the idle time, shortened
    made: list[_lease.LeaseKeeper] = []
    real_init = _lease.LeaseKeeper.__init__

    def init(keeper: _lease.LeaseKeeper, *args: Any, **kwargs: Any) -> None:
        real_init(keeper, *args, **kwargs)
        made.append(keeper)

    monkeypatch.setattr(_lease.LeaseKeeper, "__init__", init)  # the real one, and a record
    key = create_api_key(denv_server.state_dir)  # a connection no other test's provider shares
    p = DenvProvider(server=denv_server.url, api_key=key, labels=dict([LABEL]))
    with pytest.raises(error):
        p.wait_for_ready(p.start_container(image, command=command))
    (keeper,) = made
    assert p.env_id is None
    assert (p.server, p.api_key) == (denv_server.url, key)  # a look holds no connection
    with Denv(denv_server.url, key, lease_id=keeper.lease_id) as look:
        deadline = time.monotonic() + 10
        while (lease := look.lease()) is not None and lease.state == "open":
            assert time.monotonic() < deadline, "the failed start's lease is still open"
            time.sleep(0.1)
    assert lease is not None and lease.state == "closed", lease
    assert keeper not in _lease._open
