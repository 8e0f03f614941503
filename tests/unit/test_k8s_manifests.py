"""The Kubernetes manifests of deploy/kubernetes: valid, and safe in the ways users rely on.

No Kubernetes runs here, so the manifests are checked on paper: against the API schemas of
Kubernetes 1.34 to 1.37 (scripts/k8s-validate.sh, kubernetes-validate --strict, offline), and
here for what a schema cannot say: the node agents' mount propagation, the API key kept out of
argv, deny envs without egress, limits on every container, least-privilege RBAC, and the
settings that must agree with `denv serve` (its flags, its egress ranges, its env limits).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ray._common.usage import usage_lib

from denv.cluster import ray_cluster, ray_nodes
from denv.server import serve_cli
from denv.server.config import DEFAULT_LIMITS
from denv.server.net.egress_rules import PRIVATE_RANGES
from denv.server.net.policy import DENY_DNS

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
VERSIONS = ("1.34", "1.35", "1.36", "1.37")

Resource = dict[str, Any]


def _resources() -> list[tuple[str, Resource]]:
    out = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        out += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return out


RESOURCES = _resources()


def _of_kind(kind: str) -> list[Resource]:
    return [r for _, r in RESOURCES if r["kind"] == kind]


def _one(kind: str, name: str) -> Resource:
    found = [r for r in _of_kind(kind) if r["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name} in {DEPLOY}, found {len(found)}"
    return found[0]


def _pod_specs() -> Iterator[tuple[str, Resource]]:
    """Every pod spec: of the Deployments, the DaemonSets and the env PodTemplate."""
    for _, doc in RESOURCES:
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind in ("Deployment", "DaemonSet"):
            yield f"{kind}/{name}", doc["spec"]["template"]["spec"]
        elif kind == "PodTemplate":
            yield f"{kind}/{name}", doc["template"]["spec"]


def _containers(spec: Resource) -> list[Resource]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def _all_containers() -> Iterator[tuple[str, Resource]]:
    for where, spec in _pod_specs():
        for c in _containers(spec):
            yield f"{where}/{c['name']}", c


def _validate(*args: Path) -> subprocess.CompletedProcess[str]:
    """scripts/k8s-validate.sh with its default versions (1.34 to 1.37)."""
    env = {k: v for k, v in os.environ.items() if k != "K8S_VERSIONS"}
    return subprocess.run(
        [str(ROOT / "scripts" / "k8s-validate.sh"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_every_manifest_passes_kubernetes_validate_strict_for_1_34_to_1_37() -> None:
    res = _validate()
    assert res.returncode == 0, res.stdout + res.stderr
    expected = f"{len(RESOURCES)} resources in "
    assert expected in res.stdout, res.stdout
    assert f"against Kubernetes {', '.join(VERSIONS)} ({len(RESOURCES) * 4} checks)" in res.stdout


def test_the_validation_fails_on_a_field_the_schema_does_not_know(tmp_path: Path) -> None:
    # The check above can fail: an unknown field (here a misspelt one) is an error.
    for path in DEPLOY.glob("*.yaml"):
        text = path.read_text()
        if path.name == "csidriver.yaml":
            text = text.replace("attachRequired:", "attachRequird:")
        (tmp_path / path.name).write_text(text)
    res = _validate(tmp_path)
    assert res.returncode == 1
    assert "'attachRequird' was unexpected" in res.stdout + res.stderr


def test_node_agents_mount_state_and_pod_volumes_with_bidirectional_propagation() -> None:
    agent = _one("DaemonSet", "denv-node")["spec"]["template"]["spec"]
    container = next(c for c in agent["containers"] if c["name"] == "agent")
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in agent["volumes"]}
    for path in ("/var/lib/denv", "/var/lib/kubelet"):
        assert mounts[path].get("mountPropagation") == "Bidirectional", path
        assert volumes[mounts[path]["name"]]["hostPath"]["path"] == path
    runtime = mounts["/run/containerd/containerd.sock"]
    assert volumes[runtime["name"]]["hostPath"]["type"] == "Socket"
    # Kubernetes refuses Bidirectional on a container that is not privileged (the schema
    # does not say so): every such mount anywhere must be on a privileged container.
    for where, c in _all_containers():
        for m in c.get("volumeMounts", []):
            if m.get("mountPropagation") == "Bidirectional":
                assert c.get("securityContext", {}).get("privileged") is True, where
    # Agents run on the nodes kept for envs, tainted or not.
    assert agent["nodeSelector"] == {"denv.ai/node": "true"}
    assert {"key": "denv.ai/envs", "operator": "Exists"} in agent["tolerations"]


def _agent_start(tmp_path: Path, node: str) -> list[str]:
    """The `ray` command line the agent's start script runs on node `node` (a stand-in
    `ray` prints it)."""
    agent = _one("DaemonSet", "denv-node")["spec"]["template"]["spec"]["containers"][0]
    assert agent["command"] == ["/bin/sh", "-c"]
    stub = tmp_path / "ray"
    stub.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    stub.chmod(0o755)
    res = subprocess.run(
        ["/bin/sh", "-c", agent["args"][0]],
        env={"PATH": f"{tmp_path}:/usr/bin:/bin", "NODE_NAME": node},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    argv: list[str] = json.loads(res.stdout)
    return argv


def test_node_agents_join_ray_as_denv_nodes_named_after_their_node(tmp_path: Path) -> None:
    names = {}
    for node in (
        "worker-1",
        "ip-10-0-1-23.EC2.internal",
        "gke-research-pool-large-memory-5f2a9c1e-zx8q",
        "gke-research-pool-large-memory-5f2a9c1e-zx9r",
    ):
        argv = _agent_start(tmp_path, node)
        assert argv[0] == "start" and "--block" in argv
        assert "--address=denv-ray.denv-system.svc.cluster.local:6379" in argv
        (given,) = [a.removeprefix("--resources=") for a in argv if a.startswith("--resources=")]
        resources = json.loads(given)
        (name_key,) = set(resources) - {ray_cluster.RESOURCE}
        assert resources == {ray_cluster.RESOURCE: 1, name_key: 1}
        name = ray_cluster.node_name(resources, "0" * 56)
        assert name_key == ray_cluster.NAME_RESOURCE + name
        assert ray_cluster.check_name(name) == name
        assert _agent_start(tmp_path, node) == argv  # the same name after a restart
        names[node] = name
    assert names["worker-1"] == "worker-1"
    assert names["ip-10-0-1-23.EC2.internal"] == "ip-10-0-1-23-ec2-internal"
    # Long names that differ only at the end stay apart.
    long_names = [n for n in names if n.startswith("gke-")]
    assert all(len(names[n]) == 40 for n in long_names)
    assert len({names[n] for n in long_names}) == 2


def test_the_env_pod_sees_late_mounts_and_has_no_host_path() -> None:
    spec = _one("PodTemplate", "denv-env")["template"]["spec"]
    (c,) = spec["containers"]
    work = next(m for m in c["volumeMounts"] if m["mountPath"] == "/work")
    assert work["mountPropagation"] == "HostToContainer"
    assert all("hostPath" not in v for v in spec["volumes"])
    csi = next(v for v in spec["volumes"] if v["name"] == work["name"])["csi"]
    assert csi["driver"] == _one("CSIDriver", "volumes.denv.ai")["metadata"]["name"]


def test_the_api_key_is_never_in_a_command_line_or_a_literal_value() -> None:
    for where, c in _all_containers():
        argv = " ".join([*c.get("command", []), *c.get("args", [])])
        assert "dak_" not in argv, where
        assert "--api-key " not in argv and "--api-key=" not in argv, where
        for e in c.get("env", []):
            assert not (e["name"] == "DENV_API_KEY" and "value" in e), where
    # Secrets are made by hand (docs/kubernetes.md), never committed with a value.
    assert _of_kind("Secret") == []
    # The control plane reads it from a file of the mounted Secret denv-api-key.
    spec = _one("Deployment", "denv-control-plane")["spec"]["template"]["spec"]
    denv = next(c for c in spec["containers"] if c["name"] == "denv")
    key_file = next(a.split("=", 1)[1] for a in denv["args"] if a.startswith("--api-key-file="))
    mount = next(m for m in denv["volumeMounts"] if key_file.startswith(m["mountPath"] + "/"))
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == "denv-api-key"
    assert volume["secret"]["defaultMode"] == 0o400


def test_every_ray_process_joins_with_the_token_of_a_mounted_secret() -> None:
    """The Ray head, denv serve (a Ray driver) and the node agents run with Ray's token
    authentication, the token read from a file of the Secret denv-ray-token (0400)."""
    ray_containers = 0
    for kind, spec, ray in _ray_pods():
        for c in ray:
            ray_containers += 1
            env = {e["name"]: e for e in c.get("env", [])}
            assert env["RAY_AUTH_MODE"]["value"] == "token", (kind, c["name"])
            assert "RAY_AUTH_TOKEN" not in env, "the token itself in the pod spec"
            path = env["RAY_AUTH_TOKEN_PATH"]["value"]
            mount = next(m for m in c["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
            volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
            assert volume["secret"]["secretName"] == "denv-ray-token", (kind, c["name"])
            assert volume["secret"]["defaultMode"] == 0o400
            assert path.rsplit("/", 1)[1] in {i["path"] for i in volume["secret"]["items"]}
    assert ray_containers == 3, "the Ray head, denv serve and the node agent"


def test_the_control_plane_arguments_are_real_denv_serve_flags() -> None:
    spec = _one("Deployment", "denv-control-plane")["spec"]["template"]["spec"]
    denv = next(c for c in spec["containers"] if c["name"] == "denv")
    assert denv["command"] == ["denv", "serve"]
    parser = argparse.ArgumentParser(prog="denv serve", exit_on_error=False, allow_abbrev=False)
    serve_cli.add_arguments(parser)
    try:
        args = parser.parse_args(denv["args"])
    except (argparse.ArgumentError, SystemExit) as exc:
        pytest.fail(f"denv serve refuses {shlex.join(denv['args'])}: {exc}")
    # Beyond loopback: TLS, from the mounted Secret denv-tls; state on the volume.
    assert args.host == "0.0.0.0" and args.tls_cert and args.tls_key and not args.insecure
    assert str(args.state_dir).startswith("/var/lib/denv/")
    # A cluster: the Ray head in this pod; each agent's state where its DaemonSet mounts it.
    assert args.cluster == "auto"
    assert any(c["name"] == "ray-head" for c in spec["containers"])
    agent = _one("DaemonSet", "denv-node")["spec"]["template"]["spec"]["containers"][0]
    state = next(m for m in agent["volumeMounts"] if m["name"] == "state")
    assert args.node_state_dir == state["mountPath"]
    # The object store's keys come from a file of a mounted Secret, not from argv.
    assert args.store_credentials is not None
    assert any(
        str(args.store_credentials).startswith(m["mountPath"] + "/") for m in denv["volumeMounts"]
    )
    port = next(p["containerPort"] for p in denv["ports"] if p["name"] == "https")
    assert args.port == port
    service = _one("Service", "denv")["spec"]["ports"][0]
    assert service["targetPort"] == "https"


def test_deny_envs_have_no_egress_and_are_reachable_only_from_denv_system() -> None:
    deny = _one("NetworkPolicy", "env-egress-deny")["spec"]
    assert deny["podSelector"]["matchLabels"]["denv.ai/egress"] == "deny"
    assert "Egress" in deny["policyTypes"] and deny["egress"] == []
    (rule,) = deny["ingress"]
    assert "ports" not in rule
    for peer in rule["from"]:
        assert peer["namespaceSelector"] == {
            "matchLabels": {"kubernetes.io/metadata.name": "denv-system"}
        }
        assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] in (
            "control-plane",
            "node-agent",
        )
    # Everything else in denv-envs is refused unless a policy lets it through.
    default = _one("NetworkPolicy", "default-deny")["spec"]
    assert default == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    # An env pod made from the template is a deny env, without a resolver (as on Docker).
    template = _one("PodTemplate", "denv-env")["template"]
    labels = template["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in deny["podSelector"]["matchLabels"].items())
    assert template["spec"]["dnsPolicy"] == "None"
    assert template["spec"]["dnsConfig"]["nameservers"] == DENY_DNS


def test_allow_envs_reach_public_addresses_but_not_private_or_link_local_ones() -> None:
    allow = _one("NetworkPolicy", "env-egress-allow")["spec"]
    blocks = [p["ipBlock"] for rule in allow["egress"] for p in rule["to"] if "ipBlock" in p]
    by_cidr = {b["cidr"]: b["except"] for b in blocks}
    # The same ranges `denv serve` keeps allow envs out of on a Docker Engine host.
    assert by_cidr["0.0.0.0/0"] == PRIVATE_RANGES["iptables"]
    assert by_cidr["::/0"] == PRIVATE_RANGES["ip6tables"]
    assert "169.254.0.0/16" in by_cidr["0.0.0.0/0"]
    # Besides those, only the cluster's DNS, on port 53.
    others = [rule for rule in allow["egress"] if not any("ipBlock" in p for p in rule["to"])]
    (dns,) = others
    assert {p["port"] for p in dns["ports"]} == {53}
    assert dns["to"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "kube-system"
    }


def test_every_container_has_cpu_and_memory_limits() -> None:
    checked = 0
    for where, c in _all_containers():
        limits = c.get("resources", {}).get("limits", {})
        assert {"cpu", "memory"} <= limits.keys(), f"{where} has no cpu and memory limits"
        checked += 1
    assert checked >= 5  # control plane (2), node agent (2), env template (1)


def test_env_pods_have_the_limits_and_capabilities_of_denv_serve() -> None:
    (c,) = _one("PodTemplate", "denv-env")["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["memory"] == f"{DEFAULT_LIMITS.memory_mb // 1024}Gi"
    assert float(c["resources"]["limits"]["cpu"]) == DEFAULT_LIMITS.cpus
    sc = c["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": list(DEFAULT_LIMITS.capabilities)}
    assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
    spec = _one("PodTemplate", "denv-env")["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False


def test_rbac_grants_no_wildcards_and_nothing_cluster_wide() -> None:
    assert _of_kind("ClusterRole") == [] and _of_kind("ClusterRoleBinding") == []
    roles = _of_kind("Role")
    assert roles
    for role in roles:
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(field, []), (role["metadata"]["name"], rule)
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule
            assert "secrets" not in rule["resources"], rule
    # Each binding names an existing Role and ServiceAccount.
    accounts = {
        (a["metadata"]["namespace"], a["metadata"]["name"]) for a in _of_kind("ServiceAccount")
    }
    names = {(r["metadata"]["namespace"], r["metadata"]["name"]) for r in roles}
    for b in _of_kind("RoleBinding"):
        assert (b["metadata"]["namespace"], b["roleRef"]["name"]) in names
        for s in b["subjects"]:
            assert (s["namespace"], s["name"]) in accounts
    # Every pod runs under a ServiceAccount of its own, and only the node agents get a token.
    for where, spec in _pod_specs():
        assert spec.get("serviceAccountName"), where
        if "node-agent" not in where and "denv-node" not in where:
            assert spec.get("automountServiceAccountToken") is False, where


RAY_TLS_FILES = {
    "RAY_TLS_SERVER_CERT": "node.crt",
    "RAY_TLS_SERVER_KEY": "node.key",
    "RAY_TLS_CA_CERT": "ca.crt",
}


def _ray_pods() -> Iterator[tuple[str, Resource, list[Resource]]]:
    """(where, pod spec, its Ray containers): the Ray head, denv serve, the node agent."""
    for where, spec in _pod_specs():
        ray = [
            c
            for c in spec["containers"]
            if "ray start" in " ".join([*c.get("command", []), *c.get("args", [])])
            or any(a.startswith("--cluster=") for a in c.get("args", []))
        ]
        if ray:
            yield where, spec, ray


def _tls_init(spec: Resource) -> Resource:
    found: list[Resource] = [c for c in spec.get("initContainers", []) if c["name"] == "ray-tls"]
    assert len(found) == 1, "no init container ray-tls"
    return found[0]


def test_every_ray_process_speaks_mutual_tls_with_a_certificate_its_pod_made() -> None:
    """Each Ray container runs with RAY_USE_TLS=1 and files of a memory-backed volume that the
    pod's init container fills with `denv cluster tls-cert` for the pod's own address; the
    CA's key (Secret denv-ray-ca, 0400) is mounted in that init container only."""
    ray_containers = 0
    for where, spec, ray in _ray_pods():
        init = _tls_init(spec)
        volumes = {v["name"]: v for v in spec["volumes"]}
        out = next(a.split("=", 1)[1] for a in init["args"] if a.startswith("--out="))
        ca = next(a.split("=", 1)[1] for a in init["args"] if a.startswith("--ca="))
        assert init["command"] == ["denv", "cluster", "tls-cert"], where
        assert "--address=$(POD_IP)" in init["args"], where
        pod_ip = next(e for e in init["env"] if e["name"] == "POD_IP")
        assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        mounts = {m["mountPath"]: m["name"] for m in init["volumeMounts"]}
        assert volumes[mounts[ca]]["secret"]["secretName"] == "denv-ray-ca", where
        assert volumes[mounts[ca]]["secret"]["defaultMode"] == 0o400
        assert volumes[mounts[out]]["emptyDir"]["medium"] == "Memory", where
        for c in ray:
            ray_containers += 1
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            assert env["RAY_USE_TLS"] == "1", (where, c["name"])
            for var, name in RAY_TLS_FILES.items():
                assert env[var] == f"{out}/{name}", (where, c["name"], var)
            theirs = {m["mountPath"]: m for m in c["volumeMounts"]}
            assert theirs[out]["name"] == mounts[out] and theirs[out]["readOnly"], c["name"]
            assert ca not in theirs, f"{where}/{c['name']} mounts the CA's key"
    assert ray_containers == 3, "the Ray head, denv serve and the node agent"


