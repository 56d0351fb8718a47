"""Storage, scheduling and Pod Security of a LaminarCluster's brokers, on the real API server
(docs/kubernetes.md, "Storage", "Scheduling", "Pod Security").

Storage: a grown spec.storage.size expands the brokers' claims where their StorageClass allows
it and makes the StatefulSet again (its pods orphaned: they keep running); where it does not,
the volumes keep their size, the StorageExpanded condition and a Warning event say why, and
other changes still reach the StatefulSet. Claims are bound by the controller manager's
persistentvolume-binder to PersistentVolumes made here (there is no storage driver: the API
server expands only bound claims). Shrinking and a new storage class are refused at admission
by the CRD's CEL rules. Scheduling: spec.template.pod reaches the pod template, with the
default pod anti-affinity. Pod Security: the brokers' pods and the operator's pass
"restricted" (a server-side dry run in a namespace enforcing it); the XDP init container is
the one exception.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from laminar_operator import manifests

from .conftest import ROOT, KubeApi, OperatorIdentity, operator_identity, rendered, run_operator
from .test_operator import condition, found, wait_for

EXPANDABLE = "expandable"
FIXED = "fixed"
#: The API server's refusal of a claim whose StorageClass does not allow expansion.
CLASS_REFUSES = "the storageclass that provisions the pvc must support resize"


@pytest.fixture(scope="module")
def identity(crds: KubeApi) -> OperatorIdentity:
    """The chart's operator ServiceAccount and ClusterRole (watchNamespaces empty, defaults)."""
    return operator_identity(crds, "laminar-operator", "laminar-system")


def cluster_object(namespace: str, name: str = "demo", **spec: Any) -> dict[str, Any]:
    cluster: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "cluster.yaml").read_text())
    cluster["metadata"] = {"name": name, "namespace": namespace}
    cluster["spec"].update(spec)
    return cluster


def patch_spec(kube: KubeApi, namespace: str, spec: dict[str, Any], name: str = "demo") -> None:
    kube.kubectl("patch", f"laminarcluster/{name}", "-n", namespace, "--type=merge",
                 "-p", json.dumps({"spec": spec}))  # fmt: skip


def refused(kube: KubeApi, namespace: str, spec: dict[str, Any], name: str = "demo") -> str:
    """The API server's refusal of a merge patch of the cluster's spec."""
    answer = kube.kubectl(
        "patch", f"laminarcluster/{name}", "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": spec}), check=False,
    )  # fmt: skip
    assert answer.returncode != 0, f"accepted: {spec}"
    return answer.stderr


def claim_request(kube: KubeApi, namespace: str, claim: str) -> str:
    return str(
        kube.get(f"pvc/{claim}", "-n", namespace)["spec"]["resources"]["requests"]["storage"]
    )


@pytest.fixture()
def storage(crds: KubeApi, namespace: str) -> Iterator[dict[str, str]]:
    """Two StorageClasses of this test's own, one that allows volume expansion and one that
    does not (no provisioner serves them: PersistentVolumes are made by `bound_claim`);
    removed after the test with the PersistentVolumes, cluster-scoped both."""
    classes = {kind: f"{namespace}-{kind}"[:63] for kind in (EXPANDABLE, FIXED)}
    for kind, name in classes.items():
        crds.apply({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": name},
            "provisioner": "laminarmq.io/none",
            "volumeBindingMode": "Immediate",
            "allowVolumeExpansion": kind == EXPANDABLE,
        })  # fmt: skip
    yield classes
    crds.kubectl("delete", "storageclass", *classes.values(), "--wait=false", check=False)
    crds.kubectl("delete", "pv", "-l", f"laminarmq.io/test={namespace}", "--wait=false",
                 check=False)  # fmt: skip


def bound_claim(kube: KubeApi, namespace: str, claim: str, storage_class: str, size: str) -> None:
    """A broker's claim as the StatefulSet controller makes one, bound (by the
    persistentvolume-binder) to a PersistentVolume made for it."""
    kube.apply({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": f"{namespace}-{claim}"[:63],
                     "labels": {"laminarmq.io/test": namespace}},
        "spec": {
            "capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
            "storageClassName": storage_class, "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": f"/tmp/laminar-test/{namespace}/{claim}"},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    })  # fmt: skip
    kube.apply({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace,
                     "labels": {"app.kubernetes.io/instance": "demo"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": storage_class,
                 "resources": {"requests": {"storage": size}}},
    })  # fmt: skip
    wait_for(
        f"{claim} bound",
        lambda: found(kube, f"pvc/{claim}", namespace)["status"].get("phase") == "Bound",
    )


