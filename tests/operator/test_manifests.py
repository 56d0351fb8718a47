"""The operator's builders: a LaminarCluster's spec -> the objects it owns (no cluster)."""

from __future__ import annotations

import base64
import copy
from typing import Any

import pytest

from laminar_operator import manifests as m

CLUSTER: dict[str, Any] = {
    "apiVersion": "laminarmq.io/v1alpha1",
    "kind": "LaminarCluster",
    "metadata": {"name": "demo", "namespace": "prod", "uid": "1234-abcd", "generation": 1},
    "spec": {"replicas": 3, "storage": {"size": "1Gi", "storageClassName": "fast"}},
}


def build(cluster: dict[str, Any] = CLUSTER, **kw: Any) -> dict[str, dict[str, Any]]:
    objects = m.owned(cluster, hmac_key=b"k" * 32, initial_replicas=3, **kw)
    return {obj["kind"]: obj for obj in objects}


def test_every_object_is_owned_by_the_cluster_and_labelled() -> None:
    objects = m.owned(CLUSTER, hmac_key=b"k" * 32, initial_replicas=3)
    assert [o["kind"] for o in objects] == [
        "ServiceAccount", "Role", "RoleBinding", "Secret", "ConfigMap", "Service", "Service",
        "StatefulSet", "PodDisruptionBudget",
    ]  # fmt: skip
    for obj in objects:
        meta = obj["metadata"]
        assert meta["namespace"] == "prod"
        assert meta["labels"]["app.kubernetes.io/instance"] == "demo"
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "laminarmq.io/v1alpha1",
                "kind": "LaminarCluster",
                "name": "demo",
                "uid": "1234-abcd",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    assert len({(o["kind"], o["metadata"]["name"]) for o in objects}) == len(objects)


def test_building_twice_gives_the_same_objects() -> None:
    assert m.owned(CLUSTER, hmac_key=b"x", initial_replicas=3) == m.owned(
        copy.deepcopy(CLUSTER), hmac_key=b"x", initial_replicas=3
    )


