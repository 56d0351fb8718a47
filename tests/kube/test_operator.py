"""The operator (kopf, in a thread: KopfRunner) against the real API server, as the chart's
ServiceAccount with only the rights the chart grants it (rendered by `helm template`: the
cluster-wide ClusterRole here; tests/kube/test_rbac.py has the namespaced mode and what the
operator may not do)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from laminar import certs
from laminar.client import AsyncClient, NotFound, Unauthorized
from laminar.client import Client as SyncClient
from laminar.client.models import TopicDescription
from laminar.credentials import dump, parse, replace_file, token_hash
from laminar.local_cluster import LocalCluster
from laminar.log.batch import Record
from laminar_operator.ca_rotation import CaState, split_bundle

from ..integration.conftest import loopback_prefix, make_cluster
from .conftest import ROOT, KubeApi, OperatorIdentity, operator_identity, run_operator

WAIT_S = 60.0


def wait_for(what: str, probe: Callable[[], Any], timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.3)
    raise AssertionError(f"{what}: not within {timeout_s} s (last: {last!r})")


@pytest.fixture(scope="module")
def identity(crds: KubeApi) -> OperatorIdentity:
    """The chart's operator ServiceAccount and ClusterRole (watchNamespaces empty, defaults)."""
    return operator_identity(crds, "laminar-operator", "laminar-system")


@pytest.fixture()
def operator(identity: OperatorIdentity) -> Iterator[Any]:
    with run_operator(identity) as runner:
        yield runner


def found(kube: KubeApi, what: str, namespace: str) -> Any:
    answer = kube.kubectl("get", what, "-n", namespace, "-o", "json", check=False)
    return json.loads(answer.stdout) if answer.returncode == 0 else None


def condition(kube: KubeApi, what: str, namespace: str, kind: str) -> dict[str, Any] | None:
    status = kube.get(what, "-n", namespace).get("status") or {}
    return next((c for c in status.get("conditions", []) if c["type"] == kind), None)


