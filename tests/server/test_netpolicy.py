"""Network options of deny and allow envs (no Docker needed; the guard is tested in e2e)."""

from __future__ import annotations

import hashlib

from denv.server.net.policy import (
    BRIDGE_NAME_OPTION,
    allow_network_options,
    bridge_name,
    deny_network_options,
    network_name,
)

ENV_ID = "env_01JDQ5C8M9W3X7Y2Z4A6B8C0D1"


def test_deny_network_is_internal_on_a_dvd_bridge() -> None:
    labels = {"denv.managed": "true", "denv.env": ENV_ID}
    opts = deny_network_options(ENV_ID, labels)
    assert opts["name"] == network_name(ENV_ID) == f"denv-{ENV_ID.lower()}"
    assert opts["internal"] is True and opts["driver"] == "bridge"
    bridge = opts["options"][BRIDGE_NAME_OPTION]
    assert bridge == "dvd" + hashlib.sha256(ENV_ID.encode()).hexdigest()[:12]
    assert len(bridge) == 15  # IFNAMSIZ - 1: Linux refuses longer interface names
    assert opts["labels"] == labels and opts["labels"] is not labels


def test_allow_network_is_a_normal_dva_bridge() -> None:
    opts = allow_network_options(ENV_ID)
    assert opts["internal"] is False and opts["labels"] == {}
    assert opts["options"][BRIDGE_NAME_OPTION] == bridge_name(ENV_ID, deny=False)
    assert bridge_name(ENV_ID, deny=False).startswith("dva")
    assert bridge_name(ENV_ID, deny=True)[3:] == bridge_name(ENV_ID, deny=False)[3:]
    assert bridge_name(ENV_ID, deny=True) != bridge_name("env_other", deny=True)