def broker_pod(kube: KubeApi, namespace: str, sts: dict[str, Any], ordinal: int) -> Any:
    """A pod of the StatefulSet, as its controller makes one (owned by it, its claim
    mounted): there is no StatefulSet controller here."""
    template = sts["spec"]["template"]
    name = f"{sts['metadata']['name']}-{ordinal}"
    spec = copy.deepcopy(template["spec"])
    claim = manifests.claim_name(sts["metadata"]["name"], ordinal)
    spec["volumes"].append({"name": "data", "persistentVolumeClaim": {"claimName": claim}})
    kube.apply({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": namespace, "labels": template["metadata"]["labels"],
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts["metadata"]["name"],
                "uid": sts["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True,
            }],
        },
        "spec": spec,
    })  # fmt: skip
    return kube.get(f"pod/{name}", "-n", namespace)


def events(kube: KubeApi, namespace: str, reason: str) -> list[dict[str, Any]]:
    items = kube.get("events", "-n", namespace)["items"]
    return [e for e in items if e.get("reason") == reason]


# ---- storage -----------------------------------------------------------------------------------


def test_a_grown_size_expands_the_claims_and_makes_the_stateful_set_again(
    crds: KubeApi, namespace: str, identity: OperatorIdentity, storage: dict[str, str]
) -> None:
    spec = {"storage": {"size": "1Gi", "storageClassName": storage[EXPANDABLE]}}
    for ordinal in range(3):
        bound_claim(crds, namespace, f"data-demo-{ordinal}", storage[EXPANDABLE], "1Gi")
    with run_operator(identity):
        crds.apply(cluster_object(namespace, **spec))
        first = wait_for("the StatefulSet", lambda: found(crds, "statefulset/demo", namespace))
        assert manifests.claim_size(first) == "1Gi"
        pod = broker_pod(crds, namespace, first, 0)

        patch_spec(crds, namespace, {"storage": {"size": "2Gi"}})
        remade = wait_for(
            "the StatefulSet made again",
            lambda: (
                (s := found(crds, "statefulset/demo", namespace))
                and s["metadata"]["uid"] != first["metadata"]["uid"]
                and s
            ),
        )
        assert manifests.claim_size(remade) == "2Gi"
        for ordinal in range(3):
            assert claim_request(crds, namespace, f"data-demo-{ordinal}") == "2Gi"
        # the broker's pod was orphaned, not deleted: it kept running through it
        kept = found(crds, "pod/demo-0", namespace)
        assert kept is not None and kept["metadata"]["uid"] == pod["metadata"]["uid"]
        owners = [o["uid"] for o in kept["metadata"].get("ownerReferences") or []]
        assert first["metadata"]["uid"] not in owners
        # the pods need no roll: the volumes grow under them
        assert remade["spec"]["template"] == first["spec"]["template"]
        expanded = wait_for(
            "StorageExpanded",
            lambda: condition(crds, "laminarcluster/demo", namespace, "StorageExpanded"),
        )
        assert (expanded["status"], expanded["reason"]) == ("True", "Expanded"), expanded
        assert "2Gi" in expanded["message"]


