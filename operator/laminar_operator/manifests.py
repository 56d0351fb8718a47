"""What the operator owns for one LaminarCluster, built from its spec: pure functions, no I/O.

`owned(cluster, ...)` lists, in the order they are applied: the broker ServiceAccount with a
Role that may only list Topics and patch the status of LaminarClusters and Topics (and its
binding),
the ConfigMap of broker settings (LAMINAR_* variables), the headless peer Service, the client
Service, the StatefulSet, the PodDisruptionBudget and, unless spec.networkPolicy.enabled is
false, the NetworkPolicy. The Secret with the cluster HMAC key (`secret`) is created once,
before them, and never applied again; so is `<name>-credentials`, the client credentials
(`credentials_secret`: the brokers' credentials file, an admin and a client token; the
operator's own token stays in its namespace, `operator_token_secret`). With spec.tls.enabled
(the default), the Secrets of TLS come first too: `<name>-ca` holds the cluster CA's
certificate (`ca_secret`, public: clients mount it), `<name>-tls` the brokers' key and
certificate (`tls_secret`, valid for the names of `broker_names`), mounted at TLS_DIR; the CA's
key is never in the cluster's namespace (`ca_key_secret`, docs/kubernetes.md "TLS"). Every
object carries the cluster's labels and an owner reference to it, so that deleting the cluster
garbage-collects them. `cluster` is the custom object as the API server returns it (defaults
applied); missing fields take the CRD's defaults here too.

Two settings are the operator's, not the cluster's: whether the privileged XDP init container
may run at all (`xdp_allowed`, the chart's xdp.allowed), and the namespace the operator runs in
(admitted to the brokers' API port by the NetworkPolicy).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from decimal import Decimal, InvalidOperation
from typing import Any

from laminar import credentials, settings
from laminar.credentials import Role, token_hash
from laminar.workers import PORT_STRIDE

API_GROUP = "laminarmq.io"
API_VERSION = f"{API_GROUP}/v1alpha1"
KIND = "LaminarCluster"
#: The brokers' ports: their defaults (laminar/settings.py), which the pods do not change.
API_PORT = settings.API_PORT.default
PEER_PORT = settings.PEER_PORT.default
GOSSIP_PORT = settings.GOSSIP_PORT.default
#: With spec.workersPerPod above 1: the API port the pod's workers share, on which the kernel
#: hands each connection to the worker its TCP source port names (docs/workers.md, layer 3)
STEER_PORT = 7069
DATA_DIR = "/var/lib/laminar"
SECRET_DIR = "/etc/laminar/secret"
SECRET_KEY = "hmac"
#: The client credentials (docs/security.md, "Clients: authentication and authorization"):
#: the Secret `<name>-credentials` holds the brokers' credentials file and two tokens; the
#: brokers mount the file and the admin token here.
CREDENTIALS_DIR = "/etc/laminar/credentials"
CREDENTIALS_KEY = "credentials.yaml"
ADMIN_TOKEN_KEY = "admin-token"
CLIENT_TOKEN_KEY = "client-token"
#: The operator's own principal in every cluster's credentials file (an admin).
OPERATOR_PRINCIPAL = "laminar-operator"
#: Where the brokers' TLS Secret is mounted (a whole directory: the kubelet refreshes it).
TLS_DIR = "/etc/laminar/tls"
TLS_CERT_KEY, TLS_KEY_KEY, CA_CERT_KEY = "tls.crt", "tls.key", "ca.crt"
#: The cluster domain the brokers' certificate names (besides the names without it).
CLUSTER_DOMAIN = "cluster.local"
BROKER_UID = 10001
SPEC_HASH_ANNOTATION = f"{API_GROUP}/spec-hash"
INITIAL_NODES_KEY = settings.variable(settings.INITIAL_NODES)
TERMINATION_GRACE_S = 60
#: The pod's network interface, where the XDP router is attached.
POD_INTERFACE = "eth0"
BPF_FS = "/sys/fs/bpf"
#: Where the broker container sees its pod's pinned XDP maps (read-only), to export counters.
XDP_PIN_MOUNT = "/run/laminar/xdp"
#: Pods of a cluster's namespace with this label are admitted to its brokers' API port.
CLIENT_LABEL = f"{API_GROUP}/client"
#: Namespaces with this label are admitted to the API port (Prometheus scrapes /metrics there)
#: while spec.networkPolicy.metricsNamespaceSelector is unset (set, it replaces this).
METRICS_LABEL = f"{API_GROUP}/metrics"
#: The label telling a cluster's two Services apart ("client" and "peers"): the chart's
#: ServiceMonitor selects the client Service's, so that each broker is scraped once.
SERVICE_LABEL = f"{API_GROUP}/service"
#: The label of the operator's pods (the chart's), admitted from the operator's namespace.
OPERATOR_POD_LABELS = {"app.kubernetes.io/name": "laminar-operator"}

Object = dict[str, Any]

#: The StatefulSet's volumeClaimTemplate: each broker's PersistentVolumeClaim is
#: `data-<name>-<ordinal>` (`claim_name`).
CLAIM_TEMPLATE = "data"
#: spec.storage.persistentVolumeClaimRetentionPolicy's default: the brokers' volumes (their
#: logs) outlive the cluster and a scale-down, until deleted by hand (docs/kubernetes.md,
#: "Storage").
RETAIN_CLAIMS = {"whenDeleted": "Retain", "whenScaled": "Retain"}
#: The node label the default pod anti-affinity spreads the brokers across.
HOSTNAME_TOPOLOGY_KEY = "kubernetes.io/hostname"
#: The seccomp profile Pod Security "restricted" asks for: the brokers' pods', which every
#: container takes but, with XDP, the init container and the broker's (Unconfined: the one
#: exception; the broker reads the router's counters with bpf(), which RuntimeDefault refuses).
RUNTIME_DEFAULT_SECCOMP = {"type": "RuntimeDefault"}
UNCONFINED = {"type": "Unconfined"}

#: The CRD's defaults (crds/laminarclusters.laminarmq.io.yaml; tests/test_settings.py holds
#: them to it), and the operator's where the CRD has none (resources,
#: networkPolicy.clientSelectors and metricsNamespaceSelector).
DEFAULTS: Object = {
    "replicas": 3,
    "image": "laminar-broker:0.1.0",  # the project's version (pyproject.toml)
    "imagePullPolicy": "IfNotPresent",
    "storage": {"size": "10Gi", "persistentVolumeClaimRetentionPolicy": RETAIN_CLAIMS},
    "resources": {},
    "config": {"replicationFactor": 3, "fsync": settings.FSYNC.default.value},
    "xdp": {"enabled": False},
    "tls": {"enabled": True},
    "workersPerPod": 1,
    "networkPolicy": {
        "enabled": True,
        "clientSelectors": [],
        "metricsNamespaceSelector": {"matchLabels": {METRICS_LABEL: "true"}},
    },
}
#: Spec fields that change no pod: a change of them does not roll the StatefulSet. (storage:
#: the volumes grow under the running pods, docs/kubernetes.md "Storage"; its class cannot
#: change.)
NOT_IN_PODS = ("replicas", "networkPolicy", "storage")


def spec_of(cluster: Object) -> Object:
    """The cluster's spec with the CRD's defaults filled in."""
    spec = dict(cluster.get("spec") or {})
    for key, default in DEFAULTS.items():
        if isinstance(default, dict):
            spec[key] = {**default, **(spec.get(key) or {})}
        else:
            spec.setdefault(key, default)
    return spec


def names(cluster: Object) -> tuple[str, str]:
    meta = cluster["metadata"]
    return meta["name"], meta["namespace"]


def labels(name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "laminar",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "broker",
        "app.kubernetes.io/managed-by": "laminar-operator",
    }


def selector(name: str) -> str:
    """The label selector of the cluster's pods (status.selector, for the scale subresource)."""
    return ",".join(
        f"{k}={v}" for k, v in sorted(labels(name).items()) if k != "app.kubernetes.io/managed-by"
    )


