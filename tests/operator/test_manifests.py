"""The operator's builders: a LaminarCluster's spec -> the objects it owns (no cluster)."""

from __future__ import annotations

import base64
import copy
from decimal import Decimal
from typing import Any

import pytest

from laminar.credentials import Role, new_token, parse, token_hash
from laminar_operator import manifests as m

CLUSTER: dict[str, Any] = {
    "apiVersion": "laminarmq.io/v1alpha1",
    "kind": "LaminarCluster",
    "metadata": {"name": "demo", "namespace": "prod", "uid": "1234-abcd", "generation": 1},
    "spec": {"replicas": 3, "storage": {"size": "1Gi", "storageClassName": "fast"}},
}


def build(cluster: dict[str, Any] = CLUSTER, **kw: Any) -> dict[str, dict[str, Any]]:
    objects = m.owned(cluster, initial_replicas=3, **kw)
    return {obj["kind"]: obj for obj in objects}


def with_spec(**changes: Any) -> dict[str, Any]:
    cluster = copy.deepcopy(CLUSTER)
    cluster["spec"].update(changes)
    return cluster


def test_every_object_is_owned_by_the_cluster_and_labelled() -> None:
    objects = m.owned(CLUSTER, initial_replicas=3)
    assert [o["kind"] for o in objects] == [
        "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Service", "Service",
        "StatefulSet", "PodDisruptionBudget", "NetworkPolicy",
    ]  # fmt: skip
    for obj in [*objects, m.secret(CLUSTER, b"k" * 32)]:
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
    assert m.owned(CLUSTER, initial_replicas=3) == m.owned(
        copy.deepcopy(CLUSTER), initial_replicas=3
    )


def test_stateful_set() -> None:
    sts = build()["StatefulSet"]
    spec = sts["spec"]
    assert spec["replicas"] == 3 and spec["serviceName"] == "demo-peers"
    pod = spec["template"]["spec"]
    (broker,) = pod["containers"]
    assert broker["image"] == "laminar-broker:0.1.0" and broker["args"] == ["serve"]
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
    cluster = with_spec(xdp={"enabled": True})
    pod = build(cluster, xdp_allowed=True)["StatefulSet"]["spec"]["template"]["spec"]
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
    # still unprivileged: seccomp Unconfined only, for bpf() on the router's counters
    unconfined = {**plain_broker["securityContext"], "seccompProfile": {"type": "Unconfined"}}
    assert broker["securityContext"] == unconfined
    assert pod["securityContext"] == plain["securityContext"]
    # ... and reads its own pod's counters, read-only, from where the init container pinned them
    (pins,) = [m for m in broker["volumeMounts"] if m["name"] == "bpffs"]
    assert pins["readOnly"] and pins["subPathExpr"] == "laminar/$(POD_NAMESPACE)_$(LAMINAR_NODE_ID)"
    broker_env = {e["name"]: e.get("value") for e in broker["env"]}
    assert broker_env["LAMINAR_XDP_PIN_DIR"] == pins["mountPath"]
    assert "LAMINAR_XDP_PIN_DIR" not in {e["name"] for e in plain_broker["env"]}
    # nothing else of the broker's is lost (regression, the kind e2e: the TLS settings were,
    # and the XDP pods served plain HTTP to HTTPS probes)
    assert plain_broker["env"] == broker["env"][:-1]
    assert broker_env["LAMINAR_TLS_CERT_FILE"] == f"{m.TLS_DIR}/tls.crt"


def test_xdp_the_operator_does_not_allow_renders_nothing_privileged() -> None:
    plain = build()["StatefulSet"]
    refused = build(with_spec(xdp={"enabled": True}))["StatefulSet"]  # xdp_allowed: False
    assert refused == plain  # the same pods (no init container, no hostPath): nothing rolls
    for allowed in (True, False):
        pod = build(xdp_allowed=allowed)["StatefulSet"]["spec"]["template"]["spec"]
        assert "initContainers" not in pod and "bpffs" not in {v["name"] for v in pod["volumes"]}
    allowed = build(with_spec(xdp={"enabled": True}), xdp_allowed=True)["StatefulSet"]
    hash_key = m.SPEC_HASH_ANNOTATION
    assert (
        allowed["spec"]["template"]["metadata"]["annotations"][hash_key]
        != plain["spec"]["template"]["metadata"]["annotations"][hash_key]
    )  # allowing it later rolls the pods onto the router