def test_stateful_set() -> None:
    sts = build()["StatefulSet"]
    spec = sts["spec"]
    assert spec["replicas"] == 3 and spec["serviceName"] == "demo-peers"
    pod = spec["template"]["spec"]
    (broker,) = pod["containers"]
    assert broker["image"] == "laminar-broker:latest" and broker["args"] == ["serve"]
    assert broker["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert broker["livenessProbe"]["httpGet"]["path"] == "/healthz"
    pre_stop = broker["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[:3] == ["laminar", "node", "handoff"]  # the node id: $LAMINAR_NODE_ID
    security = broker["securityContext"]
    assert security["runAsNonRoot"] and security["readOnlyRootFilesystem"]
    assert not security["allowPrivilegeEscalation"] and security["capabilities"]["drop"] == ["ALL"]
    assert "initContainers" not in pod  # no privileged container unless xdp is enabled
    env = {e["name"]: e for e in broker["env"]}
    assert env["LAMINAR_NODE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert (
        env["LAMINAR_ADVERTISE_HOST"]["value"]
        == "$(LAMINAR_NODE_ID).demo-peers.$(POD_NAMESPACE).svc"
    )
    assert broker["envFrom"] == [{"configMapRef": {"name": "demo-config"}}]
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert claim["spec"]["storageClassName"] == "fast"
    assert pod["serviceAccountName"] == "demo-broker"
    assert spec["selector"]["matchLabels"] == spec["template"]["metadata"]["labels"]


def test_xdp_adds_the_one_privileged_container_and_leaves_the_broker_unprivileged() -> None:
    plain = build()["StatefulSet"]["spec"]["template"]["spec"]
    cluster = copy.deepcopy(CLUSTER)
    cluster["spec"]["xdp"] = {"enabled": True}
    pod = build(cluster)["StatefulSet"]["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["command"][:4] == ["laminar-xdp", "load", "--iface", "eth0"]
    assert init["image"] == pod["containers"][0]["image"]  # the loader ships in the broker image
    assert init["securityContext"]["privileged"] and init["securityContext"]["runAsUser"] == 0
    assert init["envFrom"] == [{"configMapRef": {"name": "demo-config"}}]  # cluster id, ports
    env = {e["name"]: e.get("value") for e in init["env"]}
    assert env["LAMINAR_XDP_PIN_DIR"] == "/sys/fs/bpf/laminar/$(POD_NAMESPACE)_$(POD_NAME)"
    (bpffs,) = [v for v in pod["volumes"] if v["name"] == "bpffs"]
    assert bpffs["hostPath"]["path"] == "/sys/fs/bpf"
    (broker,) = pod["containers"]
    (plain_broker,) = plain["containers"]
    assert broker["securityContext"] == plain_broker["securityContext"]  # still unprivileged
    assert pod["securityContext"] == plain["securityContext"]
    # ... and reads its own pod's counters, read-only, from where the init container pinned them
    (pins,) = [m for m in broker["volumeMounts"] if m["name"] == "bpffs"]
    assert pins["readOnly"] and pins["subPathExpr"] == "laminar/$(POD_NAMESPACE)_$(LAMINAR_NODE_ID)"
    broker_env = {e["name"]: e.get("value") for e in broker["env"]}
    assert broker_env["LAMINAR_XDP_PIN_DIR"] == pins["mountPath"]
    assert "LAMINAR_XDP_PIN_DIR" not in {e["name"] for e in plain_broker["env"]}


def test_scale_down_overrides_the_replicas_only() -> None:
    assert build(replicas=5)["StatefulSet"]["spec"]["replicas"] == 5


def test_peer_service_publishes_addresses_before_readiness() -> None:
    services = [
        o for o in m.owned(CLUSTER, hmac_key=b"k", initial_replicas=3) if o["kind"] == "Service"
    ]
    peers, client = services
    assert peers["metadata"]["name"] == "demo-peers" and client["metadata"]["name"] == "demo"
    assert peers["spec"]["clusterIP"] == "None" and peers["spec"]["publishNotReadyAddresses"]
    assert {p["name"] for p in peers["spec"]["ports"]} == {"api", "peer", "gossip"}


def test_config_map_keeps_the_initial_nodes_and_seeds() -> None:
    data = m.owned(CLUSTER, hmac_key=b"k", initial_replicas=3)[4]["data"]
    assert data["LAMINAR_INITIAL_NODES"] == "demo-0,demo-1,demo-2"
    assert data["LAMINAR_SEEDS"].split(",") == [
        f"demo-{i}.demo-peers.prod.svc:7072" for i in range(3)
    ]
    scaled = copy.deepcopy(CLUSTER)
    scaled["spec"]["replicas"] = 7
    again = m.owned(scaled, hmac_key=b"k", initial_replicas=3)[4]["data"]
    assert again["LAMINAR_INITIAL_NODES"] == data["LAMINAR_INITIAL_NODES"]


def test_secret_carries_the_given_key() -> None:
    secret = build()["Secret"]
    assert base64.b64decode(secret["data"]["hmac"]) == b"k" * 32


def test_broker_role_may_only_touch_status() -> None:
    rules = build()["Role"]["rules"]
    writable = [r for r in rules if "patch" in r["verbs"]]
    assert writable == [
        {
            "apiGroups": ["laminarmq.io"],
            "resources": ["laminarclusters/status", "topics/status"],
            "verbs": ["get", "patch"],
        }
    ]


@pytest.mark.parametrize(
    ("change", "rolls"),
    [
        (lambda s: s.update(replicas=9), False),
        (lambda s: s.update(image="laminar-broker:2"), True),
        (lambda s: s.setdefault("config", {}).update(fsync="interval"), True),
        (lambda s: s.update(resources={"limits": {"memory": "2Gi"}}), True),
    ],
)
def test_spec_changes_roll_the_pods_but_scaling_does_not(change: Any, rolls: bool) -> None:
    changed = copy.deepcopy(CLUSTER)
    change(changed["spec"])
    before = build()["StatefulSet"]["spec"]["template"]["metadata"]["annotations"]
    after = build(changed)["StatefulSet"]["spec"]["template"]["metadata"]["annotations"]
    assert (before != after) is rolls


def test_selector_matches_the_pod_labels() -> None:
    pod_labels = build()["StatefulSet"]["spec"]["template"]["metadata"]["labels"]
    assert dict(part.split("=") for part in m.selector("demo").split(",")) == pod_labels