def owner_reference(cluster: Object) -> Object:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": cluster["metadata"]["name"],
        "uid": cluster["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _meta(cluster: Object, name: str) -> Object:
    cluster_name, namespace = names(cluster)
    return {
        "name": name,
        "namespace": namespace,
        "labels": labels(cluster_name),
        "ownerReferences": [owner_reference(cluster)],
    }


def peer_service_name(name: str) -> str:
    return f"{name}-peers"


def secret_name(name: str) -> str:
    return f"{name}-secret"


def ca_secret_name(name: str) -> str:
    return f"{name}-ca"


def tls_secret_name(name: str) -> str:
    return f"{name}-tls"


def ca_key_secret_name(uid: str) -> str:
    """The Secret holding a cluster's CA key, in the operator's namespace: named by the
    cluster's uid (a cluster made again under the same name gets a new CA)."""
    return f"laminar-ca-{uid}"


def tls_enabled(cluster: Object) -> bool:
    return bool(spec_of(cluster)["tls"].get("enabled", True))


def api_scheme(cluster: Object) -> str:
    return "https" if tls_enabled(cluster) else "http"


def broker_names(name: str, namespace: str) -> list[str]:
    """What the brokers' certificate is valid for: the client Service's names, every pod's
    name under the peer Service (what brokers advertise and dial), and the pod's loopback
    (its preStop hook calls its own broker)."""
    peers = f"{peer_service_name(name)}.{namespace}.svc"
    return [
        name,
        f"{name}.{namespace}",
        f"{name}.{namespace}.svc",
        f"{name}.{namespace}.svc.{CLUSTER_DOMAIN}",
        f"*.{peers}",
        f"*.{peers}.{CLUSTER_DOMAIN}",
        "localhost",
        "127.0.0.1",
    ]


def credentials_secret_name(name: str) -> str:
    return f"{name}-credentials"


def operator_token_secret_name(uid: str) -> str:
    """The Secret holding the operator's token for a cluster, in the operator's namespace:
    named by the cluster's uid (a cluster made again under the same name gets a new one)."""
    return f"laminar-token-{uid}"


def config_map_name(name: str) -> str:
    return f"{name}-config"


def service_account_name(name: str) -> str:
    return f"{name}-broker"


def pod_address(name: str, namespace: str, ordinal: int) -> str:
    return f"{name}-{ordinal}.{peer_service_name(name)}.{namespace}.svc"


def initial_nodes(name: str, replicas: int) -> str:
    """The node ids that form the cluster at its first start (the pods' names)."""
    return ",".join(f"{name}-{i}" for i in range(replicas))


def service_account(cluster: Object) -> Object:
    name, _ = names(cluster)
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(cluster, service_account_name(name)),
    }