def test_a_cluster_gets_its_objects_and_status(
    crds: KubeApi, namespace: str, operator: Any
) -> None:
    crds.kubectl("apply", "-n", namespace, "-f", str(ROOT / "examples" / "cluster.yaml"))
    cluster = crds.get("laminarcluster/demo", "-n", namespace)
    uid = cluster["metadata"]["uid"]

    def sts() -> Any:
        found = crds.kubectl("get", "statefulset/demo", "-n", namespace, "-o", "json", check=False)
        return yaml.safe_load(found.stdout) if found.returncode == 0 else None

    first = wait_for("the StatefulSet", sts)
    assert first["metadata"]["ownerReferences"][0]["uid"] == uid
    assert first["spec"]["replicas"] == 3
    for kind, name in [
        ("service", "demo"), ("service", "demo-peers"), ("configmap", "demo-config"),
        ("secret", "demo-secret"), ("poddisruptionbudget", "demo"), ("networkpolicy", "demo"),
        ("serviceaccount", "demo-broker"), ("role", "demo-broker"), ("rolebinding", "demo-broker"),
    ]:  # fmt: skip
        owned = crds.get(f"{kind}/{name}", "-n", namespace)
        assert owned["metadata"]["ownerReferences"][0]["uid"] == uid, (kind, name)
    key = crds.get("secret/demo-secret", "-n", namespace)["data"]["hmac"]
    assert len(base64.b64decode(key)) == 32
    # the client credentials: the brokers' file (hashes) and the admin and client tokens; the
    # operator's own token only in its namespace, its hash in the file
    credentials = crds.get("secret/demo-credentials", "-n", namespace)
    assert credentials["metadata"]["ownerReferences"][0]["uid"] == uid
    data = {k: base64.b64decode(v).decode() for k, v in credentials["data"].items()}
    assert set(data) == {"credentials.yaml", "admin-token", "client-token"}
    principals = {p.name: p for p in parse(data["credentials.yaml"])}
    assert principals["admin"].hashes == (token_hash(data["admin-token"].strip()),)
    assert principals["client"].hashes == (token_hash(data["client-token"].strip()),)
    kept = crds.get(f"secret/laminar-token-{uid}", "-n", "laminar-system")["data"]["token"]
    operator_token = base64.b64decode(kept).decode()
    assert principals["laminar-operator"].hashes == (token_hash(operator_token),)
    assert operator_token not in json.dumps(credentials)

    status = wait_for(
        "the status",
        lambda: (
            (s := crds.get("laminarcluster/demo", "-n", namespace).get("status", {})).get(
                "selector"
            )
            and s.get("phase")
            and s
        ),
    )
    assert status["phase"] == "Pending"  # no kubelet here: no pod ever gets ready
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "BrokersNotReady"

    # kubectl scale goes through the scale subresource to the StatefulSet
    crds.kubectl("scale", "laminarcluster/demo", "--replicas=5", "-n", namespace)
    wait_for("5 replicas", lambda: (s := sts()) and s["spec"]["replicas"] == 5)
    # a spec change rolls the pods (a new spec hash); the key and the initial nodes stay
    hash_key = "laminarmq.io/spec-hash"
    before = sts()["spec"]["template"]["metadata"]["annotations"][hash_key]
    crds.kubectl(
        "patch", "laminarcluster/demo", "-n", namespace, "--type=merge",
        "-p", '{"spec": {"image": "laminar-broker:2"}}',
    )  # fmt: skip
    rolled = wait_for(
        "the new image",
        lambda: (
            (s := sts())
            and s["spec"]["template"]["spec"]["containers"][0]["image"] == "laminar-broker:2"
            and s
        ),
    )
    assert rolled["spec"]["template"]["metadata"]["annotations"][hash_key] != before
    assert crds.get("secret/demo-secret", "-n", namespace)["data"]["hmac"] == key
    again = crds.get("secret/demo-credentials", "-n", namespace)  # made once, left alone
    assert again["data"] == credentials["data"]
    assert again["metadata"]["resourceVersion"] == credentials["metadata"]["resourceVersion"]
    nodes = crds.get("configmap/demo-config", "-n", namespace)["data"]["LAMINAR_INITIAL_NODES"]
    assert nodes == "demo-0,demo-1,demo-2"


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A real 3-broker Laminar cluster on loopback (the LaminarCluster object points at it)."""
    cluster = make_cluster(tmp_path_factory.mktemp("brokers"))
    yield cluster
    cluster.stop()


def describe(brokers: LocalCluster, topic: str) -> TopicDescription | None:
    async def run() -> TopicDescription | None:
        async with AsyncClient(
            brokers.urls, token=brokers.token, ca_file=brokers.ca_file
        ) as client:
            try:
                return await client.describe_topic(topic)
            except NotFound:
                return None

    return asyncio.run(run())


def trust_operator(kube: KubeApi, namespace: str, brokers: LocalCluster, name: str = "demo") -> str:
    """Give local `brokers` what a broker pod of LaminarCluster `name` mounts: the credentials
    file of the Secret `<name>-credentials` the operator made (with its own token's hash), next
    to the local cluster's admin; the brokers re-read it (SIGHUP). The Secret's admin token,
    which then works."""
    secret = wait_for(
        f"secret/{name}-credentials", lambda: found(kube, f"secret/{name}-credentials", namespace)
    )
    data = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
    made = yaml.safe_load(data["credentials.yaml"])["principals"]
    path = brokers.credentials_path()
    local = [p for p in yaml.safe_load(path.read_text())["principals"]
             if token_hash(brokers.token) in p["tokens"]]  # fmt: skip
    replace_file(path, dump([*({**p, "name": "local-admin"} for p in local), *made]))
    for node in brokers.nodes.values():
        if node.pid is not None and node.alive():
            os.kill(node.pid, signal.SIGHUP)
    admin = data["admin-token"].strip()

    async def works() -> bool:
        async with AsyncClient(
            brokers.urls, token=admin, ca_file=brokers.ca_file, timeout_s=5
        ) as client:
            try:
                await client.topics()
            except Unauthorized:
                return False
            return True

    wait_for("the brokers admitting the Secret's tokens", lambda: asyncio.run(works()))
    return admin


def local_cluster_object(namespace: str, urls: list[str]) -> dict[str, Any]:
    cluster = yaml.safe_load((ROOT / "examples" / "cluster.yaml").read_text())
    cluster["metadata"]["namespace"] = namespace
    cluster["metadata"]["annotations"] = {"laminarmq.io/brokers": ",".join(urls)}
    return cluster


def test_topics_follow_their_objects(
    crds: KubeApi, namespace: str, operator: Any, brokers: LocalCluster
) -> None:
    crds.apply(local_cluster_object(namespace, brokers.urls))
    trust_operator(crds, namespace, brokers)  # as its pods would mount it
    topic = yaml.safe_load((ROOT / "examples" / "topic.yaml").read_text())
    topic["metadata"] = {"name": f"orders-{namespace}", "namespace": namespace}
    name = topic["metadata"]["name"]
    crds.apply(topic)

    created = wait_for("the topic on the brokers", lambda: describe(brokers, name))
    assert created.partitions == 4 and created.replication_factor == 3
    assert created.config["max_deliveries"] == 10
    assert created.config["retention_ms"] == 604_800_000

    def status() -> dict[str, Any]:
        found: dict[str, Any] = crds.get(f"topic.laminarmq.io/{name}", "-n", namespace)
        return found.get("status") or {}

    def led() -> dict[str, Any] | None:
        s = status()
        parts = s.get("partitions") or []
        return s if len(parts) == 4 and all(p["leader"] for p in parts) else None

    shown = wait_for("leaders in status", led)
    assert [p["partition"] for p in shown["partitions"]] == [0, 1, 2, 3]
    actual = describe(brokers, name)
    assert actual is not None
    for entry, state in zip(shown["partitions"], actual.partition_states, strict=True):
        assert sorted(entry["replicas"]) == sorted(state.replicas)
        assert entry["leader"] in state.replicas
    ready = next(c for c in shown["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"

    # kill -9 the leader of partition 0: status follows the new leader within seconds
    killed = shown["partitions"][0]["leader"]
    brokers.kill(killed)
    try:
        moved = wait_for(
            "a new leader in status",
            lambda: (p := status()["partitions"][0])["leader"] not in ("", killed) and p,
        )
        assert moved["leader"] in actual.partition_states[0].replicas
    finally:
        brokers.start_node(killed)
        brokers.wait_ready()

    grown = {**topic, "spec": {**topic["spec"], "partitions": 6}}
    crds.apply(grown)
    wait_for("6 partitions", lambda: (d := describe(brokers, name)) and d.partitions == 6)

    crds.kubectl("delete", f"topic.laminarmq.io/{name}", "-n", namespace, "--timeout=60s")
    wait_for("the topic deleted", lambda: describe(brokers, name) is None)


def test_unreachable_brokers_are_explained_and_do_not_hold_deletion_of_a_gone_cluster(
    crds: KubeApi, namespace: str, operator: Any
) -> None:
    dead = f"http://{loopback_prefix()}.1:9"  # nothing listens there
    crds.apply(local_cluster_object(namespace, [dead]))
    topic = yaml.safe_load((ROOT / "examples" / "topic.yaml").read_text())
    topic["metadata"]["namespace"] = namespace
    crds.apply(topic)

    def condition() -> dict[str, Any] | None:
        status = crds.get("topic.laminarmq.io/orders", "-n", namespace).get("status") or {}
        return next((c for c in status.get("conditions", []) if c["type"] == "Ready"), None)

    shown = wait_for("the Ready condition", condition)
    assert shown["status"] == "False" and shown["reason"] == "BrokersUnreachable", shown
    crds.kubectl("delete", "laminarcluster/demo", "-n", namespace)
    crds.kubectl("delete", "topic.laminarmq.io/orders", "-n", namespace, "--wait=false")
    wait_for(
        "the Topic gone (its finalizer let go)",
        lambda: (
            crds.kubectl(
                "get", "topic.laminarmq.io/orders", "-n", namespace, check=False
            ).returncode
            != 0
        ),
        timeout_s=180,
    )


def test_scale_down_drains_before_shrinking_and_keeps_replication(
    crds: KubeApi,
    namespace: str,
    operator: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    four = make_cluster(tmp_path_factory.mktemp("four"), 4)
    try:
        cluster = local_cluster_object(namespace, four.urls)
        cluster["spec"]["replicas"] = 4
        cluster["spec"]["config"]["replicationFactor"] = 2  # the schema allows 2 replicas then
        cluster["metadata"]["annotations"]["laminarmq.io/node-ids"] = ",".join(four.nodes)
        crds.apply(cluster)
        trust_operator(crds, namespace, four)

        def sts_replicas() -> int | None:
            found = crds.kubectl(
                "get", "statefulset/demo", "-n", namespace, "-o", "json", check=False
            )
            return (
                int(yaml.safe_load(found.stdout)["spec"]["replicas"])
                if found.returncode == 0
                else None
            )

        wait_for("4 replicas", lambda: sts_replicas() == 4)

        async def topic() -> None:
            async with AsyncClient(four.urls, token=four.token) as client:
                await client.create_topic("events", partitions=4, replication_factor=3)
                await client.wait_for_leaders("events")

        asyncio.run(topic())
        last = list(four.nodes)[-1]

        def hosted(node: str) -> int:
            async def ask() -> int:
                async with AsyncClient(four.urls, token=four.token) as client:
                    return len((await client.node_partitions(node)).partitions)

            return asyncio.run(ask())

        assert hosted(last) > 0
        crds.kubectl("scale", "laminarcluster/demo", "--replicas=3", "-n", namespace)
        seen: list[tuple[int | None, int]] = []

        def shrunk() -> bool:
            seen.append((sts_replicas(), hosted(last)))
            return seen[-1][0] == 3

        wait_for("the StatefulSet shrunk to 3", shrunk, timeout_s=120)
        assert seen[-1] == (3, 0), seen  # shrunk only once the leaving broker hosted nothing
        assert any(r == 4 and n > 0 for r, n in seen), seen  # it waited for the drain

        # 2 brokers cannot hold the topic of replication factor 3: refused, 3 kept
        crds.kubectl("scale", "laminarcluster/demo", "--replicas=2", "-n", namespace)

        def refused() -> dict[str, Any] | None:
            status = crds.get("laminarcluster/demo", "-n", namespace).get("status") or {}
            found = next(
                (c for c in status.get("conditions", []) if c["type"] == "ScaleDown"), None
            )
            return found if found and found["reason"] == "WouldUnderReplicate" else None

        condition = wait_for("the refusal", refused)
        assert "replication factor 3" in condition["message"]
        assert sts_replicas() == 3

        # scaling up again brings the drained broker back into placement
        crds.kubectl("scale", "laminarcluster/demo", "--replicas=4", "-n", namespace)

        def draining() -> bool:
            async def ask() -> bool:
                async with AsyncClient(four.urls, token=four.token) as client:
                    return any(m.draining for m in (await client.cluster()).members if
                               m.id == last)  # fmt: skip

            return asyncio.run(ask())

        wait_for("4 replicas again", lambda: sts_replicas() == 4)
        wait_for(f"{last} undrained", lambda: not draining())
    finally:
        four.stop()


def test_rebalancing_and_degraded_follow_what_the_brokers_report(
    crds: KubeApi, namespace: str, operator: Any
) -> None:
    """The operator derives phase and the Rebalancing / Degraded conditions from the status the
    brokers report (test_broker_status has real brokers report it); here the report is
    patched in as the broker's ServiceAccount would."""
    crds.apply(local_cluster_object(namespace, [f"http://{loopback_prefix()}.1:9"]))

    def report(moving: int, under: int, members: list[str] | None = None) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body: dict[str, Any] = {
            "reportedAt": stamp,
            "rebalancingPartitions": moving,
            "underReplicated": under,
        }
        if members is not None:
            body["members"] = [
                {"name": n, "state": "alive", "weight": 1, "leaders": 0, "replicas": 0}
                for n in members
            ]
        crds.kubectl(
            "patch", "laminarcluster/demo", "-n", namespace, "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": body}),
        )  # fmt: skip

    def shown(kind: str, state: str) -> dict[str, Any] | None:
        status = crds.get("laminarcluster/demo", "-n", namespace).get("status") or {}
        found = next((c for c in status.get("conditions", []) if c["type"] == kind), None)
        return {**status, "condition": found} if found and found["status"] == state else None

    unknown = wait_for("no report yet: Unknown", lambda: shown("Rebalancing", "Unknown"))
    assert unknown["condition"]["reason"] == "NoRecentReport"
    report(moving=3, under=1)
    moving = wait_for("Rebalancing", lambda: shown("Rebalancing", "True"))
    assert moving["phase"] == "Rebalancing"
    assert moving["condition"]["message"].startswith("3 partitions moving")
    degraded = wait_for("Degraded", lambda: shown("Degraded", "True"))
    assert degraded["condition"]["reason"] == "UnderReplicated"
    report(moving=0, under=0, members=["demo-0", "demo-1"])
    joining = wait_for("a broker joining", lambda: (s := shown("Rebalancing", "True")) and
                       s["condition"]["reason"] == "BrokersJoining" and s)  # fmt: skip
    assert joining["condition"]["message"] == "waiting for demo-2 to join the cluster"
    report(moving=0, under=0, members=["demo-0", "demo-1", "demo-2"])
    converged = wait_for("converged", lambda: shown("Rebalancing", "False"))
    assert converged["condition"]["reason"] == "Converged"
    assert converged["phase"] == "Pending"  # no kubelet here: no broker pod gets ready
    assert wait_for("not degraded", lambda: shown("Degraded", "False"))