def _tls_cert_argv(spec: Resource, pod_ip: str) -> list[str]:
    """The init container's command line, as the kubelet runs it for a pod at ``pod_ip``."""
    init = _tls_init(spec)
    return [*init["command"], *(a.replace("$(POD_IP)", pod_ip) for a in init["args"])]


def test_the_certificates_the_pods_make_pass_a_mutual_tls_handshake(tmp_path: Path) -> None:
    """The init containers' own command lines, run here (a CA made by `denv cluster tls-ca`,
    as docs/kubernetes.md says): a node agent's certificate and the control plane's
    complete a mutual TLS handshake on loopback, the agent checking the name it dials the
    Ray head by (node-agent.yaml's `ray start --address`), and each side the CA."""
    cli = [sys.executable, "-m", "denv"]
    ca = tmp_path / "ca"
    subprocess.run([*cli, "cluster", "tls-ca", "--out", str(ca)], check=True, timeout=60)
    assert (ca / "ca.key").stat().st_mode & 0o777 == 0o600
    made = {}
    for name, kind, ip in (
        ("head", "Deployment/denv-control-plane", "10.42.0.7"),
        ("agent", "DaemonSet/denv-node", "10.42.1.9"),
    ):
        spec = dict(_pod_specs())[kind]
        argv = _tls_cert_argv(spec, ip)
        argv = [a.replace("/etc/denv/ray-ca", str(ca)) for a in argv]
        argv = [a.replace("/etc/denv/ray-tls", str(tmp_path / name)) for a in argv]
        subprocess.run([*cli, *argv[1:]], check=True, timeout=60)
        assert not (tmp_path / name / "ca.key").exists(), "the CA's key copied beside the cert"
        made[name] = tmp_path / name
    agent_args = " ".join(dict(_pod_specs())["DaemonSet/denv-node"]["containers"][0]["args"])
    head_name = agent_args.split("--address=", 1)[1].split(":", 1)[0]

    def context(side: int, who: Path) -> ssl.SSLContext:
        ctx = ssl.SSLContext(side)
        ctx.load_cert_chain(who / "node.crt", who / "node.key")
        ctx.load_verify_locations(who / "ca.crt")
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    server_ctx = context(ssl.PROTOCOL_TLS_SERVER, made["head"])
    with socket.create_server(("127.0.0.1", 0)) as listener:
        seen: list[object] = []

        def serve() -> None:
            conn, _ = listener.accept()
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                seen.append(tls.getpeercert())

        thread = threading.Thread(target=serve)
        thread.start()
        client_ctx = context(ssl.PROTOCOL_TLS_CLIENT, made["agent"])
        with (
            socket.create_connection(listener.getsockname(), timeout=10) as raw,
            client_ctx.wrap_socket(raw, server_hostname=head_name) as tls,
        ):
            peer: dict[str, Any] = dict(tls.getpeercert() or {})
        sans = {value for kind, value in peer.get("subjectAltName", ()) if kind == "IP Address"}
        assert "10.42.0.7" in sans, f"the head's certificate lacks its pod address: {sans}"
        thread.join(10)
    assert seen and seen[0], "the head saw no client certificate"
    # A name the head's certificate does not hold is refused.
    with socket.create_server(("127.0.0.1", 0)) as listener:
        thread = threading.Thread(target=lambda: _accept_quietly(listener, server_ctx))
        thread.start()
        with (
            socket.create_connection(listener.getsockname(), timeout=10) as raw,
            pytest.raises(ssl.SSLCertVerificationError, match="match"),
        ):
            client_ctx.wrap_socket(raw, server_hostname="ray.elsewhere.example")
        thread.join(10)