def role(cluster: Object) -> Object:
    """The brokers may list this namespace's topics and merge-patch the status of its clusters
    and topics, nothing else (they report leadership and membership there; they read the
    Topics' status from the list)."""
    name, _ = names(cluster)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(cluster, service_account_name(name)),
        "rules": [
            {
                "apiGroups": [API_GROUP],
                "resources": ["laminarclusters/status", "topics/status"],
                "verbs": ["patch"],
            },
            {
                "apiGroups": [API_GROUP],
                "resources": ["topics"],
                "verbs": ["list"],
            },
        ],
    }


def role_binding(cluster: Object) -> Object:
    name, namespace = names(cluster)
    account = service_account_name(name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(cluster, account),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }


def secret(cluster: Object, hmac_key: bytes) -> Object:
    """The cluster's HMAC key (brokers authenticate each other with it). Created once by the
    operator with a new random key, and never changed or read back after: the operator may
    create Secrets, not read them."""
    name, _ = names(cluster)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(cluster, secret_name(name)),
        "type": "Opaque",
        "data": {SECRET_KEY: base64.b64encode(hmac_key).decode()},
    }


def credentials_secret(
    cluster: Object, *, operator_token: str, admin_token: str, client_token: str
) -> Object:
    """The cluster's client credentials, created once: the brokers' credentials file (only
    hashes: principals `laminar-operator` and `admin`, admins; `client`, producer and consumer
    of every topic) and the tokens of `admin` and `client`, for people and applications to
    mount (never the operator's: it keeps that in its own namespace)."""
    name, _ = names(cluster)
    principals = [
        credentials.entry(OPERATOR_PRINCIPAL, [Role.ADMIN], hashes=[token_hash(operator_token)]),
        credentials.entry("admin", [Role.ADMIN], hashes=[token_hash(admin_token)]),
        credentials.entry(
            "client", [Role.PRODUCER, Role.CONSUMER], ["*"], [token_hash(client_token)]
        ),
    ]
    data = {
        CREDENTIALS_KEY: credentials.dump(principals),
        ADMIN_TOKEN_KEY: admin_token + "\n",
        CLIENT_TOKEN_KEY: client_token + "\n",
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(cluster, credentials_secret_name(name)),
        "type": "Opaque",
        "data": {key: base64.b64encode(value.encode()).decode() for key, value in data.items()},
    }


def operator_token_secret(cluster: Object, namespace: str, token: str) -> Object:
    """The operator's token for a cluster's brokers, in `namespace`, the operator's own (read
    back by name): only its hash is in the cluster's `<name>-credentials`."""
    data = {"token": base64.b64encode(token.encode()).decode()}
    return _operator_secret(cluster, namespace, operator_token_secret_name(
        cluster["metadata"]["uid"]), "operator-token", data)  # fmt: skip


def ca_secret(cluster: Object, ca_pem: bytes) -> Object:
    """The cluster CA's certificate (public): what clients verify the brokers with."""
    name, _ = names(cluster)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(cluster, ca_secret_name(name)),
        "type": "Opaque",
        "data": {CA_CERT_KEY: base64.b64encode(ca_pem).decode()},
    }


