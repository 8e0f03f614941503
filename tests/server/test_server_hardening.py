"""Hardening pieces without Docker: the Authorization parse, the limits' Docker options."""

from __future__ import annotations

import pytest

from denv.server.auth import bearer, holds_api_key
from denv.server.docker.engine import limit_options
from denv.server.records import Limits


@pytest.mark.parametrize(
    ("header", "key"),
    [
        ("Bearer dak_x", "dak_x"),
        ("Bearer  dak_x", "dak_x"),
        ("bearer\tdak_x", "dak_x"),
        (" BEARER dak_x ", "dak_x"),
        ("Basic dak_x", None),
        ("dak_x", None),
        ("Bearer", None),
        ("", None),
    ],
)
def test_the_api_reads_a_bearer_key_whatever_its_spacing(header: str, key: str | None) -> None:
    assert bearer(header) == key


@pytest.mark.parametrize(
    "header", [b"Bearer dak_x", b"Bearer  dak_x", b"bearer\tdak_x", b"Basic dak_x", b"dak_x"]
)
def test_the_ingress_sees_every_header_that_holds_a_key(header: bytes) -> None:
    assert holds_api_key(header)


def test_the_ingress_leaves_an_envs_own_token() -> None:
    assert not holds_api_key(b"Bearer env-token")


def test_default_limits_are_2_gib_1024_pids_2_cpus() -> None:
    assert limit_options(Limits()) == {
        "mem_limit": 2048 << 20,
        "memswap_limit": 2048 << 20,
        "pids_limit": 1024,
        "nano_cpus": 2 * 10**9,
    }


def test_a_zero_limit_is_no_limit() -> None:
    assert limit_options(Limits(memory_mb=0, pids=0, cpus=0)) == {}