def _accept_quietly(listener: socket.socket, ctx: ssl.SSLContext) -> None:
    conn, _ = listener.accept()
    with contextlib.suppress(ssl.SSLError, OSError), ctx.wrap_socket(conn, server_side=True):
        pass


def test_the_ray_head_asks_no_cloud_metadata_server_and_reports_to_loopback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As `denv cluster up`'s head (tests/unit/test_ray_quiet.py): the pod's Ray head finds a
    bootstrap config naming no cloud in its HOME, so Ray's usage module (run by the head's
    dashboard process at every start, usage stats off or not) asks no metadata server; its
    "disabled" report goes to a closed loopback port."""
    spec = _one("Deployment", "denv-control-plane")["spec"]["template"]["spec"]
    head = next(c for c in spec["containers"] if c["name"] == "ray-head")
    env = {e["name"]: e.get("value") for e in head["env"]}
    assert env["RAY_USAGE_STATS_REPORT_URL"] == ray_nodes.USAGE_REPORT_URL
    config = f"{env['HOME']}/ray_bootstrap_config.yaml"
    mount = next(m for m in head["volumeMounts"] if m["mountPath"] == config)
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    data = _one("ConfigMap", volume["configMap"]["name"])["data"][mount["subPath"]]
    assert yaml.safe_load(data) == yaml.safe_load(ray_nodes.BOOTSTRAP_CONFIG)

    def asked() -> str:
        raise AssertionError("Ray asked the cloud metadata servers")

    monkeypatch.setattr(usage_lib, "get_cloud_from_metadata_requests", asked)
    (tmp_path / "ray_bootstrap_config.yaml").write_text(data)
    found = usage_lib.get_cluster_config_to_report(str(tmp_path / "ray_bootstrap_config.yaml"))
    assert found.cloud_provider == "local"