def tls_secret(cluster: Object, cert_pem: bytes, key_pem: bytes, ca_pem: bytes) -> Object:
    """The brokers' key and certificate, with the CA bundle they verify each other with."""
    name, _ = names(cluster)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(cluster, tls_secret_name(name)),
        "type": "kubernetes.io/tls",
        "data": {
            TLS_CERT_KEY: base64.b64encode(cert_pem).decode(),
            TLS_KEY_KEY: base64.b64encode(key_pem).decode(),
            CA_CERT_KEY: base64.b64encode(ca_pem).decode(),
        },
    }


def ca_key_secret(cluster: Object, namespace: str, data: dict[str, str]) -> Object:
    """A cluster's CA (keys included; `data` as ca_rotation.CaState.to_data makes it) in
    `namespace`, the operator's own: the operator reads it back (by name) to sign renewals."""
    return _operator_secret(cluster, namespace, ca_key_secret_name(cluster["metadata"]["uid"]),
                            "ca", data)  # fmt: skip


def _operator_secret(
    cluster: Object, namespace: str, name: str, component: str, data: dict[str, str]
) -> Object:
    """A Secret of a cluster's that the operator keeps in `namespace`, its own, and reads back
    by name. In the cluster's own namespace (an operator that does not know its namespace) it
    is owned by the cluster; elsewhere the operator deletes it with the cluster."""
    cluster_name, cluster_namespace = names(cluster)
    uid = cluster["metadata"]["uid"]
    metadata: Object = {
        "name": name,
        "namespace": namespace,
        "labels": {
            "app.kubernetes.io/name": "laminar",
            "app.kubernetes.io/component": component,
            "app.kubernetes.io/managed-by": "laminar-operator",
            f"{API_GROUP}/cluster-uid": uid,
        },
        "annotations": {f"{API_GROUP}/cluster": f"{cluster_namespace}/{cluster_name}"},
    }
    if namespace == cluster_namespace:
        metadata["ownerReferences"] = [owner_reference(cluster)]
    return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "type": "Opaque",
            "data": data}  # fmt: skip


def broker_settings(cluster: Object, initial_replicas: int) -> dict[str, str]:
    """LAMINAR_* variables every broker of the cluster shares (`laminar serve` reads them):
    the cluster id, initial nodes and seeds, and the settings the spec sets (`spec_settings`).
    `initial_replicas`: the replicas the cluster was created with (never changes after)."""
    name, namespace = names(cluster)
    seeds = [f"{pod_address(name, namespace, i)}:{GOSSIP_PORT}" for i in range(initial_replicas)]
    return {
        settings.variable(settings.CLUSTER_ID): f"{namespace}.{name}",
        INITIAL_NODES_KEY: initial_nodes(name, initial_replicas),
        settings.variable(settings.SEEDS): ",".join(seeds),
        **spec_settings(spec_of(cluster)),
    }


def spec_settings(spec: Object) -> dict[str, str]:
    """The LAMINAR_* variables of the broker settings a LaminarCluster's spec sets (those of
    laminar/settings.py with a CRD path), for those `spec` (with defaults) has; the brokers
    keep their defaults for the others."""
    out: dict[str, str] = {}
    for setting in settings.SETTINGS:
        if setting.crd_path is None:
            continue
        value: Any = spec
        for key in setting.crd_path.split(".")[1:]:  # after "spec"
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            out[settings.variable(setting)] = settings.text(value)
    return out


def config_map(cluster: Object, initial_replicas: int) -> Object:
    name, _ = names(cluster)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(cluster, config_map_name(name)),
        "data": broker_settings(cluster, initial_replicas),
    }


def _ports() -> list[Object]:
    return [
        {"name": "api", "port": API_PORT, "targetPort": "api", "protocol": "TCP"},
        {"name": "peer", "port": PEER_PORT, "targetPort": "peer", "protocol": "TCP"},
        {"name": "gossip", "port": GOSSIP_PORT, "targetPort": "gossip", "protocol": "UDP"},
    ]


def peer_service(cluster: Object) -> Object:
    """Headless: a DNS name per pod, published before the pod is ready (brokers need each
    other to become ready)."""
    name, _ = names(cluster)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _service_meta(cluster, peer_service_name(name), "peers"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": _pod_selector(name),
            "ports": _ports(),
        },
    }


def client_service(cluster: Object) -> Object:
    name, _ = names(cluster)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _service_meta(cluster, name, "client"),
        "spec": {
            "selector": _pod_selector(name),
            "ports": [{"name": "api", "port": API_PORT, "targetPort": "api", "protocol": "TCP"}],
        },
    }


def _service_meta(cluster: Object, name: str, role: str) -> Object:
    meta = _meta(cluster, name)
    meta["labels"][SERVICE_LABEL] = role
    return meta


def _pod_selector(name: str) -> dict[str, str]:
    return {k: v for k, v in labels(name).items() if k != "app.kubernetes.io/managed-by"}