def test_a_size_the_storage_class_cannot_expand_is_refused_and_wedges_nothing(
    crds: KubeApi, namespace: str, identity: OperatorIdentity, storage: dict[str, str]
) -> None:
    spec = {"storage": {"size": "1Gi", "storageClassName": storage[FIXED]}}
    bound_claim(crds, namespace, "data-demo-0", storage[FIXED], "1Gi")
    with run_operator(identity):
        crds.apply(cluster_object(namespace, **spec))
        first = wait_for("the StatefulSet", lambda: found(crds, "statefulset/demo", namespace))

        patch_spec(crds, namespace, {"storage": {"size": "2Gi"}})
        shown = wait_for(
            "StorageExpanded False",
            lambda: (
                (c := condition(crds, "laminarcluster/demo", namespace, "StorageExpanded"))
                and c["status"] == "False"
                and c
            ),
        )
        assert shown["reason"] == "ExpansionRefused", shown
        assert CLASS_REFUSES in shown["message"] and "allowVolumeExpansion" in shown["message"]
        (warning, *_) = wait_for(
            "the Warning event", lambda: events(crds, namespace, "StorageExpansionRefused")
        )
        assert warning["type"] == "Warning" and CLASS_REFUSES in warning["message"]
        assert claim_request(crds, namespace, "data-demo-0") == "1Gi"

        # never wedged: an image change still reaches the StatefulSet, the same one
        patch_spec(crds, namespace, {"image": "laminar-broker:2"})
        rolled = wait_for(
            "the new image",
            lambda: (
                (s := found(crds, "statefulset/demo", namespace))
                and s["spec"]["template"]["spec"]["containers"][0]["image"] == "laminar-broker:2"
                and s
            ),
        )
        assert rolled["metadata"]["uid"] == first["metadata"]["uid"]
        assert manifests.claim_size(rolled) == "1Gi"


def test_shrinking_and_another_storage_class_are_refused_at_admission(
    crds: KubeApi, namespace: str
) -> None:
    crds.apply(cluster_object(namespace, storage={"size": "2Gi", "storageClassName": "fast"}))
    error = refused(crds, namespace, {"storage": {"size": "1Gi"}})
    assert "spec.storage.size" in error and "may not shrink from 2Gi to 1Gi" in error, error
    assert "Set it to 2Gi or more" in error, error
    error = refused(crds, namespace, {"storage": {"size": "2000Mi"}})  # less, in other units
    assert "may not shrink" in error, error
    error = refused(crds, namespace, {"storage": {"storageClassName": "slow"}})
    assert "spec.storage.storageClassName" in error and "is immutable" in error, error
    assert 'Set it back to "fast"' in error, error
    error = refused(crds, namespace, {"storage": {"storageClassName": None}})
    assert 'Set it back to "fast"' in error, error
    patch_spec(crds, namespace, {"storage": {"size": "2048Mi"}})  # the same, in other units
    patch_spec(crds, namespace, {"storage": {"size": "3Gi"}})  # growing is fine
    assert crds.get("laminarcluster/demo", "-n", namespace)["spec"]["storage"]["size"] == "3Gi"

    crds.apply(cluster_object(namespace, "unset", storage={"size": "1Gi"}))
    error = refused(crds, namespace, {"storage": {"storageClassName": "fast"}}, "unset")
    assert "Set it back to unset (the default class)" in error, error


@pytest.mark.parametrize(
    "size", ["1", "0.5", "1.5Gi", "007Gi", "1.0", "10k", "3M", "2G", "4T", "5P", "6Ki", "7Pi",
             "12345678901234567890123456789Pi"],
)  # fmt: skip
def test_every_size_the_pattern_admits_is_a_quantity(
    crds: KubeApi, namespace: str, size: str
) -> None:
    """The CEL rule reads spec.storage.size with quantity(): every size the schema's pattern
    admits must parse (a size that did not would make every later change of the storage an
    error). Growing by a digit runs the rule on it."""
    crds.apply(cluster_object(namespace, storage={"size": size}))
    number, suffix = re.fullmatch(r"([0-9.]+)(.*)", size).groups()  # type: ignore[union-attr]
    patch_spec(crds, namespace, {"storage": {"size": f"{number}0{suffix}"}})  # more, or equal
    assert manifests.quantity(f"{number}0{suffix}") >= manifests.quantity(size)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"storage": {"persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Keep"}}},
         "whenDeleted"),
        ({"template": {"pod": {"metadata": {"labels": {"app.kubernetes.io/instance": "x"}}}}},
         "the operator selects the brokers' pods by them"),
        ({"template": {"pod": {"metadata": {"annotations": {"laminarmq.io/spec-hash": "x"}}}}},
         "the operator rolls the pods with it"),
        ({"template": {"pod": {"affinity": {"podAntiAfinity": {}}}}}, "podAntiAfinity"),
        ({"template": {"pod": {"tolerations": [{"operator": "Sometimes"}]}}}, "operator"),
        ({"template": {"pod": {"imagePullSecrets": [{}]}}}, "name"),
        ({"template": {"pod": {"topologySpreadConstraints": [{"maxSkew": 1}]}}}, "topologyKey"),
        ({"template": {"container": {}}}, "container"),
    ],
)  # fmt: skip
def test_invalid_storage_and_template_settings_are_refused(
    crds: KubeApi, namespace: str, spec: dict[str, Any], message: str
) -> None:
    cluster = cluster_object(namespace)
    for key, value in spec.items():
        cluster["spec"][key] = {**cluster["spec"].get(key, {}), **value}
    answer = crds.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(cluster), check=False)
    assert answer.returncode != 0 and message in answer.stderr, answer.stderr