def test_network_policy_admits_clients_the_operator_and_metrics_to_the_api_only() -> None:
    cluster = with_spec(
        networkPolicy={
            "clientSelectors": [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}}
            ]
        }
    )
    policy = build(cluster, operator_namespace="laminar-system")["NetworkPolicy"]
    spec = policy["spec"]
    pods = {"matchLabels": build()["StatefulSet"]["spec"]["selector"]["matchLabels"]}
    assert spec["podSelector"] == pods and spec["policyTypes"] == ["Ingress"]
    api, internal = spec["ingress"]
    assert api["ports"] == [{"protocol": "TCP", "port": 7070}]
    assert api["from"] == [
        {"podSelector": pods},  # the brokers ask each other's API
        {"podSelector": {"matchLabels": {"laminarmq.io/client": "true"}}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}},
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "laminar-system"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "laminar-operator"}},
        },
        {"namespaceSelector": {"matchLabels": {"laminarmq.io/metrics": "true"}}},  # default
    ]
    assert internal == {
        "from": [{"podSelector": pods}],
        "ports": [{"protocol": "TCP", "port": 7071}, {"protocol": "UDP", "port": 7072}],
    }


def test_workers_per_pod_opens_their_ports_and_requests_their_cores() -> None:
    one = build()
    assert one["ConfigMap"]["data"]["LAMINAR_WORKERS"] == "1"
    broker = one["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]
    assert "resources" not in broker  # (one worker: as before, no CPU request made up)
    objects = build(with_spec(workersPerPod=3))
    assert objects["ConfigMap"]["data"]["LAMINAR_WORKERS"] == "3"
    broker = objects["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in broker["ports"]}
    assert ports == {"api": 7070, "peer": 7071, "gossip": 7072, "api-1": 7073, "peer-1": 7074,
                     "api-2": 7076, "peer-2": 7077, "steer": 7069}  # fmt: skip
    assert {"name": "LAMINAR_STEER_PORT", "value": "7069"} in broker["env"]
    alone = one["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]
    assert not any(e["name"] == "LAMINAR_STEER_PORT" for e in alone["env"])  # (one worker)
    assert broker["resources"] == {"requests": {"cpu": "3"}}
    api, internal = objects["NetworkPolicy"]["spec"]["ingress"]
    assert [p["port"] for p in api["ports"]] == [7070, 7073, 7076, 7069]
    assert [p["port"] for p in internal["ports"]] == [7071, 7074, 7077, 7072]
    # a CPU request the spec gives is kept; the other resources are untouched
    given = {"requests": {"cpu": "1500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}
    objects = build(with_spec(workersPerPod=2, resources=given))
    broker = objects["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]
    assert broker["resources"] == given
    given = {"limits": {"memory": "2Gi"}}
    objects = build(with_spec(workersPerPod=2, resources=given))
    broker = objects["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]
    assert broker["resources"] == {"limits": {"memory": "2Gi"}, "requests": {"cpu": "2"}}


def test_network_policy_settings() -> None:
    outside = build()["NetworkPolicy"]["spec"]["ingress"][0]["from"]  # no operator namespace
    assert not any("laminar-operator" in str(peer) for peer in outside)
    prometheus = {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    elsewhere = with_spec(networkPolicy={"metricsNamespaceSelector": prometheus})
    api = build(elsewhere)["NetworkPolicy"]["spec"]["ingress"][0]["from"]
    assert api == [*outside[:2], {"namespaceSelector": prometheus}]
    assert "NetworkPolicy" not in build(with_spec(networkPolicy={"enabled": False}))
    # the policy changes no pod: it does not roll the brokers
    annotations = build(elsewhere)["StatefulSet"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations == build()["StatefulSet"]["spec"]["template"]["metadata"]["annotations"]


def test_scale_down_overrides_the_replicas_only() -> None:
    assert build(replicas=5)["StatefulSet"]["spec"]["replicas"] == 5


def test_peer_service_publishes_addresses_before_readiness() -> None:
    services = [o for o in m.owned(CLUSTER, initial_replicas=3) if o["kind"] == "Service"]
    peers, client = services
    assert peers["metadata"]["name"] == "demo-peers" and client["metadata"]["name"] == "demo"
    assert peers["spec"]["clusterIP"] == "None" and peers["spec"]["publishNotReadyAddresses"]
    assert {p["name"] for p in peers["spec"]["ports"]} == {"api", "peer", "gossip"}


def test_config_map_keeps_the_initial_nodes_and_seeds() -> None:
    data = build()["ConfigMap"]["data"]
    assert data["LAMINAR_INITIAL_NODES"] == "demo-0,demo-1,demo-2"
    assert data["LAMINAR_SEEDS"].split(",") == [
        f"demo-{i}.demo-peers.prod.svc:7072" for i in range(3)
    ]
    scaled = copy.deepcopy(CLUSTER)
    scaled["spec"]["replicas"] = 7
    again = build(scaled)["ConfigMap"]["data"]
    assert again["LAMINAR_INITIAL_NODES"] == data["LAMINAR_INITIAL_NODES"]


def test_secret_carries_the_given_key() -> None:
    secret = m.secret(CLUSTER, b"k" * 32)
    assert base64.b64decode(secret["data"]["hmac"]) == b"k" * 32


def test_the_credentials_secret_holds_hashes_for_the_brokers_and_two_tokens() -> None:
    """<name>-credentials: the brokers' credentials file (the operator's and the admin's
    tokens as admins, the client's as producer and consumer of every topic; hashes only) and
    the admin's and client's tokens, never the operator's (kept in its own namespace)."""
    operator, admin, client = (new_token() for _ in range(3))
    secret = m.credentials_secret(
        CLUSTER, operator_token=operator, admin_token=admin, client_token=client
    )
    assert secret["metadata"]["name"] == "demo-credentials"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "1234-abcd"
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert set(data) == {"credentials.yaml", "admin-token", "client-token"}
    assert (data["admin-token"].strip(), data["client-token"].strip()) == (admin, client)
    assert operator not in str(secret) and operator not in data["credentials.yaml"]
    by_name = {p.name: p for p in parse(data["credentials.yaml"])}
    assert by_name["laminar-operator"].hashes == (token_hash(operator),)
    assert by_name["laminar-operator"].admin and by_name["admin"].admin
    assert by_name["admin"].hashes == (token_hash(admin),)
    assert by_name["client"].roles == {Role.PRODUCER, Role.CONSUMER}
    assert by_name["client"].topics == ("*",) and not by_name["client"].admin
    kept = m.operator_token_secret(CLUSTER, "laminar-system", operator)
    assert kept["metadata"]["name"] == "laminar-token-1234-abcd"
    assert kept["metadata"]["namespace"] == "laminar-system"
    assert "ownerReferences" not in kept["metadata"]  # another namespace: deleted with it
    assert base64.b64decode(kept["data"]["token"]).decode() == operator
    same_namespace = m.operator_token_secret(CLUSTER, "prod", operator)
    assert same_namespace["metadata"]["ownerReferences"][0]["uid"] == "1234-abcd"


def test_brokers_mount_the_credentials_file_and_the_admin_token_only() -> None:
    pod = build()["StatefulSet"]["spec"]["template"]["spec"]
    (broker,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in broker["env"]}
    assert env["LAMINAR_CREDENTIALS_FILE"] == "/etc/laminar/credentials/credentials.yaml"
    assert env["LAMINAR_TOKEN_FILE"] == "/etc/laminar/credentials/admin-token"  # preStop hook
    assert "LAMINAR_ALLOW_ANONYMOUS" not in env and "LAMINAR_ADMIN_TOKEN_FILE" not in env
    mount = next(v for v in broker["volumeMounts"] if v["name"] == "credentials")
    assert mount == {
        "name": "credentials",
        "mountPath": "/etc/laminar/credentials",
        "readOnly": True,
    }  # fmt: skip  (no subPath: the kubelet refreshes it)
    volume = next(v for v in pod["volumes"] if v["name"] == "credentials")
    assert volume["secret"]["secretName"] == "demo-credentials"
    assert [i["key"] for i in volume["secret"]["items"]] == ["credentials.yaml", "admin-token"]


def test_broker_role_may_only_touch_status() -> None:
    assert build()["Role"]["rules"] == [
        {
            "apiGroups": ["laminarmq.io"],
            "resources": ["laminarclusters/status", "topics/status"],
            "verbs": ["patch"],
        },
        {"apiGroups": ["laminarmq.io"], "resources": ["topics"], "verbs": ["list"]},
    ]


@pytest.mark.parametrize(
    ("change", "rolls"),
    [
        (lambda s: s.update(replicas=9), False),
        (lambda s: s.update(image="laminar-broker:2"), True),
        (lambda s: s.setdefault("config", {}).update(fsync="interval"), True),
        (lambda s: s.update(resources={"limits": {"memory": "2Gi"}}), True),
        (lambda s: s.update(networkPolicy={"enabled": False}), False),
        (lambda s: s.update(xdp={"enabled": True}), False),  # not allowed: the same pods
        (lambda s: s.update(tls={"enabled": False}), True),
        # the volumes grow under the running pods; the retention is the StatefulSet's
        (lambda s: s["storage"].update(size="2Gi"), False),
        (lambda s: s["storage"].update(persistentVolumeClaimRetentionPolicy={}), False),
        (lambda s: s.update(template={"pod": {"nodeSelector": {"disk": "ssd"}}}), True),
        (lambda s: s.update(template={"pod": {"metadata": {"labels": {"a": "b"}}}}), True),
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


def test_tls_mounts_the_certificate_and_probes_over_https() -> None:
    pod = build()["StatefulSet"]["spec"]["template"]["spec"]
    (broker,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in broker["env"]}
    assert env["LAMINAR_TLS_CERT_FILE"] == f"{m.TLS_DIR}/tls.crt"
    assert env["LAMINAR_TLS_KEY_FILE"] == f"{m.TLS_DIR}/tls.key"
    assert env["LAMINAR_TLS_CA_FILE"] == f"{m.TLS_DIR}/ca.crt"
    # the whole Secret as a directory (no subPath): the kubelet refreshes renewed certificates
    assert {"name": "tls", "mountPath": m.TLS_DIR, "readOnly": True} in broker["volumeMounts"]
    assert {"name": "tls", "secret": {"secretName": "demo-tls"}} in pod["volumes"]
    assert broker["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert broker["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    hook = broker["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[hook.index("--brokers") + 1] == "https://127.0.0.1:7070"
    assert hook[hook.index("--ca-file") + 1] == f"{m.TLS_DIR}/ca.crt"

    plain = build(with_spec(tls={"enabled": False}))["StatefulSet"]["spec"]["template"]["spec"]
    (broker,) = plain["containers"]
    assert not any(e["name"].startswith("LAMINAR_TLS") for e in broker["env"])
    assert "scheme" not in broker["readinessProbe"]["httpGet"]
    assert "http://127.0.0.1:7070" in broker["lifecycle"]["preStop"]["exec"]["command"]
    assert all(v["name"] != "tls" for v in plain["volumes"])


def test_tls_secrets_and_the_names_the_certificate_is_for() -> None:
    names = m.broker_names("demo", "prod")
    for name in ("demo", "demo.prod.svc", "demo.prod.svc.cluster.local",
                 "*.demo-peers.prod.svc", "*.demo-peers.prod.svc.cluster.local"):  # fmt: skip
        assert name in names
    # what a broker advertises and its peers dial is one of them
    assert m.pod_address("demo", "prod", 2).endswith(".demo-peers.prod.svc")
    public = m.ca_secret(CLUSTER, b"CA")
    assert public["metadata"]["name"] == "demo-ca" and public["data"] == {
        "ca.crt": base64.b64encode(b"CA").decode()
    }  # the certificate only: never the key
    tls = m.tls_secret(CLUSTER, b"C", b"K", b"CA")
    assert tls["type"] == "kubernetes.io/tls" and set(tls["data"]) == {
        "tls.crt",
        "tls.key",
        "ca.crt",
    }
    for obj in (public, tls):
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "1234-abcd"
    kept = m.ca_key_secret(CLUSTER, "laminar-system", {"ca.crt": "Q0E=", "ca.key": "S0VZ"})
    assert kept["metadata"]["name"] == "laminar-ca-1234-abcd"
    assert kept["metadata"]["namespace"] == "laminar-system"
    assert "ownerReferences" not in kept["metadata"]  # no owner across namespaces
    assert "ownerReferences" in m.ca_key_secret(CLUSTER, "prod", {"ca.crt": "Q0E="})["metadata"]


def test_the_pods_are_restricted_but_the_xdp_router() -> None:
    """Pod Security "restricted": non-root, seccomp RuntimeDefault, no privilege escalation,
    no capabilities, for the broker; the XDP init container is the one exception."""
    pod = build()["StatefulSet"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in pod["containers"]:
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert "seccompProfile" not in security  # the pod's
    routed = build(with_spec(xdp={"enabled": True}), xdp_allowed=True)["StatefulSet"]
    (init,) = routed["spec"]["template"]["spec"]["initContainers"]
    assert init["securityContext"]["seccompProfile"] == {"type": "Unconfined"}
    # the broker reads the router's counters with bpf(), which RuntimeDefault refuses
    (broker,) = routed["spec"]["template"]["spec"]["containers"]
    assert broker["securityContext"]["seccompProfile"] == {"type": "Unconfined"}
    assert broker["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_the_claims_are_retained_unless_the_spec_says() -> None:
    sts = build()["StatefulSet"]["spec"]
    assert sts["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Retain",
        "whenScaled": "Retain",
    }
    storage = {"size": "1Gi", "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete"}}
    sts = build(with_spec(storage=storage))["StatefulSet"]["spec"]
    assert sts["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Delete",
        "whenScaled": "Retain",
    }
    assert m.claim_name("demo", 2) == "data-demo-2"
    assert m.claim_size(build()["StatefulSet"]) == "1Gi"
    assert m.claim_size({"spec": {}}) is None


def test_the_pod_template_adds_scheduling_labels_and_annotations() -> None:
    plain = build()["StatefulSet"]["spec"]["template"]
    assert plain["spec"]["affinity"] == {"podAntiAffinity": m.default_pod_anti_affinity("demo")}
    (term,) = plain["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == plain["metadata"]["labels"]
    for key in ("tolerations", "nodeSelector", "priorityClassName", "imagePullSecrets",
                "topologySpreadConstraints"):  # fmt: skip
        assert key not in plain["spec"], key

    zone = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}
    template = {
        "pod": {
            # the selector's labels and the spec hash stay the operator's (the CRD refuses
            # them too)
            "metadata": {
                "labels": {"team": "a", "app.kubernetes.io/instance": "other"},
                "annotations": {"note": "x", m.SPEC_HASH_ANNOTATION: "mine"},
            },
            "affinity": {"nodeAffinity": zone},
            "tolerations": [{"key": "k", "operator": "Exists"}],
            "nodeSelector": {"disk": "ssd"},
            "topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"},
                {"maxSkew": 2, "topologyKey": "node", "whenUnsatisfiable": "ScheduleAnyway",
                 "labelSelector": {"matchLabels": {"team": "a"}}},
            ],
            "priorityClassName": "high",
            "imagePullSecrets": [{"name": "registry"}],
        }
    }  # fmt: skip
    sts = build(with_spec(template=template))["StatefulSet"]["spec"]
    pod = sts["template"]
    assert pod["metadata"]["labels"] == {**plain["metadata"]["labels"], "team": "a"}
    assert sts["selector"]["matchLabels"] == plain["metadata"]["labels"]
    annotations = pod["metadata"]["annotations"]
    assert annotations["note"] == "x" and annotations[m.SPEC_HASH_ANNOTATION] != "mine"
    assert pod["spec"]["affinity"] == {
        "nodeAffinity": zone,
        "podAntiAffinity": m.default_pod_anti_affinity("demo"),
    }
    assert pod["spec"]["tolerations"] == [{"key": "k", "operator": "Exists"}]
    assert pod["spec"]["nodeSelector"] == {"disk": "ssd"}
    assert pod["spec"]["priorityClassName"] == "high"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "registry"}]
    first, second = pod["spec"]["topologySpreadConstraints"]
    assert first["labelSelector"] == {"matchLabels": plain["metadata"]["labels"]}
    assert second["labelSelector"] == {"matchLabels": {"team": "a"}}  # the user's own

    # an anti-affinity of the user's replaces the default; {} for none
    mine = {"requiredDuringSchedulingIgnoredDuringExecution": []}
    for anti, wanted in ((mine, {"podAntiAffinity": mine}), ({}, None)):
        cluster = with_spec(template={"pod": {"affinity": {"podAntiAffinity": anti}}})
        got = build(cluster)["StatefulSet"]["spec"]["template"]["spec"].get("affinity")
        assert got == wanted


@pytest.mark.parametrize(
    ("text", "value"),
    [("10Gi", 10 * 2**30), ("1.5Gi", 1.5 * 2**30), ("1536Mi", 1.5 * 2**30), ("500m", 0.5),
     ("2G", 2e9), ("1k", 1000), ("5e9", 5e9), ("007", 7), (".5Ki", 512)],
)  # fmt: skip
def test_quantities(text: str, value: float) -> None:
    assert m.quantity(text) == Decimal(str(value))


@pytest.mark.parametrize("text", ["", "Gi", "10Gb", "1.2.3", "ten"])
def test_not_quantities(text: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        m.quantity(text)