def xdp_wanted(cluster: Object) -> bool:
    """Does the cluster's spec ask for the XDP router?"""
    return bool(spec_of(cluster)["xdp"].get("enabled"))


def spec_hash(cluster: Object, initial_replicas: int, xdp_allowed: bool = False) -> str:
    """Changes whenever what the pods run changes (not with replicas, nor the NetworkPolicy):
    a new value in the pod template rolls the StatefulSet. XDP counts as the pods run it (on
    only when the spec asks and the operator allows it)."""
    spec = spec_of(cluster)
    relevant = {k: v for k, v in spec.items() if k not in NOT_IN_PODS}
    relevant["xdp"] = {**spec["xdp"], "enabled": xdp_wanted(cluster) and xdp_allowed}
    relevant["settings"] = broker_settings(cluster, initial_replicas)
    digest = hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()
    return digest[:16]


def stateful_set(
    cluster: Object, initial_replicas: int, replicas: int | None = None, xdp_allowed: bool = False
) -> Object:
    """The brokers. `replicas` overrides spec.replicas (a scale-down shrinks the StatefulSet
    only once the leaving brokers host nothing). The privileged XDP init container is there
    only when spec.xdp.enabled asks for it and the operator's `xdp_allowed` permits it.

    The pods pass Pod Security "restricted" (non-root, seccomp RuntimeDefault, no privilege
    escalation, no capabilities), the XDP init container apart; spec.template.pod adds
    scheduling, labels, annotations and pull secrets (`_pod_template`)."""
    name, _ = names(cluster)
    spec = spec_of(cluster)
    storage = spec["storage"]
    claim_spec: Object = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": storage["size"]}},
    }
    if storage.get("storageClassName"):
        claim_spec["storageClassName"] = storage["storageClassName"]
    env = [
        {"name": "LAMINAR_NODE_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "LAMINAR_KUBE_NAMESPACE", "value": "$(POD_NAMESPACE)"},
        {"name": "LAMINAR_KUBE_CLUSTER", "value": name},
        {
            "name": "LAMINAR_ADVERTISE_HOST",
            "value": f"$(LAMINAR_NODE_ID).{peer_service_name(name)}.$(POD_NAMESPACE).svc",
        },
        {"name": "LAMINAR_HOST", "value": "0.0.0.0"},
        {"name": "LAMINAR_DATA_DIR", "value": DATA_DIR},
        {"name": "LAMINAR_SECRET_FILE", "value": f"{SECRET_DIR}/{SECRET_KEY}"},
        {"name": "LAMINAR_CREDENTIALS_FILE", "value": f"{CREDENTIALS_DIR}/{CREDENTIALS_KEY}"},
        # for the `laminar` commands run in the pod (its preStop hook, kubectl exec)
        {"name": "LAMINAR_TOKEN_FILE", "value": f"{CREDENTIALS_DIR}/{ADMIN_TOKEN_KEY}"},
    ]
    steered = spec["workersPerPod"] > 1
    if steered:
        env.append({"name": "LAMINAR_STEER_PORT", "value": str(STEER_PORT)})
    broker: Object = {
        "name": "broker",
        "image": spec["image"],
        "imagePullPolicy": spec["imagePullPolicy"],
        "args": ["serve"],
        "env": env,
        "envFrom": [{"configMapRef": {"name": config_map_name(name)}}],
        "ports": [
            {"name": "api", "containerPort": API_PORT, "protocol": "TCP"},
            {"name": "peer", "containerPort": PEER_PORT, "protocol": "TCP"},
            {"name": "gossip", "containerPort": GOSSIP_PORT, "protocol": "UDP"},
            *(
                port
                for w in range(1, spec["workersPerPod"])
                for port in (
                    {"name": f"api-{w}", "containerPort": worker_port(API_PORT, w)},
                    {"name": f"peer-{w}", "containerPort": worker_port(PEER_PORT, w)},
                )
            ),
            *([{"name": "steer", "containerPort": STEER_PORT}] if steered else []),
        ],
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": "api"},
            "periodSeconds": 2,
            # /readyz waits up to 3 s to confirm with the metadata leader that it caught up
            "timeoutSeconds": 4,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "api"},
            "initialDelaySeconds": 10,
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        # leaderships move before the pod stops (SIGTERM hands over what is left again)
        "lifecycle": {
            "preStop": {
                "exec": {
                    "command": [
                        "laminar",
                        "node",
                        "handoff",
                        "--brokers",
                        f"http://127.0.0.1:{API_PORT}",
                    ]
                }
            }
        },
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": BROKER_UID,
            "runAsGroup": BROKER_UID,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "data", "mountPath": DATA_DIR},
            {"name": "secret", "mountPath": SECRET_DIR, "readOnly": True},
            {"name": "credentials", "mountPath": CREDENTIALS_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    resources = worker_resources(spec)
    if resources:
        broker["resources"] = resources
    pod_labels = _pod_selector(name)
    volumes: list[Object] = [
        {"name": "secret", "secret": {"secretName": secret_name(name)}},
        {  # a directory (no subPath): the kubelet refreshes it, the brokers re-read it
            "name": "credentials",
            "secret": {
                "secretName": credentials_secret_name(name),
                "items": [
                    {"key": CREDENTIALS_KEY, "path": CREDENTIALS_KEY},
                    {"key": ADMIN_TOKEN_KEY, "path": ADMIN_TOKEN_KEY},
                ],
            },
        },
        {"name": "tmp", "emptyDir": {}},
    ]
    if tls_enabled(cluster):
        _use_tls(broker, volumes, name)
    pod: Object = {
        "serviceAccountName": service_account_name(name),
        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
        "securityContext": {
            "fsGroup": BROKER_UID,
            "runAsNonRoot": True,
            "seccompProfile": dict(RUNTIME_DEFAULT_SECCOMP),
        },
        "containers": [broker],
        "volumes": volumes,
    }
    metadata = _pod_template(spec, name, pod)
    metadata["annotations"][SPEC_HASH_ANNOTATION] = spec_hash(
        cluster, initial_replicas, xdp_allowed
    )
    if xdp_wanted(cluster) and xdp_allowed:
        pod["initContainers"] = [xdp_init_container(cluster)]
        volumes.append({"name": "bpffs", "hostPath": {"path": BPF_FS, "type": "DirectoryOrCreate"}})
        # the broker reads its pod's counters (the map file is world-readable), nothing more;
        # with the bpf() system call, which seccomp's RuntimeDefault profile refuses: so its
        # container is Unconfined too (the pod is not "restricted" with XDP anyway: the
        # privileged init container is the documented exception)
        broker["env"] = [*broker["env"], {"name": "LAMINAR_XDP_PIN_DIR", "value": XDP_PIN_MOUNT}]
        unconfined = {"seccompProfile": dict(UNCONFINED)}
        broker["securityContext"] = {**broker["securityContext"], **unconfined}
        broker["volumeMounts"] = [
            *broker["volumeMounts"],
            {
                "name": "bpffs",
                "mountPath": XDP_PIN_MOUNT,
                "subPathExpr": "laminar/$(POD_NAMESPACE)_$(LAMINAR_NODE_ID)",
                "readOnly": True,
            },
        ]
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(cluster, name),
        "spec": {
            "replicas": spec["replicas"] if replicas is None else replicas,
            "serviceName": peer_service_name(name),
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "RollingUpdate"},
            "selector": {"matchLabels": pod_labels},
            "template": {"metadata": metadata, "spec": pod},
            "volumeClaimTemplates": [
                {"metadata": {"name": CLAIM_TEMPLATE, "labels": pod_labels}, "spec": claim_spec}
            ],
            "persistentVolumeClaimRetentionPolicy": {
                **RETAIN_CLAIMS,
                **(storage.get("persistentVolumeClaimRetentionPolicy") or {}),
            },
        },
    }