# ---- retention and scheduling ------------------------------------------------------------------

TEMPLATE = {
    "pod": {
        "metadata": {
            "labels": {"team": "payments", "tier": "queue"},
            "annotations": {"example.com/owner": "payments"},
        },
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "disk", "operator": "In", "values": ["ssd"]}]}]}},
        },
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "queue",
                         "effect": "NoSchedule"}],
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                       "whenUnsatisfiable": "ScheduleAnyway"}],
        "priorityClassName": "queues",
        "imagePullSecrets": [{"name": "registry"}],
    }
}  # fmt: skip


def test_retention_and_the_pod_template_reach_the_stateful_set(
    crds: KubeApi, namespace: str, identity: OperatorIdentity
) -> None:
    retention = {"whenDeleted": "Delete", "whenScaled": "Delete"}
    custom = cluster_object(
        namespace,
        storage={"size": "1Gi", "persistentVolumeClaimRetentionPolicy": retention},
        template=TEMPLATE,
    )
    with run_operator(identity):
        crds.apply(custom)
        crds.apply(cluster_object(namespace, "plain"))
        sts = wait_for("the StatefulSet", lambda: found(crds, "statefulset/demo", namespace))
        plain = wait_for("plain's", lambda: found(crds, "statefulset/plain", namespace))
        assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == retention
        # the default, shown in the cluster's spec too (kubectl get -o yaml, describe)
        default = {"whenDeleted": "Retain", "whenScaled": "Retain"}
        assert plain["spec"]["persistentVolumeClaimRetentionPolicy"] == default
        shown = crds.get("laminarcluster/plain", "-n", namespace)["spec"]["storage"]
        assert shown["persistentVolumeClaimRetentionPolicy"] == default

        template = sts["spec"]["template"]
        pods = {"app.kubernetes.io/name": "laminar", "app.kubernetes.io/instance": "demo",
                "app.kubernetes.io/component": "broker"}  # fmt: skip
        assert template["metadata"]["labels"] == {"team": "payments", "tier": "queue", **pods}
        assert sts["spec"]["selector"]["matchLabels"] == pods
        annotations = template["metadata"]["annotations"]
        assert annotations["example.com/owner"] == "payments"
        assert manifests.SPEC_HASH_ANNOTATION in annotations
        pod = template["spec"]
        wanted = TEMPLATE["pod"]
        assert pod["affinity"]["nodeAffinity"] == wanted["affinity"]["nodeAffinity"]
        # the default anti-affinity stays beside a node affinity
        assert pod["affinity"]["podAntiAffinity"] == manifests.default_pod_anti_affinity("demo")
        assert pod["tolerations"] == wanted["tolerations"]
        assert pod["nodeSelector"] == wanted["nodeSelector"]
        assert pod["priorityClassName"] == "queues"
        assert pod["imagePullSecrets"] == [{"name": "registry"}]
        (spread,) = pod["topologySpreadConstraints"]
        assert spread["topologyKey"] == "topology.kubernetes.io/zone"
        assert spread["labelSelector"] == {"matchLabels": pods}  # the cluster's brokers

        plain_pod = plain["spec"]["template"]["spec"]
        (term,) = plain_pod["affinity"]["podAntiAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"
        ]
        assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        assert (
            term["podAffinityTerm"]["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"]
            == "plain"
        )
        for key in ("tolerations", "nodeSelector", "priorityClassName", "imagePullSecrets"):
            assert key not in plain_pod, key

        # a template change rolls the pods; an anti-affinity of the user's replaces the default
        before = annotations[manifests.SPEC_HASH_ANNOTATION]
        patch_spec(crds, namespace, {"template": {"pod": {"affinity": {"podAntiAffinity": {}}}}})

        def changed() -> Any:
            s = found(crds, "statefulset/demo", namespace)
            return "podAntiAffinity" not in s["spec"]["template"]["spec"]["affinity"] and s

        changed_sts = wait_for("the anti-affinity removed", changed)
        rolled = changed_sts["spec"]["template"]["metadata"]["annotations"]
        assert rolled[manifests.SPEC_HASH_ANNOTATION] != before
        retention = {"whenDeleted": "Retain", "whenScaled": "Delete"}
        patch_spec(
            crds, namespace, {"storage": {"persistentVolumeClaimRetentionPolicy": retention}}
        )
        wait_for(
            "the retention changed",
            lambda: found(crds, "statefulset/demo", namespace)["spec"][
                "persistentVolumeClaimRetentionPolicy"
            ] == retention,
        )  # fmt: skip