def test_xdp_runs_only_where_the_chart_allows_it(crds: KubeApi, namespace: str) -> None:
    """spec.xdp.enabled asks for a privileged init container: with the chart's default
    (xdp.allowed false) the cluster gets none, and says why; once an administrator sets
    xdp.allowed=true, the restarted operator adds it."""
    cluster = yaml.safe_load((ROOT / "examples" / "cluster.yaml").read_text())
    cluster["metadata"]["namespace"] = namespace
    cluster["spec"]["xdp"] = {"enabled": True}

    def pod_spec() -> Any:
        sts = found(crds, "statefulset/demo", namespace)
        return sts and sts["spec"]["template"]["spec"]

    refused = operator_identity(crds, "laminar-operator", "laminar-system")
    assert refused.env["LAMINAR_XDP_ALLOWED"] == "false"  # the chart's default
    with run_operator(refused):
        crds.apply(cluster)
        shown = wait_for(
            "XdpAllowed False",
            lambda: condition(crds, "laminarcluster/demo", namespace, "XdpAllowed"),
        )
        assert shown["status"] == "False" and shown["reason"] == "XdpNotAllowed", shown
        assert "xdp.allowed" in shown["message"]
        pod = wait_for("the StatefulSet", pod_spec)
        assert "initContainers" not in pod
        assert all("hostPath" not in v for v in pod["volumes"])

        def warned() -> list[Any]:
            events = crds.get("events", "-n", namespace)["items"]
            return [e for e in events if e.get("reason") == "XdpNotAllowed"]

        (event, *_) = wait_for("the Warning event", warned)
        assert event["type"] == "Warning" and "xdp.allowed" in event["message"]

    allowed = operator_identity(
        crds, "laminar-operator", "laminar-system", "--set", "xdp.allowed=true"
    )
    assert allowed.env["LAMINAR_XDP_ALLOWED"] == "true"
    with run_operator(allowed):  # resumes the cluster: the router goes in
        pod = wait_for("the XDP init container", lambda: (p := pod_spec()) and
                       p.get("initContainers") and p)  # fmt: skip
        (init,) = pod["initContainers"]
        assert init["name"] == "xdp-router" and init["securityContext"]["privileged"] is True
        shown = wait_for(
            "XdpAllowed True",
            lambda: (
                (c := condition(crds, "laminarcluster/demo", namespace, "XdpAllowed"))
                and c["status"] == "True"
                and c
            ),
        )
        assert shown["reason"] == "XdpAllowed"


