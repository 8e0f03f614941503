"""DenvProvider's checks that happen before any request: no server, no Docker needed.

What talks to a server is tested on recorded cassettes (test_provider_cassettes.py)
and end to end (tests/e2e/test_provider*.py).
"""

from __future__ import annotations

import denv.openenv
import pytest
from denv.openenv import DenvProvider, EnvReadyTimeout, EnvStartError, fork_client
from denv.openenv._readiness import _session_error, is_loopback, probe_url, websocket_url
from openenv.core import GenericEnvClient
from openenv.core.env_client import EnvClient
from openenv.core.sync_client import SyncEnvClient

KEY = "dak_" + "SeCrEt0123456789" * 2 + "abcdefghijk"


def test_unknown_start_options_are_named() -> None:
    provider = DenvProvider(server="http://denv.test", api_key=KEY, image="echo:latest")
    with pytest.raises(ValueError, match=r"bogus, colour") as info:
        provider.start_container(bogus=1, colour="red", wait_timeout=5)
    assert "wait_timeout" in str(info.value)  # says what it does accept
    assert provider.env_id is None


def test_start_without_an_image_says_where_to_give_one() -> None:
    with pytest.raises(ValueError, match=r"DenvProvider\(image=\.\.\.\)"):
        DenvProvider(server="http://denv.test", api_key=KEY).start_container()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"egress": "open"}, "egress"),
        ({"ttl_s": 0}, "ttl_s"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"warm": -1}, "warm"),
    ],
)
def test_constructor_rejects_bad_options(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DenvProvider(**kwargs)  # type: ignore[arg-type]


def test_repr_holds_no_secret() -> None:
    provider = DenvProvider(server="http://denv.test", api_key=KEY, image="echo:latest")
    text = repr(provider)
    assert KEY not in text and "dak_" not in text
    assert "echo:latest" in text and "deny" in text


def test_stop_and_close_without_an_env_do_nothing() -> None:
    provider = DenvProvider(server="http://denv.test", api_key=KEY)
    provider.stop_container()
    provider.stop_container()
    provider.close()
    with DenvProvider(server="http://denv.test", api_key=KEY) as same:
        assert same.env_id is None and same.base_url is None


def test_fork_needs_a_running_env() -> None:
    with pytest.raises(RuntimeError, match="start one first"):
        DenvProvider(server="http://denv.test", api_key=KEY).fork()
    with pytest.raises(ValueError, match="between 1 and 32"):
        DenvProvider(server="http://denv.test", api_key=KEY).fork(0)


def test_fork_client_needs_a_denv_provider() -> None:
    client = GenericEnvClient(base_url="http://127.0.0.1:9")
    with pytest.raises(TypeError, match="DenvProvider"):
        fork_client(client)
    with pytest.raises(TypeError, match="DenvProvider"):
        fork_client(client.sync())
    with pytest.raises(TypeError, match="EnvClient"):
        fork_client(object())


def test_import_adds_provider_property_and_from_denv_version() -> None:
    provider = DenvProvider(server="http://denv.test", api_key=KEY, image="echo:latest")
    client = GenericEnvClient(provider=provider)
    assert client.provider is provider
    assert client.sync().provider is provider
    assert isinstance(EnvClient.__dict__["provider"], property)
    assert isinstance(SyncEnvClient.__dict__["provider"], property)
    with pytest.raises(AttributeError):
        client.provider = None  # read-only
    assert callable(GenericEnvClient.from_denv_version)
    with pytest.raises(ValueError, match="ver_"):
        GenericEnvClient.from_denv_version("env_01JDQ5C8M9W3X7Y2Z4A6B8C0D1")
    denv.openenv.install()  # idempotent
    assert GenericEnvClient(base_url="http://x").provider is None


def test_forkable_state_helper_is_exported() -> None:
    from denv.openenv import ForkableState, forkable, restore_state, save_state

    assert all((ForkableState, forkable, restore_state, save_state))
    with pytest.raises(AttributeError):
        _ = denv.openenv.no_such_name


def test_errors_carry_env_and_log_tail() -> None:
    error = EnvStartError(
        "env env_X failed", env_id="env_X", log_tail=["Traceback", "boom"], fix="Fix it."
    )
    assert isinstance(error, RuntimeError)
    assert error.env_id == "env_X" and error.log_tail == ("Traceback", "boom")
    assert "  | boom" in str(error) and str(error).endswith("Fix it.")
    timeout = EnvReadyTimeout("slow", env_id="env_X")
    assert isinstance(timeout, TimeoutError) and "no log lines" in str(timeout)


def test_readiness_helpers() -> None:
    assert websocket_url("http://h:1/ingress/tok/") == "ws://h:1/ingress/tok/ws"
    assert websocket_url("https://h/x") == "wss://h/x/ws"
    assert is_loopback("http://127.0.0.1:7711") and is_loopback("http://localhost")
    assert not is_loopback("http://127.0.0.1.example.com") and not is_loopback("http://10.0.0.1")
    assert _session_error('{"type": "error", "data": {"message": "at capacity"}}') == (
        "/ws refused a session: at capacity"
    )
    assert _session_error('{"type": "observation"}') is None
    assert _session_error(b"not json") is None
    # The probe attaches to a session no server has: OpenEnv's answer is the probe's success.
    assert probe_url("http://h/x/") == "ws://h/x/ws?session_id=denv-readiness-probe"
    unknown = '{"type": "error", "data": {"message": "Unknown session_id: denv-readiness-probe"}}'
    assert _session_error(unknown) is None


def test_settings_are_one_frozen_config() -> None:
    import dataclasses

    provider = DenvProvider(server="http://denv.test", api_key=KEY, labels={"a": "1"}, warm=2)
    config = provider.config
    assert config.warm_fork is True  # resolved from warm > 0
    assert config.merged_labels({"b": "2"}) == {"a": "1", "b": "2"}
    assert KEY not in repr(config)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.warm = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.labels["a"] = "2"  # type: ignore[index]
    with pytest.raises(ValueError, match="egress"):
        DenvProvider(egress="open")  # type: ignore[arg-type]
