"""The CRDs on a real API server: schemas, defaults, CEL rules, the scale subresource, printer
columns; every field described (`kubectl explain`); the documented upgrade of CRDs Helm
installed; and the operator's builders' objects accepted by it and garbage-collected with the
cluster that owns them."""

from __future__ import annotations

import copy
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from laminar.certs import issue, make_ca
from laminar_operator import manifests

from .conftest import ROOT, KubeApi, helm
from .test_operator import wait_for


def load(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(path.read_text())
    return document


def rejected(kube: KubeApi, obj: dict[str, Any], namespace: str) -> str:
    result = kube.kubectl(
        "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(obj), check=False
    )
    assert result.returncode != 0, f"accepted: {obj}"
    return result.stderr


def test_examples_apply_and_get_their_defaults(crds: KubeApi, namespace: str) -> None:
    crds.kubectl("apply", "-n", namespace, "-f", str(ROOT / "examples" / "cluster.yaml"))
    crds.kubectl("apply", "-n", namespace, "-f", str(ROOT / "examples" / "topic.yaml"))
    cluster = crds.get("laminarcluster/demo", "-n", namespace)
    assert cluster["spec"]["workersPerPod"] == 1  # defaulted by the schema
    assert cluster["spec"]["tls"] == {"enabled": True}  # TLS unless turned off
    assert cluster["spec"]["imagePullPolicy"] == "IfNotPresent"
    assert "logLevel" not in cluster["spec"]["config"]  # unset: the brokers' own default
    topic = crds.get("lmt/orders", "-n", namespace)  # short name
    assert topic["spec"]["partitions"] == 4 and topic["spec"]["cluster"] == "demo"
    table = crds.kubectl("get", "laminarclusters", "-n", namespace).stdout
    for column in ("REPLICAS", "READY", "PHASE", "LEADERS", "UNDER-REPLICATED"):
        assert column in table.splitlines()[0], table
    table = crds.kubectl("get", "topics.laminarmq.io", "-n", namespace).stdout
    for column in ("CLUSTER", "PARTITIONS", "RF", "READY", "UNDER-REPLICATED"):
        assert column in table.splitlines()[0], table


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.update(replicas=0), "spec.replicas"),
        (lambda s: s.update(replicas=2), "replicationFactor may not exceed replicas"),
        (lambda s: s["config"].update(fsync="sometimes"), "spec.config.fsync"),
        (lambda s: s["config"].update(logFormat="xml"), "spec.config.logFormat"),
        (lambda s: s["config"].update(otelEndpoint="collector:4318"), "spec.config.otelEndpoint"),
        (lambda s: s["storage"].update(size="lots"), "spec.storage.size"),
        (lambda s: s.update(workersPerPod=65), "spec.workersPerPod"),  # 64 at most
        (lambda s: s.update(tls={"enabled": "yes"}), "spec.tls.enabled"),
        (lambda s: s.update(surprise=1), "surprise"),
    ],
)
def test_invalid_cluster_specs_are_rejected(
    crds: KubeApi, namespace: str, change: Any, message: str
) -> None:
    cluster = load(ROOT / "examples" / "cluster.yaml")
    change(cluster["spec"])
    error = rejected(crds, cluster, namespace)
    assert message in error, error
    assert crds.kubectl("get", "laminarcluster/demo", "-n", namespace, check=False).returncode != 0


def test_unknown_fields_are_refused_not_dropped(crds: KubeApi, namespace: str) -> None:
    cluster = load(ROOT / "examples" / "cluster.yaml")
    cluster["spec"]["replica"] = 5  # a typo
    error = rejected(crds, cluster, namespace)
    assert "unknown field" in error, error


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.update(partitions=2), "partitions may only grow"),
        (lambda s: s.update(cluster="other"), "cluster is immutable"),
        (lambda s: s.update(replicationFactor=1), "replicationFactor is immutable"),
    ],
)
def test_topic_update_rules(crds: KubeApi, namespace: str, change: Any, message: str) -> None:
    topic = load(ROOT / "examples" / "topic.yaml")
    crds.apply({**topic, "metadata": {**topic["metadata"], "namespace": namespace}})
    changed = copy.deepcopy(topic)
    change(changed["spec"])
    error = rejected(crds, changed, namespace)
    assert message in error, error
    grown = copy.deepcopy(topic)
    grown["spec"]["partitions"] = 8
    crds.kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(grown))
    assert crds.get("topic.laminarmq.io/orders", "-n", namespace)["spec"]["partitions"] == 8