def test_the_network_policy_is_owned_and_follows_the_spec(
    crds: KubeApi, namespace: str, operator: Any
) -> None:
    cluster = yaml.safe_load((ROOT / "examples" / "cluster.yaml").read_text())
    cluster["metadata"]["namespace"] = namespace
    cluster["spec"]["networkPolicy"] = {
        "clientSelectors": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}}
        ]
    }
    crds.apply(cluster)
    uid = crds.get("laminarcluster/demo", "-n", namespace)["metadata"]["uid"]

    def policy() -> Any:
        return found(crds, "networkpolicy/demo", namespace)

    shipped = wait_for("the NetworkPolicy", policy)
    assert shipped["metadata"]["ownerReferences"][0]["uid"] == uid
    sts = wait_for("the StatefulSet", lambda: found(crds, "statefulset/demo", namespace))
    pods = sts["spec"]["selector"]
    spec = shipped["spec"]
    assert spec["podSelector"] == pods and spec["policyTypes"] == ["Ingress"]
    api, internal = spec["ingress"]
    assert api["ports"] == [{"protocol": "TCP", "port": 7070}]
    assert {"podSelector": {"matchLabels": {"laminarmq.io/client": "true"}}} in api["from"]
    assert {  # the operator, in the namespace the chart runs it in
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "laminar-system"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "laminar-operator"}},
    } in api["from"]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}} in (
        api["from"]
    )
    assert {"namespaceSelector": {"matchLabels": {"laminarmq.io/metrics": "true"}}} in (
        api["from"]
    )  # the default metricsNamespaceSelector
    assert internal["from"] == [{"podSelector": pods}]
    assert sorted(p["port"] for p in internal["ports"]) == [7071, 7072]

    before = sts["spec"]["template"]["metadata"]["annotations"]
    crds.kubectl(
        "patch", "laminarcluster/demo", "-n", namespace, "--type=merge",
        "-p", '{"spec": {"networkPolicy": {"enabled": false}}}',
    )  # fmt: skip
    wait_for("the NetworkPolicy deleted", lambda: not policy())
    crds.kubectl(
        "patch", "laminarcluster/demo", "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"networkPolicy": {"enabled": True, "metricsNamespaceSelector": {
            "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}}}),
    )  # fmt: skip
    again = wait_for("the NetworkPolicy back", policy)
    admitted = again["spec"]["ingress"][0]["from"]
    assert {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    } in admitted
    assert "laminarmq.io/metrics" not in json.dumps(admitted)
    # none of it rolled the brokers
    after = found(crds, "statefulset/demo", namespace)["spec"]["template"]["metadata"]
    assert after["annotations"] == before

    crds.kubectl("delete", "laminarcluster/demo", "-n", namespace)
    wait_for("the NetworkPolicy collected", lambda: not policy(), timeout_s=120)


