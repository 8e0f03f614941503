"""A compose service's own limits: parsed from both compose spellings, held to the server's."""

from __future__ import annotations

import pytest

from denv.server.lifecycle.compose import ComposeError, parse_compose
from denv.server.lifecycle.limits import service_limits
from denv.server.records import Limits, ServiceLimits

HEAD = """
x-denv: {agent: {service: app}}
services:
  app:
    image: denv-echo-env:latest
    ports: [8000]
"""


def compose(db: str) -> str:
    return (
        HEAD
        + "  db:\n    image: denv-redis:latest\n"
        + "".join(f"    {line}\n" for line in db.strip().splitlines())
    )


def service(db: str, name: str = "db"):  # type: ignore[no-untyped-def]
    return next(s for s in parse_compose(compose(db)).services if s.name == name)


def test_both_spellings_read_alike() -> None:
    short = service("mem_limit: 512m\npids_limit: 64\ncpus: 0.5")
    deploy = service("deploy:\n  resources:\n    limits: {memory: 512M, pids: 64, cpus: '0.5'}")
    for s in (short, deploy):
        assert (s.memory_mb, s.pids, s.cpus) == (512, 64, 0.5)
    assert service("mem_limit: 1g").memory_mb == 1024
    assert service("mem_limit: 536870913").memory_mb == 513  # bytes, rounded up to MiB
    assert service("").memory_mb is None


@pytest.mark.parametrize(
    ("db", "path"),
    [
        ("mem_limit: lots", "services.db.mem_limit"),
        ("mem_limit: 1m", "services.db.mem_limit"),
        ("pids_limit: 0", "services.db.pids_limit"),
        ("pids_limit: true", "services.db.pids_limit"),
        ("cpus: many", "services.db.cpus"),
        ("deploy: {replicas: 2}", "services.db.deploy.replicas"),
        ("deploy: {resources: {reservations: {}}}", "services.db.deploy.resources.reservations"),
        ("mem_limit: 1g\ndeploy: {resources: {limits: {memory: 1g}}}", "limits.memory"),
    ],
)
def test_bad_limits_are_refused_naming_the_key(db: str, path: str) -> None:
    with pytest.raises(ComposeError) as err:
        parse_compose(compose(db))
    assert path in err.value.message, err.value.message


def test_a_service_gets_at_most_the_servers_limits() -> None:
    server = Limits(memory_mb=2048, pids=1024, cpus=2.0)
    small = service_limits(service("mem_limit: 256m\npids_limit: 64"), server)
    assert small == ServiceLimits(memory_mb=256, pids=64)
    assert server.of(small) == Limits(memory_mb=256, pids=64, cpus=2.0)
    assert server.of(None) == server
    assert service_limits(service(""), server) is None
    with pytest.raises(ComposeError) as err:
        service_limits(service("mem_limit: 4g"), server)
    assert err.value.message == (
        "services.db.mem_limit: 4096 MiB is more than this server gives a container "
        "(2048 MiB, denv serve --env-memory): ask for at most that"
    )
    with pytest.raises(ComposeError, match="--env-cpus"):
        service_limits(service("cpus: 3"), server)
    # a server without a limit (0) lets a service set any
    unlimited = Limits(memory_mb=0, pids=0, cpus=0)
    assert service_limits(service("mem_limit: 64g"), unlimited) == ServiceLimits(memory_mb=65536)
