"""The Helm chart: lint and template clean (helm of the pinned release, built from the Go module
proxy), its objects accepted by the real API server, its CRDs the same as crds/, and every
metric its dashboard queries exported by a real broker."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from laminar_operator import manifests

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
    of NetworkPolicies and StatefulSets, nothing cluster-scoped, no escalate/bind, no
    wildcards, no pods."""
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
        ("networking.k8s.io", "networkpolicies"),
        ("apps", "statefulsets"),  # made again with grown volumes (its pods orphaned)
    }
    # the brokers' claims, by name, grown with spec.storage.size; no StorageClass is read
    assert granted[("", "persistentvolumeclaims")] == {"get", "patch"}
    assert not {resource for _, resource in granted} & {"storageclasses", "persistentvolumes"}
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


def _refused(kube: KubeApi, *sets: str) -> str:
    """`helm template` with `sets` fails: its error."""
    result = subprocess.run(
        [str(kube.bin_dir / "helm"), "template", "laminar", str(CHART), *sets],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0, f"rendered with {sets}"
    return result.stderr


def test_template_without_rbac_or_service_account(kube: KubeApi) -> None:
    docs = rendered(
        kube, "--set", "rbac.create=false", "--set", "serviceAccount.create=false",
        "--set", "serviceAccount.name=platform-operator",
    )  # fmt: skip
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                        "RoleBinding"}, kinds  # fmt: skip
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "platform-operator"
    # an existing ServiceAccount must be named
    assert "serviceAccount.name" in _refused(kube, "--set", "serviceAccount.create=false")
    # a ServiceAccount of another name, made here: the bindings name it
    docs = rendered(kube, "--set", "serviceAccount.name=ops", "--set", "watchNamespaces={a}")
    (account,) = [d for d in docs if d["kind"] == "ServiceAccount"]
    assert account["metadata"]["name"] == "ops"
    bindings = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert len(bindings) == 2  # the watched namespace's, and the CA keys'
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "ops", "namespace": "laminar-system"}
        ]


POD_VALUES: dict[str, Any] = {
    "nodeSelector": {"node-role.example/infra": "true"},
    "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    },
    "podSecurityContext": {"runAsNonRoot": True, "runAsUser": 20002, "fsGroup": 20002},
    "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]}, "runAsGroup": 20002},
    "imagePullSecrets": [{"name": "registry"}],
}  # fmt: skip


