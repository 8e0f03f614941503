"""The server's subnet pool for env networks, without Docker (``denv.server.net.subnets``).

The end-to-end side (more envs alive than Docker's default pools hold) is in test_load.py.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from denv.server.net.subnets import SubnetPool, host_routes, parse_pool


def test_pool_skips_used_subnets_and_hands_out_distinct_ones() -> None:
    pool = SubnetPool("10.250.0.0/24", 27)  # 8 subnets
    used = ["10.250.0.0/26", "172.17.0.0/16", "fe80::/64", "not a subnet"]
    got = [pool.allocate(lambda: used) for _ in range(6)]
    nets = [ipaddress.IPv4Network(n) for n in got]
    assert len(set(nets)) == 6
    assert not any(n.overlaps(ipaddress.IPv4Network("10.250.0.0/26")) for n in nets)
    assert pool.allocate(lambda: used) is None  # every one in use: the node says so
    pool.release(got[0])
    assert pool.allocate(lambda: used) == got[0]


def test_overlap_answer_keeps_the_subnet_out_and_relearns() -> None:
    pool = SubnetPool("10.250.0.0/26", 27)  # 2 subnets
    asked: list[int] = []

    def used() -> list[str]:
        asked.append(1)
        return []

    first = pool.allocate(used)
    pool.overlapped(first)  # another server took it meanwhile
    second = pool.allocate(used)
    assert second != first and len(asked) == 2


def test_pool_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="not an IPv4 network"):
        parse_pool("10.0.0.1/16", 27)
    with pytest.raises(ValueError, match="--subnet-size"):
        parse_pool("10.0.0.0/16", 12)
    assert parse_pool("10.213.0.0/16", 27).num_addresses == 65536


def test_host_routes_are_read_without_the_default_route(tmp_path: Path) -> None:
    table = tmp_path / "route"
    table.write_text(
        "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\n"
        "eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\n"
        "eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\n"
        "dvd1\t0000D50A\t00000000\t0001\t0\t0\t0\t00FFFFFF\n"
    )
    assert host_routes(table) == [
        ipaddress.IPv4Network("192.0.2.0/24"),
        ipaddress.IPv4Network("10.213.0.0/24"),
    ]