def test_topic_needs_its_cluster(crds: KubeApi, namespace: str) -> None:
    topic = load(ROOT / "examples" / "topic.yaml")
    del topic["spec"]["cluster"]
    assert "cluster" in rejected(crds, topic, namespace)


def test_kubectl_scale_uses_the_scale_subresource(crds: KubeApi, namespace: str) -> None:
    crds.kubectl("apply", "-n", namespace, "-f", str(ROOT / "examples" / "cluster.yaml"))
    crds.kubectl("scale", "laminarcluster/demo", "--replicas=5", "-n", namespace)
    assert crds.get("laminarcluster/demo", "-n", namespace)["spec"]["replicas"] == 5
    scale = crds.kubectl(
        "get", "--raw",
        f"/apis/laminarmq.io/v1alpha1/namespaces/{namespace}/laminarclusters/demo/scale",
    ).stdout  # fmt: skip
    assert '"replicas":5' in scale.replace(" ", "")


def test_owned_objects_are_accepted_and_collected_with_their_cluster(
    crds: KubeApi, namespace: str
) -> None:
    crds.kubectl("apply", "-n", namespace, "-f", str(ROOT / "examples" / "cluster.yaml"))
    cluster = crds.get("laminarcluster/demo", "-n", namespace)
    spec = cluster["spec"]["networkPolicy"]  # the schema's defaults
    assert spec == {"enabled": True}  # the scrapers' default is the operator's (manifests)
    ca = make_ca("test")
    pair = issue(ca, "demo", manifests.broker_names("demo", namespace))
    objects = [
        manifests.secret(cluster, b"k" * 32),
        manifests.ca_secret(cluster, ca.cert_pem),
        manifests.tls_secret(cluster, pair.cert_pem, pair.key_pem, ca.cert_pem),
        *manifests.owned(cluster, initial_replicas=3, operator_namespace="laminar-system"),
    ]
    crds.apply(objects)
    sts = crds.get("statefulset/demo", "-n", namespace)
    assert sts["metadata"]["ownerReferences"][0]["uid"] == cluster["metadata"]["uid"]
    crds.apply(objects)  # re-applying changes nothing
    assert crds.get("statefulset/demo", "-n", namespace)["metadata"]["generation"] == 1

    crds.kubectl("delete", "laminarcluster/demo", "-n", namespace)
    kinds = (
        "statefulset,service,configmap,secret,poddisruptionbudget,serviceaccount,role,rolebinding,"
        "networkpolicy"
    )
    deadline = time.monotonic() + 60
    left: list[str] = []
    while time.monotonic() < deadline:
        listed = crds.get(kinds, "-n", namespace, "-l", "app.kubernetes.io/instance=demo")
        left = [f"{o['kind']}/{o['metadata']['name']}" for o in listed["items"]]
        if not left:
            break
        time.sleep(0.5)
    assert not left, f"not garbage-collected: {left}"