def test_pod_values_reach_the_deployment(crds: KubeApi, tmp_path: Path) -> None:
    """nodeSelector, tolerations, affinity, podSecurityContext, securityContext and
    imagePullSecrets, from a values file, in the operator's pod as given; and the API server
    takes the Deployment."""
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(POD_VALUES))
    docs = rendered(crds, "-f", str(values))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    for key in ("nodeSelector", "tolerations", "affinity", "imagePullSecrets"):
        assert pod[key] == POD_VALUES[key], key
    # Helm merges a map given with the default's (and the chart adds what Pod Security
    # "restricted" needs): what was given is there
    for given, got in (
        (POD_VALUES["podSecurityContext"], pod["securityContext"]),
        (POD_VALUES["securityContext"], pod["containers"][0]["securityContext"]),
    ):
        assert {k: got.get(k) for k in given} == given, got
    crds.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "laminar-system"}})
    crds.apply(deployment, "--dry-run=server")
    # the defaults: no scheduling constraints, non-root
    pod = next(d for d in rendered(crds) if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert not {"nodeSelector", "tolerations", "affinity", "imagePullSecrets"} & set(pod)
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_the_schema_refuses_wrong_types_and_unknown_values(kube: KubeApi) -> None:
    for sets, named in (
        (["--set", "nodeSelector=ssd"], "nodeSelector"),
        (["--set", "tolerations=infra"], "tolerations"),
        (["--set", "rbac.create=maybe"], "rbac.create"),
        (["--set", "serviceAccount.create=yes"], "serviceAccount.create"),
        (["--set", "podSecurityContext=root"], "podSecurityContext"),
        (["--set", "image.pullPolicy=Sometimes"], "image.pullPolicy"),
        (["--set", "nodeselector.disk=ssd"], "nodeselector"),  # a typo: not a value
        (["--set", "serviceMonitor.intreval=1m"], "intreval"),
    ):
        error = _refused(kube, *sets)
        assert named in error and "values don't meet the specifications" in error, error


def test_notes_render(kube: KubeApi) -> None:
    """NOTES.txt, as `helm install` prints it (a dry run against the API server)."""

    def notes(*sets: str) -> str:
        out = helm(
            kube, "install", "laminar", str(CHART), "--dry-run=server", "--namespace",
            "laminar-system", "--kubeconfig", str(kube.kubeconfig), *sets,
        )  # fmt: skip
        assert "NOTES:\n" in out, f"helm install prints no notes:\n{out[-2000:]}"
        return out.split("NOTES:\n", 1)[1]

    default = notes()
    assert "image laminar-operator:0.1.0" in default
    assert "in every namespace" in default
    assert "deployment/laminar-laminar-operator" in default
    assert "laminar-broker:0.1.0" in default
    assert "not allowed (xdp.allowed=false)" in default
    assert "kubectl apply --server-side --force-conflicts -f" in default
    assert "rbac.create is false" not in default
    scoped = notes(
        "--set", "watchNamespaces={team-a,team-b}", "--set", "rbac.create=false",
        "--set", "xdp.allowed=true", "--set", "image.tag=9.9.9",
    )  # fmt: skip
    assert "in these namespaces only: team-a, team-b" in scoped
    assert "rbac.create is false" in scoped and "laminar-system/laminar-laminar-operator" in scoped
    assert "allowed (xdp.allowed=true)" in scoped and "laminar-operator:9.9.9" in scoped


def test_the_service_monitor_scrapes_each_broker_once(crds: KubeApi, namespace: str) -> None:
    """The ServiceMonitor's selector, asked of the API server over a cluster's two Services
    (the operator's builders'): it selects the client Service, not the -peers one too."""
    (monitor,) = [d for d in rendered(crds, "--set", "serviceMonitor.enabled=true")
                  if d["kind"] == "ServiceMonitor"]  # fmt: skip
    selector = monitor["spec"]["selector"]
    assert set(selector) == {"matchLabels"}, selector  # what kubectl's -l below can say
    cluster = {"metadata": {"name": "demo", "namespace": namespace, "uid": "0"}, "spec": {}}
    for service in (manifests.client_service(cluster), manifests.peer_service(cluster)):
        del service["metadata"]["ownerReferences"]  # no such owner: the GC would take them
        crds.apply(service)
    label = ",".join(f"{k}={v}" for k, v in selector["matchLabels"].items())
    selected = crds.get("services", "-n", namespace, "-l", label)["items"]
    assert [s["metadata"]["name"] for s in selected] == ["demo"]
    port = monitor["spec"]["endpoints"][0]["port"]
    assert port in {p["name"] for p in selected[0]["spec"]["ports"]}


def _value_paths(values: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> list[str]:
    """The dotted paths of values.yaml's values, down to what the schema leaves free-form (a
    map of the user's, like resources or nodeSelector); each one checked to be in the schema."""
    paths = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        assert key in schema.get("properties", {}), f"{path}: not in values.schema.json"
        child = schema["properties"][key]
        if isinstance(value, dict) and "properties" in child:
            paths += _value_paths(value, child, f"{path}.")
        else:
            paths.append(path)
    return paths


def test_the_readme_lists_every_value_with_its_default() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    readme = (CHART / "README.md").read_text()
    row = re.compile(r"^\| `([\w.]+)` \| `([^`]*)` \|", re.M)
    rows = {found[1]: found[2] for found in row.finditer(readme)}
    paths = _value_paths(values, schema)
    assert len(paths) > 20, paths
    for path in paths:
        assert path in rows, f"the chart's README does not list {path}"
        value: Any = values
        for part in path.split("."):
            value = value[part]
        assert json.loads(rows[path]) == value, f"{path}: README says {rows[path]}"
    assert set(rows) == set(paths), set(rows) - set(paths)  # nor lists values there are not


def _project_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def test_the_default_images_are_the_project_version(kube: KubeApi) -> None:
    """The CRD's default broker image, the operator's, the example's, the chart's appVersion
    (its operator image's tag) and every image name the docs tell users to build: the version
    of pyproject.toml."""
    version = _project_version()
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"] == version
    crd = yaml.safe_load((ROOT / "crds" / "laminarclusters.laminarmq.io.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["image"]["default"] == f"laminar-broker:{version}"
    assert manifests.DEFAULTS["image"] == f"laminar-broker:{version}"
    example = yaml.safe_load((ROOT / "examples" / "cluster.yaml").read_text())
    assert example["spec"]["image"] == f"laminar-broker:{version}"
    deployment = next(d for d in rendered(kube) if d["kind"] == "Deployment")
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"laminar-operator:{version}"
    documents = [ROOT / "README.md", CHART / "README.md", *ROOT.glob("Dockerfile.*"),
                 *(ROOT / "docs").glob("*.md")]  # fmt: skip
    named = {
        (path.name, found[0])
        for path in documents
        for found in re.finditer(r"laminar-(?:broker|operator):[\w.-]+", path.read_text())
    }
    assert named, "the docs name no image to build"
    stale = {(name, image) for name, image in named
             if not image.endswith((f":{version}", ":dev", ":e2e"))}  # fmt: skip
    assert not stale, f"image names of another version: {sorted(stale)}"


def test_the_log_level_reaches_the_operator(kube: KubeApi) -> None:
    def level(*sets: str) -> str | None:
        deployment = next(d for d in rendered(kube, *sets) if d["kind"] == "Deployment")
        env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        return next((v["value"] for v in env if v["name"] == "LAMINAR_OPERATOR_LOG_LEVEL"), None)

    assert level() == "info"
    assert level("--set", "logLevel=debug") == "debug"
    refused = subprocess.run(
        [str(kube.bin_dir / "helm"), "template", "x", str(CHART), "--set", "logLevel=loud"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode != 0 and "logLevel" in refused.stderr, refused.stderr
