"""`denv serve`'s options are checked before the server touches anything: a bad combination
is a UsageError carrying its message, which `main` prints and turns into exit code 2."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from denv.server import serve_cli
from denv.server.serve_options import UsageError, add_arguments, config_from_args

TLS_HALF = "--tls-cert and --tls-key go together: give both, or neither"


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="denv serve", allow_abbrev=False)
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_a_bad_combination_is_a_usage_error_with_its_message(tmp_path: Path) -> None:
    args = _args("--tls-cert", str(tmp_path / "cert.pem"), "--state-dir", str(tmp_path / "s"))
    with pytest.raises(UsageError) as caught:
        config_from_args(args)
    assert caught.value.message == TLS_HALF and str(caught.value) == TLS_HALF


def test_main_prints_the_usage_error_and_exits_2_before_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "s"
    args = _args("--tls-cert", str(tmp_path / "cert.pem"), "--state-dir", str(state))
    assert serve_cli.main(args) == 2
    assert capsys.readouterr().err == f"denv serve: {TLS_HALF}\n"
    assert not state.exists()


def test_good_options_make_the_config(tmp_path: Path) -> None:
    config = config_from_args(
        _args("--state-dir", str(tmp_path), "--env-cap-add", "cap_setuid", "--port", "0")
    )
    assert config.state_dir == tmp_path.resolve() and config.port == 0
    assert config.api_key == ""  # none given: main reads or makes <state-dir>/api_key
    assert "SETUID" in config.limits.capabilities and config.scheme == "http"


def test_live_netns_from_the_flag_or_its_env_var(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = ("--state-dir", str(tmp_path))
    monkeypatch.delenv("DENV_LIVE_NETNS", raising=False)
    assert config_from_args(_args(*state)).live_netns is True
    assert config_from_args(_args(*state, "--live-netns", "off")).live_netns is False
    monkeypatch.setenv("DENV_LIVE_NETNS", "off")
    assert config_from_args(_args(*state)).live_netns is False
    assert config_from_args(_args(*state, "--live-netns", "on")).live_netns is True
    monkeypatch.setenv("DENV_LIVE_NETNS", "yes")
    with pytest.raises(UsageError) as caught:
        config_from_args(_args(*state))
    assert "$DENV_LIVE_NETNS" in caught.value.message and "give on or off" in caught.value.message


def test_merge_pages_is_off_unless_asked(tmp_path: Path) -> None:
    state = ("--state-dir", str(tmp_path / "s"))
    assert config_from_args(_args(*state)).merge_pages is False
    assert config_from_args(_args(*state, "--merge-pages")).merge_pages is True


def test_isolation_is_runc_unless_asked_and_gvisor_runs_nothing_live(tmp_path: Path) -> None:
    state = ("--state-dir", str(tmp_path / "s"))
    assert config_from_args(_args(*state)).isolation == "runc"
    assert config_from_args(_args(*state, "--isolation", "gvisor")).isolation == "gvisor"
    with pytest.raises(UsageError, match="--isolation gvisor runs none"):
        config_from_args(_args(*state, "--isolation", "gvisor", "--merge-pages"))
