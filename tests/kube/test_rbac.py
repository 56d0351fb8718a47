"""The operator's privileges, as the chart grants them (`helm template`, applied to the real API
server with its RBAC authorizer): what the operator's ServiceAccount may not do, cluster-wide
and with watchNamespaces; and a LaminarCluster and its Topic driven through their lifecycle
(create, scale down and up, delete) by the operator running as that ServiceAccount with the
chart's arguments, watching two namespaces, with not one 403 in its log."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from laminar.client import AsyncClient, NotFound
from laminar.local_cluster import LocalCluster

from ..integration.conftest import make_cluster
from .conftest import (
    FORBIDDEN,
    ROOT,
    KubeApi,
    OperatorIdentity,
    operator_identity,
    run_operator,
)
from .test_operator import found, trust_operator, wait_for

WATCHED = ("rbac-watched-a", "rbac-watched-b")
UNWATCHED = "rbac-unwatched"
OWNED = [
    ("statefulset", "demo"), ("service", "demo"), ("service", "demo-peers"),
    ("configmap", "demo-config"), ("secret", "demo-secret"), ("poddisruptionbudget", "demo"),
    ("networkpolicy", "demo"), ("serviceaccount", "demo-broker"), ("role", "demo-broker"),
    ("rolebinding", "demo-broker"), ("secret", "demo-ca"), ("secret", "demo-tls"),
    ("secret", "demo-credentials"),
]  # fmt: skip


@pytest.fixture(scope="module")
def cluster_wide(crds: KubeApi) -> OperatorIdentity:
    return operator_identity(crds, "laminar-operator", "laminar-system")


@pytest.fixture(scope="module")
def scoped(crds: KubeApi) -> OperatorIdentity:
    """The chart installed to watch WATCHED only (release `scoped`, in `scoped-system`)."""
    for name in (*WATCHED, UNWATCHED):
        crds.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return operator_identity(
        crds, "scoped", "scoped-system", "--set", f"watchNamespaces={{{','.join(WATCHED)}}}"
    )


def test_cluster_wide_the_operator_reads_no_secret_and_deletes_almost_nothing_it_owns(
    crds: KubeApi, cluster_wide: OperatorIdentity
) -> None:
    can = cluster_wide.can
    assert can(crds, "create", "statefulsets", "-n", "default")
    assert can(crds, "patch", "laminarclusters.laminarmq.io", "--subresource=status", "-n", "x")
    assert not can(crds, "get", "topics.laminarmq.io", "-n", "default")  # only lists them
    assert can(crds, "create", "secrets", "-n", "default")  # the HMAC key, made once
    assert can(crds, "patch", "secrets", "-n", "default")  # the TLS Secrets, renewed in place
    for verb in ("get", "list", "watch", "update", "delete"):
        assert not can(crds, verb, "secrets", "-n", "kube-system"), verb
        assert not can(crds, verb, "secrets", "--all-namespaces"), verb
    # the clusters' CA keys: read back by name in the operator's own namespace, nowhere else
    for verb in ("get", "create", "patch", "delete"):
        assert can(crds, verb, "secrets", "-n", "laminar-system"), verb
    for verb in ("list", "watch"):
        assert not can(crds, verb, "secrets", "-n", "laminar-system"), verb
    for what in ("services", "configmaps", "roles", "rolebindings", "secrets"):
        assert not can(crds, "delete", what, "-n", "default"), what  # the GC collects them
    # the StatefulSet made again with grown volumes; the claims grown, by name, nothing more
    assert can(crds, "delete", "statefulsets", "-n", "default")
    for verb in ("get", "patch"):
        assert can(crds, verb, "persistentvolumeclaims", "-n", "default"), verb
    for verb in ("list", "watch", "create", "update", "delete"):
        assert not can(crds, verb, "persistentvolumeclaims", "-n", "default"), verb
    assert not can(crds, "get", "storageclasses")  # the API server refuses what a class cannot
    assert not can(crds, "create", "pods", "-n", "default")
    assert not can(crds, "escalate", "roles", "-n", "default")
    assert not can(crds, "bind", "roles", "-n", "default")
    assert not can(crds, "list", "namespaces")  # kopf's scanning is off: nothing cluster-scoped
    assert not can(crds, "list", "customresourcedefinitions")
    assert not can(crds, "create", "clusterrolebindings")


def test_scoped_the_operator_may_act_in_its_namespaces_only(
    crds: KubeApi, scoped: OperatorIdentity
) -> None:
    assert {d["kind"] for d in scoped.objects} == {"ServiceAccount", "Role", "RoleBinding"}
    roles = sorted(d["metadata"]["namespace"] for d in scoped.objects if d["kind"] == "Role")
    assert roles == sorted([*WATCHED, "scoped-system"])  # the last: the CA keys
    assert "--all-namespaces" not in scoped.args
    can = scoped.can
    for namespace in WATCHED:
        assert can(crds, "create", "statefulsets", "-n", namespace)
        assert can(crds, "watch", "laminarclusters.laminarmq.io", "-n", namespace)
        assert not can(crds, "get", "secrets", "-n", namespace)
    # its own namespace: the clusters' CA keys (and nothing else of the operator's rights)
    assert can(crds, "get", "secrets", "-n", "scoped-system")
    assert can(crds, "patch", "secrets", "-n", "scoped-system")  # a CA's rotation
    assert not can(crds, "create", "statefulsets", "-n", "scoped-system")
    for namespace in (UNWATCHED, "default", "kube-system"):
        assert not can(crds, "get", "secrets", "-n", namespace), namespace
        assert not can(crds, "create", "statefulsets", "-n", namespace), namespace
        assert not can(crds, "create", "roles", "-n", namespace), namespace
        assert not can(crds, "list", "laminarclusters.laminarmq.io", "-n", namespace), namespace
    assert not can(crds, "list", "laminarclusters.laminarmq.io", "--all-namespaces")
    assert not can(crds, "create", "statefulsets", "--all-namespaces")
    assert not can(crds, "list", "namespaces")
    assert not can(crds, "get", "customresourcedefinitions")


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = make_cluster(tmp_path_factory.mktemp("rbac-brokers"))
    yield cluster
    cluster.stop()


def _admin(brokers: LocalCluster, call: Any) -> Any:
    async def run() -> Any:
        async with AsyncClient(brokers.urls, token=brokers.token) as client:
            return await call(client)

    return asyncio.run(run())


def test_scoped_operator_runs_a_cluster_and_a_topic_through_their_lifecycle(
    crds: KubeApi, scoped: OperatorIdentity, brokers: LocalCluster
) -> None:
    namespace = WATCHED[1]
    cluster = yaml.safe_load((ROOT / "examples" / "cluster.yaml").read_text())
    cluster["metadata"]["namespace"] = namespace
    cluster["metadata"]["annotations"] = {
        "laminarmq.io/brokers": ",".join(brokers.urls),
        "laminarmq.io/node-ids": ",".join(brokers.nodes),
    }
    cluster["spec"]["config"]["replicationFactor"] = 2  # so that it may scale down to 2
    cluster["spec"]["xdp"] = {"enabled": True}  # not allowed: a Warning event, posted
    ignored = {**cluster, "metadata": {"name": "demo", "namespace": UNWATCHED}}
    topic = yaml.safe_load((ROOT / "examples" / "topic.yaml").read_text())
    topic["metadata"] = {"name": "rbac-orders", "namespace": namespace}
    topic["spec"].update(partitions=3, replicationFactor=2)

    def sts_replicas() -> int | None:
        sts = found(crds, "statefulset/demo", namespace)
        return int(sts["spec"]["replicas"]) if sts else None

    def describe() -> Any:
        async def ask(client: AsyncClient) -> Any:
            try:
                return await client.describe_topic("rbac-orders")
            except NotFound:
                return None

        return _admin(brokers, ask)

    def hosted(node: str) -> int:
        async def ask(client: AsyncClient) -> int:
            return len((await client.node_partitions(node)).partitions)

        return int(_admin(brokers, ask))

    with run_operator(scoped, strict=True) as runner:
        crds.apply(ignored)
        crds.apply(cluster)
        trust_operator(crds, namespace, brokers)  # what its broker pods would mount
        uid = crds.get("laminarcluster/demo", "-n", namespace)["metadata"]["uid"]
        wait_for("the StatefulSet of 3", lambda: sts_replicas() == 3)
        for kind, name in OWNED:
            obj = wait_for(f"{kind}/{name}", lambda k=kind, n=name: found(crds, f"{k}/{n}",
                                                                        namespace))  # fmt: skip
            assert obj["metadata"]["ownerReferences"][0]["uid"] == uid, (kind, name)
        pod = found(crds, "statefulset/demo", namespace)["spec"]["template"]["spec"]
        assert "initContainers" not in pod
        # TLS: the brokers' certificate mounted, signed by the cluster's CA, whose key is kept
        # in the operator's namespace only
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["tls"]["secret"]["secretName"] == "demo-tls"
        ca_key = found(crds, f"secret/laminar-ca-{uid}", "scoped-system")
        assert ca_key is not None and "ca.key" in ca_key["data"]
        assert set(found(crds, "secret/demo-ca", namespace)["data"]) == {"ca.crt"}
        assert found(crds, "secret/demo-tls", namespace)["type"] == "kubernetes.io/tls"

        def xdp_refused() -> list[Any]:
            events = crds.get("events", "-n", namespace)["items"]
            return [e for e in events if e.get("reason") == "XdpNotAllowed"]

        wait_for("the XdpNotAllowed event", xdp_refused)
        policy = found(crds, "networkpolicy/demo", namespace)
        assert {  # the operator's namespace is the release's
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "scoped-system"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "laminar-operator"}},
        } in policy["spec"]["ingress"][0]["from"]

        crds.apply(topic)
        created = wait_for("the topic on the brokers", describe)
        assert created.partitions == 3 and created.replication_factor == 2

        def ready() -> bool:
            status = crds.get("topic.laminarmq.io/rbac-orders", "-n", namespace).get("status")
            conditions = (status or {}).get("conditions") or []
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        wait_for("the Topic Ready", ready)

        # scale down: the last broker drained through the admin API, then the StatefulSet shrunk
        leaving = list(brokers.nodes)[-1]
        crds.kubectl("scale", "laminarcluster/demo", "--replicas=2", "-n", namespace)
        wait_for("the StatefulSet shrunk to 2", lambda: sts_replicas() == 2, timeout_s=120)
        assert hosted(leaving) == 0
        # and up again: the drained broker back in placement
        crds.kubectl("scale", "laminarcluster/demo", "--replicas=3", "-n", namespace)
        wait_for("the StatefulSet back at 3", lambda: sts_replicas() == 3)

        def undrained() -> bool:
            async def ask(client: AsyncClient) -> bool:
                members = (await client.cluster()).members
                return not any(m.draining for m in members if m.id == leaving)

            return bool(_admin(brokers, ask))

        wait_for(f"{leaving} undrained", undrained)

        crds.kubectl("delete", "topic.laminarmq.io/rbac-orders", "-n", namespace,
                     "--timeout=60s")  # fmt: skip
        wait_for("the topic deleted from the brokers", lambda: describe() is None)
        crds.kubectl("delete", "laminarcluster/demo", "-n", namespace, "--timeout=60s")
        wait_for(
            "everything the cluster owned collected",
            lambda: not any(found(crds, f"{k}/{n}", namespace) for k, n in OWNED),
            timeout_s=120,
        )
        wait_for(
            "the operator's token deleted with its cluster",
            lambda: found(crds, f"secret/laminar-token-{uid}", "scoped-system") is None,
        )
        wait_for(
            "the CA key deleted with its cluster",
            lambda: found(crds, f"secret/laminar-ca-{uid}", "scoped-system") is None,
        )
        # a cluster outside the watched namespaces is not the operator's
        assert found(crds, "statefulset/demo", UNWATCHED) is None
        assert not (crds.get("laminarcluster/demo", "-n", UNWATCHED).get("status"))
    assert "rbac-watched-b/demo" in runner.output  # (it did log its work: the check saw it)


def test_a_refusal_is_told_from_a_log_lines_milliseconds() -> None:
    """(No API server: the pattern `run_operator` checks an operator's log with.)"""
    refusals = [
        "kopf.objects [ERROR ] APIForbiddenError: ('namespaces \"x\" is forbidden', {})",
        "aiohttp.client_exceptions.ClientResponseError: 403, message='Forbidden'",
        '{"kind":"Status","code":403}',
    ]
    others = [
        "[2026-12-05 04:23:48,403] kopf._core.engines.a [INFO    ] Initial authentication",
        "2026-12-05 04:23:48.403 laminar INFO ready",
        "partition 1403 of 4030",
    ]
    assert [bool(FORBIDDEN.search(line)) for line in refusals + others] == [True] * 3 + [False] * 3
