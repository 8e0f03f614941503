"""The compose subset: what parses, and errors that name the offending key."""

from __future__ import annotations

import time

import pytest

from denv.server.lifecycle.compose import ComposeError, parse_compose
from denv.server.lifecycle.compose.bounded_yaml import MAX_DEPTH, MAX_EXPANDED

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


def bomb(levels: int) -> str:
    """Nested anchors under an allowed x- key: ``*b<levels>`` is 9**(levels+1) leaves."""
    lines = ["x-bomb:", "  b0: &b0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"  b{i}: &b{i} [{', '.join([f'*b{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "service",
    [
        "{image: a, ports: [8000], environment: {B: *b9}}",
        "{image: a, ports: [8000], environment: [*b9]}",
        "{image: a, ports: [8000], command: [sh, *b9]}",
        "{image: a, ports: [[[*b9]]]}",
        "{<<: {image: a, ports: [8000], x: *b9}}",
    ],
)
def test_alias_bombs_are_refused_before_they_expand(service: str) -> None:
    # ~650 bytes that the old loader turned into a ~20 GB string via str() of the value
    text = bomb(9) + f"services:\n  agent: {service}\n" + AGENT
    started = time.monotonic()
    message = parse_error(text)
    assert time.monotonic() - started < 1
    assert message.startswith("x-bomb.b5: YAML aliases expand this to more than 1048576")
    assert message.endswith("rather than nesting aliases inside anchors")


def test_a_bomb_in_agent_service_is_refused_too() -> None:
    message = parse_error(
        bomb(9) + "services:\n  agent: {image: a, ports: [8000]}\nx-denv: {agent: {service: *b9}}\n"
    )
    assert message.startswith("x-bomb.b5: YAML aliases expand")


def test_the_bound_counts_nodes_and_characters_with_aliases_written_out() -> None:
    # one 1000-character value used n times weighs about 1006 a use (its key included)
    def text(uses: int) -> str:
        env = ", ".join(f"V{i}: *v" for i in range(uses))
        return (
            f"x-v: &v {'y' * 1000}\n"
            f"services:\n  agent: {{image: a, ports: [8000], environment: {{{env}}}}}\n" + AGENT
        )

    assert len(parse_compose(text(500)).services[0].env) == 500
    message = parse_error(text(1100))
    assert message.startswith("services.agent.environment: YAML aliases expand")
    assert MAX_EXPANDED == 1 << 20


def test_anchors_used_a_few_times_parse() -> None:
    spec = parse_compose(
        """
x-common: &common
  image: env:1
  restart: always
  environment: &env {LOG: debug, MODE: test}
x-ports: &ports ["8000"]
services:
  agent:
    <<: *common
    ports: *ports
  worker:
    <<: *common
    environment: *env
    command: [python, -m, worker]
"""
        + AGENT
    )
    assert {s.name: s.env for s in spec.services} == {
        "agent": {"LOG": "debug", "MODE": "test"},
        "worker": {"LOG": "debug", "MODE": "test"},
    }


def test_a_value_that_contains_itself_is_refused() -> None:
    text = "x-r: &r [a, *r]\nservices:\n  agent: {image: a, ports: [8000]}\n" + AGENT
    assert parse_error(text).startswith("x-r[1]: a YAML alias refers to an anchor it is inside")


def test_deep_nesting_is_refused_without_recursing() -> None:
    deep = "[" * 100_000 + "]" * 100_000  # within the contract's 256 KiB compose limit
    message = parse_error(f"services:\n  agent: {{image: a, ports: {deep}}}\n" + AGENT)
    assert message.startswith(f"compose: line 2 is nested deeper than {MAX_DEPTH} levels")
    # as deep through aliases: each anchor nests the one before it a few levels down
    lines = ["x-d:", "  d0: &d0 [x]"]
    lines += [f"  d{i}: &d{i} [[[[*d{i - 1}]]]]" for i in range(1, 20)]
    text = "\n".join(lines) + "\nservices:\n  agent: {image: a, ports: [8000]}\n" + AGENT
    assert f"nested deeper than {MAX_DEPTH} levels once YAML aliases" in parse_error(text)


def test_environment_values_are_scalars() -> None:
    text = "services:\n  agent: {image: a, ports: [8000], environment: {A: [1, 2]}}\n" + AGENT
    message = parse_error(text)
    assert message == "services.agent.environment.A: must be a string, number, boolean or null"


def test_messages_show_a_value_shortly() -> None:
    text = "services:\n  agent: {image: a, ports: [8000]}\nx-denv: {agent: {service: [" + (
        ", ".join(["long" * 50] * 200) + "]}}\n"
    )
    assert len(parse_error(text)) < 300


def test_a_file_at_the_size_limit_without_aliases_fits_the_bound() -> None:
    words = ", ".join(["a"] * 85_000)  # 255 KB of one-letter nodes: the densest file there is
    text = f"services:\n  agent: {{image: a, ports: [8000], command: [{words}]}}\n" + AGENT
    assert len(text) < 262_144  # the contract's maxLength of a compose file
    command = parse_compose(text).services[0].command
    assert command is not None and len(command) == 85_000


def test_declared_mcp_tools_are_kept_in_order_once() -> None:
    base = 'services:\n  agent: {image: "env:1", ports: ["8000"]}\n'
    assert parse_compose(base + AGENT).tools is None
    tools = "  tools: [echo_message, {name: echo_with_length}, echo_message]\n"
    assert parse_compose(base + AGENT + tools).tools == ["echo_message", "echo_with_length"]
    assert parse_compose(base + AGENT + "  tools: []\n").tools == []


@pytest.mark.parametrize(
    ("tools", "where"),
    [
        ("echo", "x-denv.tools"),
        ("[ok, ../escape]", "x-denv.tools[1]"),
        ("[{title: x}]", "x-denv.tools[0]"),
        ("[1]", "x-denv.tools[0]"),
    ],
)
def test_bad_tool_declarations_are_refused_naming_the_key(tools: str, where: str) -> None:
    base = 'services:\n  agent: {image: "env:1", ports: ["8000"]}\n'
    message = parse_error(base + AGENT + f"  tools: {tools}\n")
    assert message.startswith(where), message