# ---- Pod Security ------------------------------------------------------------------------------


@pytest.fixture()
def restricted(kube: KubeApi, namespace: str) -> str:
    """A namespace enforcing Pod Security "restricted"."""
    kube.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    return namespace


def dry_run_pod(kube: KubeApi, namespace: str, template: dict[str, Any], name: str) -> Any:
    """`kubectl create --dry-run=server` of a pod of `template` (a pod template) in
    `namespace`, with the ServiceAccount it names, and a claim for each volume mounted that
    the template does not have (as the StatefulSet controller adds its volumeClaimTemplates'):
    the admission's answer."""
    spec = copy.deepcopy(template["spec"])
    volumes = spec.setdefault("volumes", [])
    mounted = {m["name"] for c in spec["containers"] for m in c.get("volumeMounts") or []}
    for missing in sorted(mounted - {v["name"] for v in volumes}):
        volumes.append({"name": missing,
                        "persistentVolumeClaim": {"claimName": f"{missing}-{name}"}})  # fmt: skip
    account = spec.get("serviceAccountName") or "default"
    kube.apply({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": account, "namespace": namespace}})  # fmt: skip
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": template.get("metadata", {}).get("labels") or {}},
        "spec": spec,
    }  # fmt: skip
    return kube.kubectl("create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(pod),
                        check=False)  # fmt: skip


def test_the_pods_pass_pod_security_restricted_but_the_xdp_router(
    crds: KubeApi, restricted: str
) -> None:
    crds.apply(cluster_object(restricted))
    crds.apply(cluster_object(restricted, "routed", xdp={"enabled": True}))
    routed = crds.get("laminarcluster/routed", "-n", restricted)
    xdp = manifests.stateful_set(routed, initial_replicas=3, xdp_allowed=True)

    # the documented exception (and the proof that the namespace enforces "restricted")
    answer = wait_for(
        "the XDP router's pod refused",
        lambda: (a := dry_run_pod(crds, restricted, xdp["spec"]["template"], "routed-0"))
        and a.returncode != 0 and a,
    )  # fmt: skip
    assert 'violates PodSecurity "restricted' in answer.stderr, answer.stderr
    assert "privileged" in answer.stderr and "hostPath" in answer.stderr, answer.stderr

    for tls in (True, False):
        cluster = crds.get("laminarcluster/demo", "-n", restricted)
        cluster["spec"]["tls"] = {"enabled": tls}
        sts = manifests.stateful_set(cluster, initial_replicas=3)
        answer = dry_run_pod(crds, restricted, sts["spec"]["template"], "demo-0")
        assert answer.returncode == 0, answer.stderr
    # spec.xdp.enabled where the operator does not allow it: the same restricted pods
    refused_xdp = manifests.stateful_set(routed, initial_replicas=3, xdp_allowed=False)
    answer = dry_run_pod(crds, restricted, refused_xdp["spec"]["template"], "routed-0")
    assert answer.returncode == 0, answer.stderr

    # the operator's own pod, as the chart renders it (defaults)
    deployment = next(d for d in rendered(crds) if d["kind"] == "Deployment")
    answer = dry_run_pod(crds, restricted, deployment["spec"]["template"], "operator")
    assert answer.returncode == 0, answer.stderr
