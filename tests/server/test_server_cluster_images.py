"""Where a cluster's node gets an image from (issue 27, item 4), without Docker or Ray.

``ClusterNode`` decides where an image comes from (a registry, another node, the store) and
what the error says when it is nowhere; it asks members only to do the moves. So these
members are stand-ins that hold a set of image ids and record the calls made to them (the
seam that cannot run here without a Ray cluster); tests/cluster/test_cluster_images.py and
test_isolated_nodes.py run the same on real node agents and engines.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from denv.cluster import serve
from denv.server.config import ServerConfig
from denv.server.docker.images import DEFAULT_BUDGET_MB
from denv.server.errors import from_node
from denv.server.node.cluster import options
from denv.server.node.cluster.images import names_registry
from denv.server.node.cluster.node import ClusterNode
from denv.server.node.errors import ImageNotFound, Unavailable
from denv.server.node.seam import BootFailed, ImageFacts, NodeLost
from denv.server.records import ServiceSpec

IMAGE_ID = "sha256:" + "ab" * 32


class Member:
    """A member holding ``images`` (ids; by name ``names``), recording the moves asked of it."""

    def __init__(self, name: str, images: set[str], pull_ok: bool = False) -> None:
        self.name, self.images, self.pull_ok = name, images, pull_ok
        self.calls: list[str] = []

    def inspect_image(self, image: str, pull: bool) -> ImageFacts:
        if IMAGE_ID not in self.images:
            raise ImageNotFound(f"image '{image}' is not on the engine", image)
        return ImageFacts(id=IMAGE_ID, command=[], labels={})

    def has_image(self, image_id: str) -> bool:
        return image_id in self.images

    def copy_image(self, image_id: str, origin: str) -> int:
        self.calls.append(f"copy_image from {origin}")
        if image_id not in MEMBERS[origin].images:
            raise NodeLost(origin, "its offer failed")
        self.images.add(image_id)
        return 1

    def pull_image(self, ref: str, image_id: str) -> None:
        self.calls.append(f"pull_image {ref}")
        if not self.pull_ok:
            raise ValueError(f"pulling {ref} failed: no such host")
        self.images.add(image_id)


MEMBERS: dict[str, Member] = {}


def cluster(**holding: bool) -> ClusterNode:
    MEMBERS.clear()
    MEMBERS.update({n: Member(n, {IMAGE_ID} if has else set()) for n, has in holding.items()})
    node = ClusterNode(lambda: MEMBERS)  # type: ignore[arg-type, return-value]
    node.members.refresh(force=True)
    return node


def service(ref: str) -> ServiceSpec:
    return ServiceSpec(name="agent", image=ref, image_digest=IMAGE_ID, ports=[8000])


def test_a_node_that_lacks_the_image_copies_it_from_one_that_has_it() -> None:
    node = cluster(a=True, b=False)
    node.images.ensure("b", [service("my-env:1")])
    assert MEMBERS["b"].calls == ["copy_image from a"]
    node.images.ensure("b", [service("my-env:1")])  # it has it now: nothing more
    assert MEMBERS["b"].calls == ["copy_image from a"] and not MEMBERS["a"].calls


def test_a_registry_name_is_pulled_first_and_a_failed_pull_falls_through() -> None:
    node = cluster(a=True, b=False)
    node.images.ensure("b", [service("registry.example:5000/team/env:1")])
    assert MEMBERS["b"].calls == [
        "pull_image registry.example:5000/team/env:1",
        "copy_image from a",
    ]


def test_an_image_nowhere_fails_the_env_naming_image_and_node() -> None:
    node = cluster(a=False, b=False)
    with pytest.raises(BootFailed) as failed:
        node.images.ensure("b", [service("ghcr.io/team/env:1")])
    message = failed.value.message
    assert "image 'ghcr.io/team/env:1'" in message and "node b " in message, message
    assert "pulling ghcr.io/team/env:1 failed" in message, message


def test_a_create_of_an_image_on_no_node_is_refused_naming_the_nodes_asked() -> None:
    node = cluster(a=False, b=False)
    with pytest.raises(ImageNotFound) as refused:
        node.inspect_image("my-env:1", False)
    assert from_node(refused.value).status == 422 and refused.value.code == "image_not_found"
    assert refused.value.details == {"image": "my-env:1", "nodes": ["a", "b"]}
    assert "image 'my-env:1'" in refused.value.message
    assert "(a, b)" in refused.value.message, refused.value.message
    assert refused.value.message.endswith(", or pass pull: true")  # the CLI rewords it
    assert cluster(a=False, b=True).inspect_image("my-env:1", False).id == IMAGE_ID


def test_a_create_when_no_node_answers_is_503_not_a_missing_image() -> None:
    node = cluster(a=True)

    def lost(image: str, pull: bool) -> ImageFacts:
        raise NodeLost("a", "its agent restarts")

    MEMBERS["a"].inspect_image = lost  # type: ignore[method-assign]
    with pytest.raises(Unavailable) as refused:
        node.inspect_image("my-env:1", False)
    answer = from_node(refused.value)
    assert (answer.status, answer.code) == (503, "engine_unavailable")


@pytest.mark.parametrize(
    ("ref", "registry"),
    [
        ("denv-echo-env:latest", False),
        ("team/env:1", False),
        ("ghcr.io/team/env:1", True),
        ("localhost:5000/env", True),
        ("localhost/env", True),
        ("registry:5000/env@sha256:" + "0" * 64, True),
    ],
)
def test_which_names_name_a_registry(ref: str, registry: bool) -> None:
    assert names_registry(ref) is registry


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_image_budget_flag_reaches_every_agent(tmp_path: Path) -> None:
    got = options.settings(_args("--cluster", "auto", "--node-image-budget", "512"))
    assert got is not None and got.image_budget_mb == 512
    assert serve.agent_config(got, ServerConfig(tmp_path, "dak_test")).image_budget_mb == 512
    default = options.settings(_args("--cluster", "auto"))
    assert default is not None
    assert (
        serve.agent_config(default, ServerConfig(tmp_path, "dak_test")).image_budget_mb
        == DEFAULT_BUDGET_MB
    )
    with pytest.raises(ValueError, match="--node-image-budget is >= 0"):
        options.settings(_args("--cluster", "auto", "--node-image-budget", "-1"))
    with pytest.raises(ValueError, match="add --cluster"):
        options.settings(_args("--node-image-budget", "512"))