def claim_name(name: str, ordinal: int) -> str:
    """The PersistentVolumeClaim of the broker of `ordinal` (the StatefulSet controller's
    name for it: `<volumeClaimTemplate>-<pod>`)."""
    return f"{CLAIM_TEMPLATE}-{name}-{ordinal}"


#: A Kubernetes quantity: a decimal number, then a suffix (binary, decimal SI) or an exponent.
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([a-zA-Z]*|[eE][+-]?[0-9]+)")
_QUANTITY_SUFFIXES = {
    "": Decimal(1),
    **{s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: Decimal(1000) ** (i + 1) for i, s in enumerate(("k", "M", "G", "T", "P", "E"))},
    "m": Decimal("0.001"),
}


def quantity(text: str) -> Decimal:
    """The value of a Kubernetes quantity ("10Gi", "1.5T", "1536Mi", "5e9"): for a storage
    size, bytes. ValueError if `text` is not a quantity."""
    match = _QUANTITY.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    number, suffix = match.groups()
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number) * Decimal(10) ** int(suffix[1:])
        return Decimal(number) * _QUANTITY_SUFFIXES[suffix]
    except (KeyError, InvalidOperation):
        raise ValueError(f"not a Kubernetes quantity: {text!r}") from None


def claim_size(sts: Object) -> str | None:
    """The storage request of a StatefulSet's volumeClaimTemplate "data" (None: it has none)."""
    for template in sts.get("spec", {}).get("volumeClaimTemplates") or []:
        if (template.get("metadata") or {}).get("name") == CLAIM_TEMPLATE:
            requests = ((template.get("spec") or {}).get("resources") or {}).get("requests")
            size = (requests or {}).get("storage")
            return str(size) if size is not None else None
    return None