def test_the_stateful_set_with_the_xdp_init_container_is_valid(
    crds: KubeApi, namespace: str
) -> None:
    cluster = yaml.safe_load((ROOT / "examples" / "cluster.yaml").read_text())
    cluster["metadata"]["namespace"] = namespace
    cluster["spec"]["xdp"] = {"enabled": True}
    crds.apply(cluster)
    applied = crds.get("laminarcluster/demo", "-n", namespace)
    # validated by the server
    crds.apply(manifests.stateful_set(applied, initial_replicas=3, xdp_allowed=True))
    pod = crds.get("statefulset/demo", "-n", namespace)["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["securityContext"]["privileged"] is True
    assert pod["containers"][0]["securityContext"]["runAsNonRoot"] is True


def test_network_policy_settings_are_validated(crds: KubeApi, namespace: str) -> None:
    cluster = load(ROOT / "examples" / "cluster.yaml")
    cluster["spec"]["networkPolicy"] = {
        "clientSelectors": [
            {"podSelector": {"matchLabels": {"app": "web"}}},
            {
                "namespaceSelector": {
                    "matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]
                },
                "podSelector": {"matchLabels": {"laminarmq.io/client": "true"}},
            },
        ],
        "metricsNamespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "prom"}},
    }
    crds.apply({**cluster, "metadata": {**cluster["metadata"], "namespace": namespace}})
    applied = crds.get("laminarcluster/demo", "-n", namespace)
    policy = manifests.network_policy(applied)
    crds.apply(policy, "--dry-run=server")  # a NetworkPolicy the server takes
    admitted = policy["spec"]["ingress"][0]["from"]
    assert {"podSelector": {"matchLabels": {"app": "web"}}} in admitted
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "prom"}}} in (
        admitted
    )
    assert "laminarmq.io/metrics" not in str(admitted)

    for bad in (
        {"clientSelectors": [{}]},  # a peer selecting nothing said
        {"clientSelectors": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]},
        {"clientSelectors": [{"podSelector": {"matchExpressions": [{"key": "a",
                                                                   "operator": "Is"}]}}]},
        {"enabled": "yes"},
    ):  # fmt: skip
        refused = copy.deepcopy(cluster)
        refused["spec"]["networkPolicy"] = bad
        rejected(crds, refused, namespace)


#: The custom resources, as `kubectl explain` names them.
EXPLAINED = ("laminarclusters.laminarmq.io", "topics.laminarmq.io")
EXPLAIN_WAIT_S = 60.0


#: A field in `kubectl explain`'s FIELDS: indentation, name, type (enum lines have no tab).
EXPLAINED_FIELD = re.compile(r"^( *)(\S+)\t(<[^>]+>)")
#: What `kubectl explain` shows for a field or object without a description.
UNDESCRIBED = ("<no description>", "<empty>")


def _object_fields(kube: KubeApi, resource: str) -> list[str]:
    """The paths of the fields of `resource` that hold fields (objects and lists of objects),
    from `kubectl explain --recursive` (the API server's published OpenAPI v3); metadata's
    (the standard ObjectMeta's) left out."""
    explained = wait_for(  # the OpenAPI v3 of a new CRD is published a little after it
        f"kubectl explain {resource}",
        lambda: kube.kubectl("explain", resource, "--recursive", check=False).stdout,
        timeout_s=EXPLAIN_WAIT_S,
    )
    paths: list[str] = []
    stack: list[tuple[int, str]] = []
    for line in explained.split("FIELDS:\n", 1)[1].splitlines():
        if not (found := EXPLAINED_FIELD.match(line)):
            continue
        indent, name, kind = len(found[1]), found[2], found[3]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([*(part for _, part in stack), name])
        stack.append((indent, name))
        if kind in ("<Object>", "<[]Object>") and not path.startswith("metadata"):
            paths.append(path)
    return paths


def _undescribed(explained: str, path: str) -> list[str]:
    """What `kubectl explain` of `path` shows without a description: the object itself, and
    each of its fields."""
    head, _, fields = explained.partition("FIELDS:\n")
    description = head.partition("DESCRIPTION:\n")[2].strip()
    missing = [path or "(the resource)"] if description in ("", *UNDESCRIBED) else []
    for block in re.split(r"\n\s*\n", fields):
        lines = block.strip("\n").splitlines()
        if not lines or not (found := EXPLAINED_FIELD.match(lines[0])):
            continue
        text = " ".join(line.strip() for line in lines[1:] if not line.startswith("  enum:"))
        if text in ("", *UNDESCRIBED):
            missing.append(f"{path}.{found[2]}".lstrip("."))
    return missing


