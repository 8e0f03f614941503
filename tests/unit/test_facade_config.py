"""Where Denv finds its server and key: argument, then DENV_SERVER/DENV_API_KEY, then the
running local server (denv.client.local), else a DenvConfigError that says what to set.

`denv.client.local.read_local_server` is replaced by a stand-in: finding a real local server
is tested end to end; what is tested here is the order the facade consults it in, and that it
does so on first use, not in the constructor.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from facade_fakes import KEY

import denv.client.local
from denv import Denv, DenvConfigError

OTHER_KEY = "dak_" + "o" * 43


@dataclass
class _Local:
    url: str
    api_key: str


def _local_server(monkeypatch: pytest.MonkeyPatch, found: _Local | None) -> list[int]:
    calls: list[int] = []

    def read_local_server(state_dir: object = None) -> _Local | None:
        calls.append(1)
        return found

    monkeypatch.setattr(denv.client.local, "read_local_server", read_local_server)
    # These servers answer (a missing key is then what is wrong); one nobody answers at is
    # tests/unit/test_unreachable_server.py's.
    monkeypatch.setattr(denv.client.local, "_check_reachable", lambda server: None)
    return calls


def test_arguments_come_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DENV_SERVER", "http://env.example:1")
    monkeypatch.setenv("DENV_API_KEY", OTHER_KEY)
    calls = _local_server(monkeypatch, _Local("http://127.0.0.1:7711", OTHER_KEY))
    denv = Denv("http://arg.example:2/", KEY)
    assert denv.server == "http://arg.example:2"
    assert denv._api.get_httpx_client().headers["authorization"] == f"Bearer {KEY}"
    assert calls == []  # the local server is not even looked for


def test_environment_comes_second(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DENV_SERVER", "http://env.example:1")
    monkeypatch.setenv("DENV_API_KEY", KEY)
    _local_server(monkeypatch, _Local("http://127.0.0.1:7711", OTHER_KEY))
    denv = Denv()
    assert denv.server == "http://env.example:1"
    assert denv._api.get_httpx_client().headers["authorization"] == f"Bearer {KEY}"


def test_the_running_local_server_comes_last(monkeypatch: pytest.MonkeyPatch) -> None:
    _local_server(monkeypatch, _Local("http://127.0.0.1:40001", KEY))
    denv = Denv()
    assert denv.server == "http://127.0.0.1:40001"
    assert denv._api.get_httpx_client().headers["authorization"] == f"Bearer {KEY}"


def test_the_local_key_is_only_used_for_the_local_server(monkeypatch: pytest.MonkeyPatch) -> None:
    _local_server(monkeypatch, _Local("http://127.0.0.1:40001", KEY))
    with pytest.raises(DenvConfigError, match="no API key for the denv server at http://hosted"):
        Denv("http://hosted.example").health()
    # ...but an explicit server that is the local one gets its key.
    assert Denv("http://127.0.0.1:40001/").server == "http://127.0.0.1:40001"


def test_no_server_anywhere_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    _local_server(monkeypatch, None)
    with pytest.raises(DenvConfigError) as info:
        Denv().health()
    message = str(info.value)
    assert "denv serve" in message
    assert "DENV_SERVER" in message and "DENV_API_KEY" in message


def test_the_constructor_does_no_io(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _local_server(monkeypatch, None)
    client = Denv()  # no server anywhere: the error comes on first use
    assert calls == []
    assert repr(client) == "Denv(server=None)"
    with pytest.raises(DenvConfigError, match="denv serve"):
        _ = client.server
    assert calls == [1]
    client.close()
    with pytest.raises(RuntimeError, match="closed"):
        client.health()


def test_from_environment_finds_the_server_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _local_server(monkeypatch, _Local("http://127.0.0.1:40001", KEY))
    client = Denv.from_environment()
    assert calls == [1]
    assert client.server == "http://127.0.0.1:40001"
    _local_server(monkeypatch, None)
    with pytest.raises(DenvConfigError, match="denv serve"):
        Denv.from_environment()


def test_a_missing_key_names_the_variable_and_the_key_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _local_server(monkeypatch, None)
    monkeypatch.setenv("DENV_SERVER", "http://env.example:1")
    with pytest.raises(DenvConfigError) as info:
        Denv.from_environment()
    assert "DENV_API_KEY" in str(info.value)
    assert str(denv.client.local.state_dir() / "api_key") in str(info.value)


def test_default_state_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DENV_STATE_DIR", "/srv/denv")
    assert str(denv.client.local.state_dir()) == "/srv/denv"
    assert str(denv.client.local.state_dir("~/x")).endswith("/x")  # an argument comes first
    monkeypatch.delenv("DENV_STATE_DIR")
    assert denv.client.local.state_dir().parts[-3:] == (".local", "share", "denv")