def test_tls_a_ca_per_cluster_a_certificate_renewed_in_place_and_admin_calls_verified(
    crds: KubeApi, namespace: str, identity: OperatorIdentity, tmp_path: Path
) -> None:
    """spec.tls.enabled (the default): the cluster's CA made once (its key in the operator's
    namespace only), the brokers' certificate mounted and renewed in place once a third of
    its (here one minute) lifetime is left, without rolling the pods; the probes and the
    preStop hook over HTTPS; and the operator's calls to the brokers verified with the CA
    (brokers of another CA are refused)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from laminar.certs import KeyPair, names_of

    cluster = yaml.safe_load((ROOT / "examples" / "cluster.yaml").read_text())
    cluster["metadata"]["namespace"] = namespace
    with run_operator(identity, LAMINAR_CERT_LIFETIME_S="60"):
        crds.apply(cluster)
        uid = crds.get("laminarcluster/demo", "-n", namespace)["metadata"]["uid"]
        sts = wait_for("the StatefulSet", lambda: found(crds, "statefulset/demo", namespace))
        (broker,) = sts["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in broker["env"]}
        assert env["LAMINAR_TLS_CERT_FILE"] == "/etc/laminar/tls/tls.crt"
        assert env["LAMINAR_TLS_CA_FILE"] == "/etc/laminar/tls/ca.crt"
        assert broker["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
        assert broker["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
        hook = broker["lifecycle"]["preStop"]["exec"]["command"]
        assert "https://127.0.0.1:7070" in hook and "/etc/laminar/tls/ca.crt" in hook

        ca_key = found(crds, f"secret/laminar-ca-{uid}", "laminar-system")
        assert ca_key is not None  # in the operator's namespace, not the cluster's
        ca = KeyPair(*(base64.b64decode(ca_key["data"][k]) for k in ("ca.crt", "ca.key")))
        public = crds.get("secret/demo-ca", "-n", namespace)["data"]
        assert set(public) == {"ca.crt"} and base64.b64decode(public["ca.crt"]) == ca.cert_pem

        def certificate() -> x509.Certificate:
            data = crds.get("secret/demo-tls", "-n", namespace)["data"]
            assert base64.b64decode(data["ca.crt"]) == ca.cert_pem
            return x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"]))

        first = certificate()
        assert first.issuer == ca.certificate.subject
        names = names_of(first.public_bytes(serialization.Encoding.PEM))
        for name in ("demo", f"demo.{namespace}.svc", f"demo.{namespace}.svc.cluster.local",
                     f"*.demo-peers.{namespace}.svc", "127.0.0.1"):  # fmt: skip
            assert name in names, names
        status = wait_for(
            "status.tls",
            lambda: crds.get("laminarcluster/demo", "-n", namespace).get("status", {}).get("tls"),
        )
        assert int(status["serial"], 16) == first.serial_number
        generation = sts["metadata"]["generation"]
        renewed = wait_for(
            "the certificate renewed",
            lambda: (c := certificate()).serial_number != first.serial_number and c,
            timeout_s=120,
        )
        assert renewed.issuer == ca.certificate.subject
        assert found(crds, "statefulset/demo", namespace)["metadata"]["generation"] == generation

        # The operator's calls verify the brokers with the cluster's CA: brokers whose
        # certificates it signed are used; brokers of another CA are not.
        data_dir = tmp_path / "brokers"
        (data_dir / "tls").mkdir(parents=True)
        (data_dir / "tls" / "ca.crt").write_bytes(ca.cert_pem)
        (data_dir / "tls" / "ca.key").write_bytes(ca.key_pem)
        trusted = make_cluster(data_dir, 1, tls=True)
        trust_operator(crds, namespace, trusted)  # (its pods' credentials)
        stranger = make_cluster(tmp_path / "stranger", 1, tls=True)
        try:
            for topic, brokers in (("tls-trusted", trusted), ("tls-stranger", stranger)):
                crds.kubectl(
                    "annotate", "laminarcluster/demo", "-n", namespace, "--overwrite",
                    f"laminarmq.io/brokers={','.join(brokers.urls)}",
                    f"laminarmq.io/node-ids={','.join(brokers.nodes)}",
                )  # fmt: skip
                if brokers is trusted:  # as its pods would mount them
                    trust_operator(crds, namespace, trusted)
                crds.apply({
                    "apiVersion": "laminarmq.io/v1alpha1", "kind": "Topic",
                    "metadata": {"name": topic, "namespace": namespace},
                    "spec": {"cluster": "demo", "partitions": 1, "replicationFactor": 1},
                })  # fmt: skip

                def ready(name: str = topic) -> dict[str, Any] | None:
                    return condition(crds, f"topic.laminarmq.io/{name}", namespace, "Ready")

                state = wait_for(f"{topic}'s Ready condition", ready)
                if brokers is trusted:
                    state = wait_for(f"{topic} Ready", lambda: (r := ready()) and
                                     r["status"] == "True" and r)  # fmt: skip
                    assert describe(trusted, topic) is not None
                else:
                    assert state["status"] == "False", state
                    assert "certificate" in state["message"], state
        finally:
            trusted.stop()
            stranger.stop()


class Kubelet:
    """What the kubelet does for a broker pod, for local `brokers`: the Secret `<name>-tls`
    mounted as each broker's certificate, key and CA bundle (each file replaced whole), and the
    brokers told to look (SIGHUP), whenever the Secret changes."""

    def __init__(self, kube: KubeApi, namespace: str, brokers: LocalCluster) -> None:
        self.kube, self.namespace, self.brokers = kube, namespace, brokers
        self._seen: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubelet", daemon=True)

    def sync(self) -> bool:
        """Mount the Secret if it changed; False while there is none."""
        secret = found(self.kube, "secret/demo-tls", self.namespace)
        if secret is None:
            return False
        if secret["data"] == self._seen:
            return True
        data = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
        tls = self.brokers.data_dir / "tls"
        tls.mkdir(parents=True, exist_ok=True)
        replace_file(tls / "ca.crt", data["ca.crt"])
        for node in self.brokers.nodes:
            replace_file(tls / f"{node}.key", data["tls.key"])
            replace_file(tls / f"{node}.crt", data["tls.crt"])
        for node in self.brokers.nodes.values():
            if node.pid is not None and node.alive():
                os.kill(node.pid, signal.SIGHUP)
        self._seen = secret["data"]
        return True

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.sync()

    def __enter__(self) -> Kubelet:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


class BackgroundProducer:
    """Appends one record at a time to `topic` until stopped (in a thread); `failure` is the
    first append that failed."""

    def __init__(self, brokers: LocalCluster, topic: str, token: str, ca_file: Path) -> None:
        self.args = (brokers, topic, token, ca_file)
        self.acked = 0
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        brokers, topic, token, ca_file = self.args
        try:
            async with AsyncClient(brokers.urls, token=token, ca_file=ca_file) as client:
                while not self._stop.is_set() and self.acked < 100_000:
                    await client.append(topic, self.acked % 2, [Record(b"r%d" % self.acked)])
                    self.acked += 1
                    await asyncio.sleep(0.02)
        except BaseException as e:  # reported by stop()
            self.failure = e

    def __enter__(self) -> BackgroundProducer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def test_the_ca_rotates_when_asked_without_downtime(
    crds: KubeApi, namespace: str, identity: OperatorIdentity, tmp_path: Path
) -> None:
    """The annotation laminarmq.io/rotate-ca: a new CA trusted by every broker first, then
    signing their certificate, then the old CA dropped; each step waits for what the brokers
    report having loaded. Brokers mounting `<name>-tls` as the kubelet does, and a client
    holding the published bundle, see no failure throughout; at the end every broker trusts
    the new CA alone and serves its certificate."""
    brokers = LocalCluster(tmp_path / "brokers", 3, prefix=loopback_prefix(), tls=True)
    cluster = local_cluster_object(namespace, brokers.urls)
    cluster["metadata"]["annotations"]["laminarmq.io/node-ids"] = ",".join(brokers.nodes)
    with (
        run_operator(identity, LAMINAR_CA_ROTATION_DWELL_S="2"),
        Kubelet(crds, namespace, brokers) as kubelet,
    ):
        crds.apply(cluster)
        uid = crds.get("laminarcluster/demo", "-n", namespace)["metadata"]["uid"]
        wait_for("the brokers' certificate", kubelet.sync)
        brokers.start()
        try:
            token = trust_operator(crds, namespace, brokers)
            old = CaState.from_data(crds.get(f"secret/laminar-ca-{uid}", "-n", "laminar-system")
                                    ["data"])  # fmt: skip
            old_print = certs.fingerprint(old.signer.cert_pem)

            def tls_status() -> dict[str, Any]:
                status = crds.get("laminarcluster/demo", "-n", namespace).get("status") or {}
                return status.get("tls") or {}

            wait_for("status.tls", lambda: tls_status().get("caFingerprint") == old_print)
            with SyncClient(brokers.urls, token=token, ca_file=brokers.ca_file) as admin:
                admin.create_topic("rotating", partitions=2, replication_factor=3)
                admin.run(admin.async_client.wait_for_leaders("rotating"))

            crds.kubectl("annotate", "laminarcluster/demo", "-n", namespace,
                         "laminarmq.io/rotate-ca=first")  # fmt: skip

            def published() -> bytes | None:
                pem = base64.b64decode(
                    crds.get("secret/demo-ca", "-n", namespace)["data"]["ca.crt"]
                )
                return pem if len(split_bundle(pem)) == 2 else None

            bundle = tmp_path / "client-ca.crt"
            bundle.write_bytes(wait_for("the bundle old + new published", published))
            with BackgroundProducer(brokers, "rotating", token, bundle) as producer:
                wait_for("a record acknowledged over the bundle", lambda: producer.acked > 0)
                done = wait_for(
                    "the rotation done",
                    lambda: (
                        (s := tls_status()).get("caFingerprint") != old_print
                        and "caRotation" not in s
                        and s.get("trustedCaFingerprints") == [s["caFingerprint"]]
                        and s
                    ),
                    timeout_s=180,
                )
                before = producer.acked
                wait_for("records acknowledged after", lambda: producer.acked > before + 5)
            assert producer.failure is None, repr(producer.failure)

            reasons = [e["reason"] for e in crds.get("events", "-n", namespace)["items"]
                       if e["involvedObject"]["name"] == "demo"]  # fmt: skip
            for reason in ("CaRotationStarted", "CaRotationSigning", "CaRotated"):
                assert reason in reasons, reasons
            kept = crds.get(f"secret/laminar-ca-{uid}", "-n", "laminar-system")["data"]
            assert set(kept) == {"ca.crt", "ca.key"}  # the rotation's next.* are gone
            new = CaState.from_data(kept)
            assert new.fingerprints == [done["caFingerprint"]]
            with SyncClient(brokers.urls, token=token, ca_file=bundle) as admin:
                for node in brokers.nodes:
                    state = wait_for(
                        f"{node} on the new CA alone",
                        lambda n=node: (
                            (s := admin.node_tls(n)).trusted_cas == (done["caFingerprint"],) and s
                        ),
                    )
                    assert state.fingerprint == done["fingerprint"]
                total = sum(len(admin.read("rotating", p, 0, max_records=100_000).records)
                            for p in range(2))  # fmt: skip
            assert total == producer.acked
        finally:
            brokers.stop()