@pytest.mark.parametrize("resource", EXPLAINED)
def test_kubectl_explain_describes_every_field(crds: KubeApi, resource: str) -> None:
    """`kubectl explain` of the resource and of each of its objects, spec and status: each
    field it lists has a description (none says `<no description>`)."""
    paths = _object_fields(crds, resource)
    assert "spec" in paths and "status" in paths, paths
    undescribed = []
    for path in ["", *paths]:
        out = crds.kubectl("explain", f"{resource}{'.' if path else ''}{path}").stdout
        undescribed += _undescribed(out, path)
    undescribed = list(dict.fromkeys(undescribed))  # a field: in its own and its parent's
    assert not undescribed, f"{resource}: fields without a description: {undescribed}"


def _renamed(path: Path, group: str) -> dict[str, Any]:
    """The CRD at `path` in API group `group`, without its short names and categories (which
    would make `lmc` and friends ambiguous for the other tests)."""
    crd = yaml.safe_load(path.read_text().replace("laminarmq.io", group))
    crd["spec"]["names"].pop("shortNames", None)
    crd["spec"]["names"].pop("categories", None)
    return crd


def _crds_chart(path: Path, crds: list[dict[str, Any]]) -> Path:
    """A chart of nothing but `crds` (its crds/ directory)."""
    (path / "crds").mkdir(parents=True)
    chart = {"apiVersion": "v2", "name": "laminar-crds-test", "version": "0.1.0"}
    (path / "Chart.yaml").write_text(yaml.safe_dump(chart))
    for crd in crds:
        (path / "crds" / f"{crd['metadata']['name']}.yaml").write_text(yaml.safe_dump(crd))
    return path


def test_helm_upgrade_leaves_crds_and_the_documented_apply_updates_them(
    kube: KubeApi, tmp_path: Path
) -> None:
    """docs/kubernetes.md, "Upgrading", with CRDs Helm installed (a chart's crds/, in an API
    group of their own) from an older chart, here one without spec.workersPerPod: `helm
    upgrade` to the new chart leaves them as they were; `kubectl apply --server-side` of the
    new crds/ is refused (Helm's fields), and with --force-conflicts updates them."""
    group = "upgrade.laminarmq.io"
    new = [_renamed(path, group) for path in sorted((ROOT / "crds").glob("*.yaml"))]
    (cluster_crd,) = [crd for crd in new if crd["spec"]["names"]["kind"] == "LaminarCluster"]
    old = copy.deepcopy(new)
    for crd in old:
        if crd["spec"]["names"]["kind"] == "LaminarCluster":
            (version,) = crd["spec"]["versions"]
            spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
            del spec["properties"]["workersPerPod"]
    name = cluster_crd["metadata"]["name"]
    older, newer = _crds_chart(tmp_path / "old", old), _crds_chart(tmp_path / "new", new)
    config = ("--namespace", "default", "--kubeconfig", str(kube.kubeconfig))

    def fields() -> dict[str, Any]:
        crd = kube.get(f"crd/{name}")
        spec: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        return dict(spec["properties"]["spec"]["properties"])

    helm(kube, "install", "crds-upgrade", str(older), *config)
    try:
        assert "workersPerPod" not in fields()
        helm(kube, "upgrade", "crds-upgrade", str(newer), *config)
        assert "workersPerPod" not in fields()  # what the docs warn of
        crds_dir = str(newer / "crds")
        refused = kube.kubectl("apply", "--server-side", "-f", crds_dir, check=False)
        assert refused.returncode != 0 and "conflict" in refused.stderr.lower(), refused
        kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", crds_dir)
        assert "workersPerPod" in fields()
        crd = kube.get(f"crd/{name}")
        assert crd["spec"] == {**cluster_crd["spec"], "conversion": crd["spec"]["conversion"]}
    finally:
        subprocess.run(
            [str(kube.bin_dir / "helm"), "uninstall", "crds-upgrade", *config],
            capture_output=True, timeout=120,
        )  # fmt: skip
        for crd in new:
            kube.kubectl("delete", "crd", crd["metadata"]["name"], "--wait=false", check=False)