def default_pod_anti_affinity(name: str) -> Object:
    """The brokers of a cluster preferably on different nodes: a node lost takes one replica
    of each partition with it, not several (preferred: a cluster larger than the nodes still
    schedules)."""
    return {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 100,
                "podAffinityTerm": {
                    "labelSelector": {"matchLabels": _pod_selector(name)},
                    "topologyKey": HOSTNAME_TOPOLOGY_KEY,
                },
            }
        ]
    }


def _pod_template(spec: Object, name: str, pod: Object) -> Object:
    """spec.template.pod into the brokers' pod spec `pod` (scheduling, pull secrets), and the
    pod template's metadata: its extra labels (the selector's own labels always the
    operator's) and annotations. The affinity is spec.template.pod.affinity with the
    default pod anti-affinity (`default_pod_anti_affinity`) unless it sets podAntiAffinity
    itself ({} for none). A topology spread constraint without a labelSelector counts the
    cluster's brokers."""
    template = (spec.get("template") or {}).get("pod") or {}
    extra = template.get("metadata") or {}
    selector_labels = _pod_selector(name)
    affinity = dict(template.get("affinity") or {})
    affinity.setdefault("podAntiAffinity", default_pod_anti_affinity(name))
    pod["affinity"] = {key: value for key, value in affinity.items() if value}
    if not pod["affinity"]:
        del pod["affinity"]
    for key in ("tolerations", "nodeSelector", "priorityClassName", "imagePullSecrets"):
        if template.get(key):
            pod[key] = template[key]
    constraints = template.get("topologySpreadConstraints") or []
    if constraints:
        pod["topologySpreadConstraints"] = [
            {"labelSelector": {"matchLabels": selector_labels}, **constraint}
            for constraint in constraints
        ]
    return {
        "labels": {**(extra.get("labels") or {}), **selector_labels},
        "annotations": {
            k: v for k, v in (extra.get("annotations") or {}).items() if k != SPEC_HASH_ANNOTATION
        },
    }


def _use_tls(broker: Object, volumes: list[Object], name: str) -> None:
    """The broker container with TLS: the `<name>-tls` Secret mounted as a directory (so the
    kubelet refreshes it in place, and the broker reloads it), the LAMINAR_TLS_* variables,
    probes over HTTPS, and its preStop hook calling its own broker over HTTPS."""
    broker["env"] = [
        *broker["env"],
        {"name": "LAMINAR_TLS_CERT_FILE", "value": f"{TLS_DIR}/{TLS_CERT_KEY}"},
        {"name": "LAMINAR_TLS_KEY_FILE", "value": f"{TLS_DIR}/{TLS_KEY_KEY}"},
        {"name": "LAMINAR_TLS_CA_FILE", "value": f"{TLS_DIR}/{CA_CERT_KEY}"},
    ]
    broker["volumeMounts"] = [
        *broker["volumeMounts"],
        {"name": "tls", "mountPath": TLS_DIR, "readOnly": True},
    ]
    volumes.append({"name": "tls", "secret": {"secretName": tls_secret_name(name)}})
    for probe in ("readinessProbe", "livenessProbe"):
        broker[probe]["httpGet"]["scheme"] = "HTTPS"  # the kubelet does not verify it
    command = broker["lifecycle"]["preStop"]["exec"]["command"]
    plain = f"http://127.0.0.1:{API_PORT}"
    command[:] = [f"https://127.0.0.1:{API_PORT}" if part == plain else part for part in command]
    command += ["--ca-file", f"{TLS_DIR}/{CA_CERT_KEY}"]


def xdp_init_container(cluster: Object) -> Object:
    """Loads the XDP router onto the pod's interface before the broker starts (`laminar-xdp
    load`, same image): the one privileged container of the pod, and it exits. Its maps are
    pinned per pod under /sys/fs/bpf/laminar/ on the node; the broker container mounts that
    directory read-only and exports the counters. With spec.workersPerPod above 1 it also
    pins the steer port's eBPF program for that many workers, owned by the broker's uid,
    which the broker's supervisor attaches to its sockets (docs/workers.md). Where BPF is not
    permitted it says so in its log and lets the broker start without the router
    (--best-effort)."""
    name, _ = names(cluster)
    spec = spec_of(cluster)
    return {
        "name": "xdp-router",
        "image": spec["image"],
        "imagePullPolicy": spec["imagePullPolicy"],
        # (--steer-owner: whom the steer port's program is pinned for, with several workers)
        "command": [
            *("laminar-xdp", "load", "--iface", POD_INTERFACE, "--best-effort"),
            *("--steer-owner", str(BROKER_UID)),
        ],
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {
                "name": "POD_NAMESPACE",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
            },
            {
                "name": "LAMINAR_XDP_PIN_DIR",
                "value": f"{BPF_FS}/laminar/$(POD_NAMESPACE)_$(POD_NAME)",
            },  # the broker container mounts the same directory (its pod name is its node id)
        ],
        # the cluster id and ports, as the brokers see them
        "envFrom": [{"configMapRef": {"name": config_map_name(name)}}],
        # the one exception to Pod Security "restricted" (docs/kubernetes.md, "Pod Security")
        "securityContext": {
            "privileged": True,
            "runAsUser": 0,
            "runAsNonRoot": False,
            "seccompProfile": dict(UNCONFINED),
        },
        "volumeMounts": [{"name": "bpffs", "mountPath": BPF_FS}],
    }


