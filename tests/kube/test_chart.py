"""The Helm chart: lint and template clean (helm of the pinned release, built from the Go module
proxy), its objects accepted by the real API server, its CRDs the same as crds/, and every
metric its dashboard queries exported by a real broker."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from ..integration.conftest import make_cluster
from .conftest import CHART, ROOT, KubeApi, helm, rendered


def test_lint_is_clean(kube: KubeApi) -> None:
    out = helm(kube, "lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in out, out


def test_template_defaults(kube: KubeApi) -> None:
    docs = rendered(kube)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Pod",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ]  # the Pod is `helm test`'s; the Role: the CA keys in the operator's namespace
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    rules = yaml.safe_load((CHART / "files" / "operator-rules.yaml").read_text())
    assert role["rules"] == rules
    _check_ca_keys_role(docs, "laminar-system")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][-2:] == ["-m", "laminar_operator.handlers"]
    assert "--all-namespaces" in container["args"]
    assert "--namespace" not in container["args"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    env = {e["name"]: e for e in container["env"]}
    assert env["LAMINAR_XDP_ALLOWED"]["value"] == "false"  # off unless an administrator says
    assert env["LAMINAR_OPERATOR_NAMESPACE"]["valueFrom"]["fieldRef"] == {
        "fieldPath": "metadata.namespace"
    }


def _check_ca_keys_role(docs: list[dict[str, Any]], namespace: str) -> None:
    """The one Role that reads Secrets: the CA keys', in the operator's own namespace."""
    roles = [d for d in docs if d["kind"] == "Role"]
    (role,) = [d for d in roles if d["metadata"]["name"].endswith("-ca-keys")]
    assert role["metadata"]["namespace"] == namespace
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "patch", "delete"]}
    ]
    (binding,) = [d for d in docs if d["kind"] == "RoleBinding" and d["roleRef"]["name"]
                  == role["metadata"]["name"]]  # fmt: skip
    assert binding["metadata"]["namespace"] == namespace


def test_the_rules_are_least_privilege() -> None:
    """What the rules grant, and above all what they do not: no read of Secrets, no delete but
    of NetworkPolicies, nothing cluster-scoped, no escalate/bind, no wildcards, no pods."""
    rules = yaml.safe_load((CHART / "files" / "operator-rules.yaml").read_text())
    granted = {
        (group, resource): set(rule["verbs"])
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert all("*" not in verbs for verbs in granted.values())
    assert not any("*" in key for group_resource in granted for key in group_resource)
    # the HMAC key made once; the TLS Secrets applied and renewed in place: never read here
    assert granted[("", "secrets")] == {"create", "patch"}
    assert {key for key, verbs in granted.items() if "delete" in verbs} == {
        ("networking.k8s.io", "networkpolicies")
    }
    assert not any(verbs & {"escalate", "bind", "impersonate"} for verbs in granted.values())
    resources = {resource for _, resource in granted}
    assert not resources & {"namespaces", "customresourcedefinitions", "pods", "nodes"}
    assert not resources & {"clusterroles", "clusterrolebindings", "leases"}
    list_watch = {key for key, verbs in granted.items() if verbs & {"list", "watch"}}
    assert list_watch == {("laminarmq.io", "laminarclusters"), ("laminarmq.io", "topics")}


def test_template_watched_namespaces(kube: KubeApi) -> None:
    docs = rendered(kube, "--set", "watchNamespaces={team-a,team-b}", "--set", "xdp.allowed=true")
    kinds = sorted(d["kind"] for d in docs)
    assert "ClusterRole" not in kinds and "ClusterRoleBinding" not in kinds
    rules = yaml.safe_load((CHART / "files" / "operator-rules.yaml").read_text())
    _check_ca_keys_role(docs, "laminar-system")
    docs = [d for d in docs if not d["metadata"]["name"].endswith("-ca-keys")]
    roles = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "Role"}
    bindings = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "RoleBinding"}
    assert sorted(roles) == sorted(bindings) == ["team-a", "team-b"]
    for namespace, role in roles.items():
        assert role["rules"] == rules
        binding = bindings[namespace]
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "laminar-laminar-operator",
             "namespace": "laminar-system"}
        ]  # fmt: skip
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert "--all-namespaces" not in args
    assert args[args.index("--namespace") :][:4] == [
        "--namespace", "team-a", "--namespace", "team-b"
    ]  # fmt: skip
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LAMINAR_XDP_ALLOWED"] == "true"


def test_template_refuses_namespaces_outside_watch_namespaces(kube: KubeApi) -> None:
    """Namespaces given in extraArgs would leave the RBAC cluster-wide, and patterns match
    nothing (the operator takes exact names): both refused."""
    for sets in (
        ["--set", "extraArgs={--namespace,team-a}"],
        ["--set", "extraArgs={--namespace=team-a}"],
        ["--set", "watchNamespaces={team-*}"],
    ):
        result = subprocess.run(
            [str(kube.bin_dir / "helm"), "template", "laminar", str(CHART), *sets],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode != 0, sets
        assert "watchNamespaces" in result.stderr, result.stderr


def test_template_options(kube: KubeApi) -> None:
    docs = rendered(
        kube,
        "--set", "serviceMonitor.enabled=true",
        "--set", "grafanaDashboard.enabled=true",
        "--set", "extraArgs={--verbose}",
    )  # fmt: skip
    monitor = next(d for d in docs if d["kind"] == "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    assert monitor["spec"]["endpoints"][0]["scheme"] == "https"  # the brokers' TLS default
    dashboard = next(d for d in docs if d["kind"] == "ConfigMap")
    assert json.loads(dashboard["data"]["laminar.json"])["uid"] == "laminar-brokers"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    args = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    assert "--all-namespaces" in args and args[-1] == "--verbose"


def test_the_api_server_accepts_the_chart(crds: KubeApi) -> None:
    docs = [d for d in rendered(crds) if d["kind"] != "ServiceMonitor"]
    crds.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "laminar-system"}})
    # the `helm test` pod runs as the namespace's default ServiceAccount, which the controller
    # manager here (garbage collector only) does not make
    crds.apply(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": "laminar-system"},
        }
    )
    crds.apply(docs, "--dry-run=server")
    # and the namespaced mode's Roles and RoleBindings, in watched namespaces that exist
    crds.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "chart-team"}})
    scoped = rendered(crds, "--set", "watchNamespaces={chart-team}")
    crds.apply([d for d in scoped if d["kind"] in ("Role", "RoleBinding")], "--dry-run=server")


def test_chart_crds_are_the_crds() -> None:
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        assert (CHART / "crds" / path.name).read_text() == path.read_text(), path.name
    assert {p.name for p in (CHART / "crds").glob("*.yaml")} == {
        p.name for p in (ROOT / "crds").glob("*.yaml")
    }


def test_the_dashboard_queries_metrics_brokers_export(tmp_path: Path) -> None:
    dashboard = json.loads((CHART / "files" / "dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    queried = {m for e in exprs for m in re.findall(r"\blaminar_[a-z_]+", e)}
    cluster = make_cluster(tmp_path, 1)
    try:

        async def scrape() -> str:
            async with (
                aiohttp.ClientSession() as session,
                session.get(cluster.urls[0] + "/metrics") as answer,
            ):
                return await answer.text()

        text = asyncio.run(scrape())
    finally:
        cluster.stop()
    exported = set(re.findall(r"^# TYPE (\w+)", text, re.M))
    samples = set(re.findall(r"^(laminar_\w+?)(?:\{| )", text, re.M))
    known = samples | exported
    base = {m: re.sub(r"_(total|bucket)$", "", m) for m in queried}
    missing = {m for m in queried if m not in known and base[m] not in known}
    assert not missing, f"the dashboard queries metrics no broker exports: {sorted(missing)}"
