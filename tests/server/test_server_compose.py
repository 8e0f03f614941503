"""The compose subset: what parses, and errors that name the offending key."""

from __future__ import annotations

import pytest

from denv.server.compose import ComposeError, parse_compose

AGENT = "x-denv:\n  agent:\n    service: agent\n"


def parse_error(text: str) -> str:
    with pytest.raises(ComposeError) as info:
        parse_compose(text)
    assert info.value.code == "invalid_compose" and info.value.status == 422
    return info.value.message


def test_full_project_parses_in_dependency_order() -> None:
    spec = parse_compose(
        """
services:
  agent:
    image: env:1
    command: python -m server --port 8000
    environment: [A=1, B=two=2]
    ports: ["127.0.0.1:9000:8000", 8001/tcp]
    depends_on: {db: {condition: service_healthy}, cache: {condition: service_started}}
  db:
    image: postgres:16
    environment: {POSTGRES_PASSWORD: x, N: 3, F: false}
    volumes: [pgdata:/var/lib/postgresql/data, /scratch/]
    healthcheck: {test: [CMD-SHELL, pg_isready], interval: 1s}
  cache:
    image: redis:7
    depends_on: [db]
volumes: {pgdata: {}}
x-denv:
  agent: {service: agent, health_path: /ready}
"""
    )
    assert [s.name for s in spec.services] == ["db", "cache", "agent"]
    assert spec.agent_service == "agent" and spec.health_path == "/ready"
    agent, db = spec.services[2], spec.services[0]
    assert agent.command == ["python", "-m", "server", "--port", "8000"]
    assert agent.env == {"A": "1", "B": "two=2"}
    assert agent.ports == [8000, 8001]
    assert agent.wait_healthy == ["db"]
    assert db.env == {"POSTGRES_PASSWORD": "x", "N": "3", "F": "false"}
    assert db.volumes == ["/var/lib/postgresql/data", "/scratch"]
    assert db.healthcheck == ["sh", "-c", "pg_isready"]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("services:\n  agent: {ports: [8000]}\n" + AGENT, "services.agent.image:"),
        ("services:\n  agent: {image: a}\n" + AGENT, "services.agent.ports:"),
        ("services:\n  agent: {image: a, ports: [8000]}\n", "x-denv.agent.service:"),
        ("services:\n  agent: {image: a, ports: [x]}\n" + AGENT, "services.agent.ports[0]:"),
        (
            "services:\n  agent: {image: a, ports: [8000], privileged: true}\n" + AGENT,
            "services.agent.privileged:",
        ),
        (
            "services:\n  agent: {image: a, ports: [8000], volumes: ['./x:/y']}\n" + AGENT,
            "services.agent.volumes[0]:",
        ),
        (
            "services:\n  agent: {image: a, ports: [8000], volumes: ['v:/y']}\n" + AGENT,
            "services.agent.volumes[0]:",
        ),
        (
            "services:\n  agent: {image: a, ports: [8000], depends_on: [nope]}\n" + AGENT,
            "services.agent.depends_on:",
        ),
        (
            "services:\n  agent: {image: a, ports: [8000], depends_on: [b]}\n"
            "  b: {image: b, depends_on: [agent]}\n" + AGENT,
            "depends_on: dependency cycle",
        ),
        (
            "services:\n  agent: {image: a, ports: [8000], environment: {1X: y}}\n" + AGENT,
            "services.agent.environment.1X:",
        ),
        (
            "services:\n  agent: {image: a, ports: [8000], healthcheck: {test: [BAD]}}\n" + AGENT,
            "services.agent.healthcheck.test:",
        ),
        (
            "services:\n  agent: {image: a, ports: [8000],"
            " depends_on: {b: {condition: service_healthy}}}\n  b: {image: b}\n" + AGENT,
            "services.agent.depends_on.b.condition:",
        ),
        ("networks: {}\nservices:\n  agent: {image: a, ports: [8000]}\n" + AGENT, "networks:"),
        ("services: [", "compose:"),
        ("[]", "compose:"),
    ],
)
def test_errors_name_the_key(text: str, where: str) -> None:
    assert where in parse_error(text)


def test_a_named_volume_belongs_to_one_service() -> None:
    text = (
        "services:\n  agent: {image: a, ports: [8000], volumes: ['v:/a']}\n"
        "  b: {image: b, volumes: ['v:/b']}\nvolumes: {v: {}}\n" + AGENT
    )
    assert "already used by service 'agent'" in parse_error(text)


def test_agent_fork_declares_warm_or_cold() -> None:
    base = "services:\n  agent: {image: env:1, ports: ['8000']}\nx-denv:\n  agent:\n"
    assert parse_compose(base + "    service: agent\n").fork is None
    assert parse_compose(base + "    service: agent\n    fork: warm\n").fork == "warm"
    assert parse_compose(base + "    service: agent\n    fork: cold\n").fork == "cold"
    message = parse_error(base + "    service: agent\n    fork: hot\n")
    assert message.startswith("x-denv.agent.fork: must be 'warm' or 'cold'")