def pod_disruption_budget(cluster: Object) -> Object:
    """At most one broker down by choice at a time (a partition of RF 3 keeps a majority)."""
    name, _ = names(cluster)
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(cluster, name),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": _pod_selector(name)}},
    }


def worker_port(port: int, worker: int) -> int:
    """Worker `worker`'s port of the broker's `port` (spec.workersPerPod, docs/workers.md)."""
    return port + PORT_STRIDE * worker


def worker_resources(spec: Object) -> Object:
    """spec.resources, with a CPU request of one core per worker when the spec gives none
    and runs more than one worker (each is a process meant to have a core of its own)."""
    resources: Object = dict(spec["resources"] or {})
    workers = spec["workersPerPod"]
    requests = dict(resources.get("requests") or {})
    if workers > 1 and "cpu" not in requests:
        requests["cpu"] = str(workers)
        resources["requests"] = requests
    return resources


def network_policy(cluster: Object, operator_namespace: str | None = None) -> Object:
    """Who may reach the brokers. The API port (7070; /metrics is served there too): the
    cluster's own brokers, pods of its namespace labelled CLIENT_LABEL=true, the peers
    spec.networkPolicy.clientSelectors lists, the operator's pods in `operator_namespace`
    (when known), and every pod of the namespaces spec.networkPolicy.metricsNamespaceSelector
    selects (Prometheus). The peer (TCP 7071) and gossip (UDP 7072) ports: the cluster's own
    brokers only. With spec.workersPerPod above 1, each worker's API and peer ports likewise
    (7070 and 7071 plus 3 per worker), and the steer port (7069) as the API. Egress is not
    restricted. (Traffic from the pod's own node, the kubelet's probes, is always allowed.)"""
    name, _ = names(cluster)
    spec = spec_of(cluster)
    policy = spec["networkPolicy"]
    workers = range(spec["workersPerPod"])
    brokers: Object = {"podSelector": {"matchLabels": _pod_selector(name)}}
    clients: list[Object] = [
        brokers,  # brokers ask each other's API (a node's partitions, through any broker)
        {"podSelector": {"matchLabels": {CLIENT_LABEL: "true"}}},
        *(policy.get("clientSelectors") or []),
    ]
    if operator_namespace:
        clients.append(
            {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": operator_namespace}
                },
                "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)},
            }
        )
    clients.append({"namespaceSelector": policy["metricsNamespaceSelector"]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(cluster, name),
        "spec": {
            "podSelector": {"matchLabels": _pod_selector(name)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": clients,
                    "ports": [
                        *({"protocol": "TCP", "port": worker_port(API_PORT, w)} for w in workers),
                        *([{"protocol": "TCP", "port": STEER_PORT}] if len(workers) > 1 else []),
                    ],
                },
                {
                    "from": [brokers],
                    "ports": [
                        *({"protocol": "TCP", "port": worker_port(PEER_PORT, w)} for w in workers),
                        {"protocol": "UDP", "port": GOSSIP_PORT},
                    ],
                },
            ],
        },
    }


def network_policy_enabled(cluster: Object) -> bool:
    return bool(spec_of(cluster)["networkPolicy"].get("enabled", True))


def owned(
    cluster: Object,
    *,
    initial_replicas: int,
    replicas: int | None = None,
    xdp_allowed: bool = False,
    operator_namespace: str | None = None,
) -> list[Object]:
    """Everything the operator applies for `cluster`, in order (the Secret apart: `secret`)."""
    objects = [
        service_account(cluster),
        role(cluster),
        role_binding(cluster),
        config_map(cluster, initial_replicas),
        peer_service(cluster),
        client_service(cluster),
        stateful_set(cluster, initial_replicas, replicas, xdp_allowed),
        pod_disruption_budget(cluster),
    ]
    if network_policy_enabled(cluster):
        objects.append(network_policy(cluster, operator_namespace))
    return objects
