"""The operator (kopf, in a thread: KopfRunner) against the real API server, as the chart's
ServiceAccount with only the rights the chart grants it (rendered by `helm template`: the
cluster-wide ClusterRole here; tests/kube/test_rbac.py has the namespaced mode and what the
operator may not do)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
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
from laminar_operator.handlers import TIMER_EXIT_POLL_S

from ..integration.conftest import loopback_prefix, make_cluster
from .conftest import ROOT, KubeApi, OperatorIdentity, operator_identity, run_operator
from .held_proxy import HeldProxy

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

    def status_with_ready() -> Any:
        # the timer writes the phase (a merge patch) and then its conditions (a JSON patch of
        # the fresh object): a second request, so a read between them has no Ready yet
        status = crds.get("laminarcluster/demo", "-n", namespace).get("status", {})
        ready = [c for c in status.get("conditions") or [] if c["type"] == "Ready"]
        return status.get("selector") and status.get("phase") and ready and status

    status = wait_for("the status, with its Ready condition", status_with_ready)
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
        # and Ready: written after the partitions, by a request of its own (a JSON patch)
        ready = any(c["type"] == "Ready" for c in s.get("conditions") or [])
        return s if ready and len(parts) == 4 and all(p["leader"] for p in parts) else None

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


def test_a_topic_deleted_while_its_status_timer_waits_on_the_brokers_goes_within_seconds(
    crds: KubeApi, namespace: str, operator: Any, brokers: LocalCluster, records: Records
) -> None:
    """kopf ends a deleted object's timers before its deletion handlers run. A timer run held
    up in a call to the brokers made the deletion wait kopf's default poll of 60 s (CI75: a
    `kubectl delete` of a Topic timed out); with the operator's TIMER_EXIT_WAIT_S and
    TIMER_EXIT_POLL_S it goes on within seconds of the call's end. Here the call is in flight
    for sure: its bytes stop at a proxy until kopf says it found the timer still running."""
    proxy = HeldProxy(brokers.urls[0])
    kopf_objects = logging.getLogger("kopf.objects")
    level = kopf_objects.level
    kopf_objects.setLevel(logging.DEBUG)  # kopf says what it waits for at debug
    try:
        crds.apply(local_cluster_object(namespace, [proxy.url]))
        trust_operator(crds, namespace, brokers)
        topic = yaml.safe_load((ROOT / "examples" / "topic.yaml").read_text())
        topic["metadata"] = {"name": f"held-{namespace}", "namespace": namespace}
        name = topic["metadata"]["name"]
        crds.apply(topic)
        wait_for("the topic on the brokers", lambda: describe(brokers, name))
        what = f"topic.laminarmq.io/{name}"
        wait_for(
            "ReconcileSuccess",
            lambda: (
                (c := condition(crds, what, namespace, "ReconcileSuccess")) is not None
                and c["status"] == "True"
            ),
        )
        # once the topic is reconciled, its status timer is what calls the brokers (every
        # TOPIC_STATUS_INTERVAL_S): the LaminarCluster's handlers call them only to scale, to
        # change its workers or to rotate its CA, which this test does not
        proxy.hold()
        assert proxy.arrived.wait(WAIT_S), "no timer run called the brokers"  # held there now
        crds.kubectl("delete", what, "-n", namespace, "--wait=false")
        wait_for(
            "kopf finding the status timer still running",
            lambda: records.containing(name, "is still exiting"),
        )
        proxy.release()
        wait_for(
            "the Topic gone (its finalizer let go)",
            lambda: crds.kubectl("get", what, "-n", namespace, check=False).returncode != 0,
            timeout_s=TIMER_EXIT_POLL_S * 20,  # kopf's own default would take 60 s
        )
        assert describe(brokers, name) is None
    finally:
        kopf_objects.setLevel(level)
        proxy.close()


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
        # each step is an event on the cluster (kubectl describe shows them)
        for reason in ("Draining", "ScaledDown", "ScaleDownRefused"):
            wait_for(f"the {reason} event", lambda r=reason: events(crds, namespace, "demo", r))

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


def test_lowering_workers_per_pod_drains_the_workers_that_go_first(
    crds: KubeApi,
    namespace: str,
    operator: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """workersPerPod 2 -> 1 (docs/workers.md): the operator drains each broker's worker 1 and
    applies one worker per pod (the brokers' LAMINAR_WORKERS) only once none hosts a replica,
    so a topic of replication factor 1 keeps every partition led, with its records; 1 -> 2
    undrains them, and they own their share again."""
    brokers = make_cluster(tmp_path_factory.mktemp("workers"), 3, workers=2)
    try:
        cluster = local_cluster_object(namespace, brokers.urls)
        cluster["spec"]["workersPerPod"] = 2
        cluster["metadata"]["annotations"]["laminarmq.io/node-ids"] = ",".join(brokers.nodes)
        crds.apply(cluster)
        trust_operator(crds, namespace, brokers)

        def workers_applied() -> int | None:
            made = found(crds, "configmap/demo-config", namespace)
            return int(made["data"]["LAMINAR_WORKERS"]) if made else None

        wait_for("2 workers per pod", lambda: workers_applied() == 2)
        topic = "single"

        async def fill() -> None:
            async with AsyncClient(brokers.urls, token=brokers.token) as client:
                await client.create_topic(topic, partitions=6, replication_factor=1)
                await client.wait_for_leaders(topic)
                for p in range(6):
                    await client.append(topic, p, [Record(value=f"{p}-{n}".encode())
                                                   for n in range(10)])  # fmt: skip

        asyncio.run(fill())
        goes = [f"{node}~1" for node in brokers.nodes]

        def on_workers_1() -> int:  # (asked of each, as the operator does)
            async def ask() -> int:
                async with AsyncClient(brokers.urls, token=brokers.token) as client:
                    hosted = [(await client.node_partitions(w)).partitions for w in goes]
                    return sum(1 for found in hosted for p in found if p.topic == topic)

            return asyncio.run(ask())

        def led_on_workers_0() -> bool:
            async def ask() -> bool:
                async with AsyncClient(brokers.urls, token=brokers.token) as client:
                    states = (await client.describe_topic(topic)).partition_states
                    return all(s.leader in s.replicas and s.leader not in goes for s in states)

            return asyncio.run(ask())

        wait_for("replicas on the brokers' worker 1", lambda: on_workers_1() > 0)
        crds.kubectl("patch", "laminarcluster/demo", "-n", namespace, "--type=merge",
                     "-p", json.dumps({"spec": {"workersPerPod": 1}}))  # fmt: skip
        seen: list[tuple[int, int]] = []

        def lowered() -> bool:
            applied = workers_applied() or 0
            seen.append((applied, on_workers_1()))  # (asked after: a drained worker stays empty)
            return applied == 1

        wait_for("one worker per pod applied", lowered, timeout_s=120)
        assert seen[-1] == (1, 0), seen  # applied only once worker 1 hosted nothing
        assert any(w == 2 and on > 0 for w, on in seen), seen  # it waited for the drain
        wait_for("the DrainingWorkers event", lambda: events(crds, namespace, "demo",
                                                              "DrainingWorkers"))  # fmt: skip
        wait_for("every partition led by a worker 0", led_on_workers_0)

        def read_back() -> list[list[bytes | None]]:
            async def ask() -> list[list[bytes | None]]:
                async with AsyncClient(brokers.urls, token=brokers.token) as client:
                    return [[r.value for r in (await client.read(topic, p, 0)).records]
                            for p in range(6)]  # fmt: skip

            return asyncio.run(ask())

        assert read_back() == [[f"{p}-{n}".encode() for n in range(10)] for p in range(6)]
        # raised again: the drained workers are undrained, and placement uses them
        crds.kubectl("patch", "laminarcluster/demo", "-n", namespace, "--type=merge",
                     "-p", json.dumps({"spec": {"workersPerPod": 2}}))  # fmt: skip
        wait_for("2 workers per pod again", lambda: workers_applied() == 2)
        wait_for("replicas back on the brokers' worker 1", lambda: on_workers_1() > 0)
    finally:
        brokers.stop()


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

        status = wait_for(
            "status.tls",
            lambda: crds.get("laminarcluster/demo", "-n", namespace).get("status", {}).get("tls"),
        )
        first = certificate()  # (read after status.tls: its renewal is 40 s away)
        assert int(status["serial"], 16) == first.serial_number
        assert first.issuer == ca.certificate.subject
        names = names_of(first.public_bytes(serialization.Encoding.PEM))
        for name in ("demo", f"demo.{namespace}.svc", f"demo.{namespace}.svc.cluster.local",
                     f"*.demo-peers.{namespace}.svc", "127.0.0.1"):  # fmt: skip
            assert name in names, names
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


def test_the_reconcile_and_the_status_timer_at_once_issue_one_certificate(
    crds: KubeApi, namespace: str
) -> None:
    """The reconcile and the status timer each ensure the brokers' certificate from the object
    as it was when they started (no status.tls yet), and their status patches land only when
    they end: one issues it, the other finds it issued; both patches name the certificate the
    Secret holds (the cause of a red CI: two issued, status.tls naming the one overwritten)."""
    import kopf
    from cryptography import x509

    from laminar.kube import Credentials, KubeClient
    from laminar_operator import handlers

    cluster = yaml.safe_load((ROOT / "examples" / "cluster.yaml").read_text())
    cluster["metadata"]["namespace"] = namespace
    crds.apply(cluster)  # (no operator runs: these calls are all that touch it)
    raw = crds.get("laminarcluster/demo", "-n", namespace)

    def serial_in_the_secret() -> str:
        data = crds.get("secret/demo-tls", "-n", namespace)["data"]
        cert = x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"]))
        return format(cert.serial_number, "x")

    async def ensure(memo: kopf.Memo, body: dict[str, Any], *, restore: bool) -> Any:
        patch = kopf.Patch()
        await handlers._ensure_tls(memo.kube, memo, body, kopf.Body(body), patch, restore=restore)
        return patch.status.get("tls")

    async def run() -> tuple[Any, ...]:
        memo = kopf.Memo()
        memo.kube = KubeClient(Credentials.from_kubeconfig([crds.kubeconfig]))
        memo.events, memo.ca_namespace = handlers.events.EventLimiter(), None
        memo.cert_lifetime = certs.CERT_LIFETIME
        memo.cas, memo.issued, memo.tls_locks = {}, {}, {}
        try:
            reconciled, timed = await asyncio.gather(
                ensure(memo, raw, restore=True), ensure(memo, raw, restore=False)
            )
            landed = {**raw, "status": {"tls": reconciled}}  # the reconcile's patch landed
            return reconciled, timed, await ensure(memo, landed, restore=False)
        finally:
            await memo.kube.close()

    reconciled, timed, after = asyncio.run(run())
    serial = serial_in_the_secret()
    assert reconciled["serial"] == timed["serial"] == serial
    assert after is None  # status.tls says it now: nothing issued, nothing to patch


class Kubelet:
    """What the kubelet does for a broker pod, for local `brokers`: the Secret `<name>-tls`
    mounted as each broker's certificate, key and CA bundle (each file replaced whole), and the
    brokers told to look (SIGHUP), whenever the Secret changes. The test's thread and the
    kubelet's own call `sync` one at a time: else both could see one change, the test start
    the brokers after its call, and the thread's SIGHUP reach a broker before it handles the
    signal (whose default action ends the process, with nothing in its log)."""

    def __init__(self, kube: KubeApi, namespace: str, brokers: LocalCluster) -> None:
        self.kube, self.namespace, self.brokers = kube, namespace, brokers
        self._seen: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubelet", daemon=True)

    def sync(self) -> bool:
        """Mount the Secret if it changed; False while there is none."""
        with self._lock:
            return self._sync()

    def _sync(self) -> bool:
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


# ---- conditions tell the truth; events; quiet logs ------------------------------------------


def retries(kube: KubeApi, what: str, namespace: str) -> int:
    """The most retries kopf's progress annotations show for any handler of `what`."""
    annotations = kube.get(what, "-n", namespace)["metadata"].get("annotations") or {}
    counts = [0]
    for key, value in annotations.items():
        if key.startswith("laminarmq.io/") and value.startswith("{"):
            counts.append(int(json.loads(value).get("retries") or 0))
    return max(counts)


def events(kube: KubeApi, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.name={name},reason={reason}"
    found = kube.get("events", "-n", namespace, f"--field-selector={selector}")
    return list(found["items"])


def timer_ran(kube: KubeApi, what: str, namespace: str) -> None:
    """Wait for the LaminarCluster status timer to run once more: it puts back a status field
    set wrong by hand."""
    kube.kubectl(
        "patch", what, "-n", namespace, "--subresource=status", "--type=merge",
        "-p", '{"status": {"replicas": 42}}',
    )  # fmt: skip
    wait_for(
        "the status timer",
        lambda: (kube.get(what, "-n", namespace).get("status") or {}).get("replicas") != 42,
    )


def deny_stateful_sets(kube: KubeApi, namespace: str) -> None:
    """A ValidatingAdmissionPolicy refusing every StatefulSet written in `namespace`: the
    operator's apply fails as a real API server fails it (the policy is in force once a
    dry-run create is refused)."""
    name = f"deny-sts-{namespace}"
    kube.apply([
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": ["apps"], "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"], "resources": ["statefulsets"],
                }]},
                "validations": [{"expression": "false", "message": "refused by test policy"}],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": namespace},
                }},
            },
        },
    ])  # fmt: skip
    probe = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "probe", "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {"app": "probe"}},
            "serviceName": "probe",
            "template": {
                "metadata": {"labels": {"app": "probe"}},
                "spec": {"containers": [{"name": "c", "image": "probe"}]},
            },
        },
    }

    def refused() -> bool:
        answer = kube.kubectl(
            "create", "--dry-run=server", "-f", "-", stdin=json.dumps(probe), check=False
        )
        return answer.returncode != 0 and "refused by test policy" in answer.stderr

    wait_for("the policy in force", refused)


def allow_stateful_sets(kube: KubeApi, namespace: str) -> None:
    name = f"deny-sts-{namespace}"
    kube.kubectl("delete", "validatingadmissionpolicybinding", name)
    kube.kubectl("delete", "validatingadmissionpolicy", name)


def test_a_failed_reconcile_stays_visible_and_conditions_carry_their_generation(
    crds: KubeApi, namespace: str, operator: Any
) -> None:
    what = "laminarcluster/demo"
    deny_stateful_sets(crds, namespace)
    crds.kubectl("apply", "-n", namespace, "-f", str(ROOT / "examples" / "cluster.yaml"))

    failed = wait_for(
        "ReconcileSuccess False",
        lambda: (
            (c := condition(crds, what, namespace, "ReconcileSuccess"))
            and c["status"] == "False"
            and c
        ),
    )
    assert failed["reason"] == "ApplyFailed" and "refused by test policy" in failed["message"]
    assert failed["observedGeneration"] == 1
    # retried, and the status timer ran since: Ready still says why, the event was posted once
    wait_for("two retries", lambda: retries(crds, what, namespace) >= 2)
    timer_ran(crds, what, namespace)
    ready = condition(crds, what, namespace, "Ready")
    assert ready is not None and (ready["status"], ready["reason"]) == ("False", "ReconcileFailed")
    assert "refused by test policy" in ready["message"] and ready["observedGeneration"] == 1
    assert "observedGeneration" not in crds.get(what, "-n", namespace)["status"]  # never applied
    posted = wait_for(
        "the ApplyFailed event", lambda: events(crds, namespace, "demo", "ApplyFailed")
    )
    assert len(posted) == 1 and posted[0]["type"] == "Warning", posted

    def refused(generation: int) -> None:
        """A new spec (an image change) is refused: ReconcileSuccess says so as of it."""
        image = json.dumps({"spec": {"image": f"laminar:{generation}"}})
        crds.kubectl("patch", what, "-n", namespace, "--type=merge", "-p", image)
        wait_for(
            f"the refusal of generation {generation}",
            lambda: (
                (c := condition(crds, what, namespace, "ReconcileSuccess"))
                and (c["status"], c["observedGeneration"]) == ("False", generation)
            ),
        )

    # a new spec, refused too: the conditions say which generation they were computed from
    refused(2)

    allow_stateful_sets(crds, namespace)
    applied = wait_for(
        "ReconcileSuccess True",
        lambda: (
            (c := condition(crds, what, namespace, "ReconcileSuccess"))
            and c["status"] == "True"
            and c
        ),
    )
    assert applied["observedGeneration"] == 2
    assert crds.get(what, "-n", namespace)["status"]["observedGeneration"] == 2
    # no pods here (no kubelet): the StatefulSet's status is set by hand, as its controller would
    crds.kubectl(
        "patch", "statefulset/demo", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", '{"status": {"replicas": 3, "readyReplicas": 3, "availableReplicas": 3}}',
    )  # fmt: skip
    ready = wait_for(
        "Ready True",
        lambda: (c := condition(crds, what, namespace, "Ready")) and c["status"] == "True" and c,
    )
    assert ready["reason"] == "AllBrokersReady" and ready["observedGeneration"] == 2
    crds.kubectl("wait", "--for=condition=Ready", what, "-n", namespace, "--timeout=5s")

    # generation 3 refused: Ready is False as of generation 3, and `kubectl wait` does not pass
    deny_stateful_sets(crds, namespace)
    refused(3)
    timer_ran(crds, what, namespace)
    ready = condition(crds, what, namespace, "Ready")
    assert ready is not None and (ready["status"], ready["observedGeneration"]) == ("False", 3)
    waited = crds.kubectl(
        "wait", "--for=condition=Ready", what, "-n", namespace, "--timeout=1s", check=False
    )
    assert waited.returncode != 0, waited.stdout
    allow_stateful_sets(crds, namespace)


class Records(logging.Handler):
    """The operator's per-object log records (kopf.objects), as (object name, record)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[tuple[str, logging.LogRecord]] = []

    def emit(self, record: logging.LogRecord) -> None:
        ref = getattr(record, "k8s_ref", None) or {}
        self.seen.append((str(ref.get("name", "")), record))  # under the handler's own lock

    def of(self, name: str, message: str) -> list[logging.LogRecord]:
        with self.lock:  # logging.Handler's (an RLock that emit runs under)
            return [r for n, r in self.seen if n == name and r.getMessage() == message]

    def containing(self, name: str, text: str) -> list[logging.LogRecord]:
        with self.lock:
            return [r for n, r in self.seen if n == name and text in r.getMessage()]


@pytest.fixture()
def records() -> Iterator[Records]:
    handler = Records()
    logger = logging.getLogger("kopf.objects")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def test_topic_conditions_keep_the_brokers_reason_show_mismatches_and_events(
    crds: KubeApi,
    namespace: str,
    identity: OperatorIdentity,
    brokers: LocalCluster,
    records: Records,
) -> None:
    crds.apply(local_cluster_object(namespace, brokers.urls))
    too_wide, adopted, plain = (f"{n}-{namespace}" for n in ("wide", "adopted", "plain"))

    async def create_adopted() -> None:
        async with AsyncClient(
            brokers.urls, token=brokers.token, ca_file=brokers.ca_file
        ) as client:
            await client.create_topic(adopted, 3, 1, {})

    asyncio.run(create_adopted())
    spec = {"cluster": "demo", "partitions": 2}
    topics = [
        (too_wide, {**spec, "replicationFactor": 5}),
        (adopted, {**spec, "replicationFactor": 3}),
        (plain, spec),
    ]
    crds.apply([
        {"apiVersion": "laminarmq.io/v1alpha1", "kind": "Topic",
         "metadata": {"name": name, "namespace": namespace}, "spec": body}
        for name, body in topics
    ])  # fmt: skip
    timer = "Timer 'refresh_topic_status' succeeded."
    with run_operator(identity, LAMINAR_OPERATOR_LOG_LEVEL="debug"):
        trust_operator(crds, namespace, brokers)
        # RF 5 on 3 brokers: the broker's own reason stays, timer runs after timer runs
        rejected = wait_for(
            "Ready False, Rejected",
            lambda: (
                (c := condition(crds, f"topic/{too_wide}", namespace, "Ready"))
                and c["reason"] == "Rejected"
                and c
            ),
        )
        assert "replication_factor=5 but only 3 brokers" in rejected["message"], rejected
        ran = len(records.of(too_wide, timer))
        wait_for("two more timer runs", lambda: len(records.of(too_wide, timer)) >= ran + 2)
        assert condition(crds, f"topic/{too_wide}", namespace, "Ready") == rejected
        assert events(crds, namespace, too_wide, "Rejected")

        # adopted with another replication factor and more partitions: said, not Ready
        differs = wait_for(
            "SpecMismatch",
            lambda: condition(crds, f"topic/{adopted}", namespace, "SpecMismatch"),
        )
        assert differs["status"] == "True"
        assert "replication factor 1, the spec asks 3" in differs["message"]
        assert "3 partitions, the spec asks 2" in differs["message"]
        ready = condition(crds, f"topic/{adopted}", namespace, "Ready")
        assert ready is not None and (ready["status"], ready["reason"]) == ("False", "SpecMismatch")
        status = crds.get(f"topic/{adopted}", "-n", namespace)["status"]
        assert (status["replicationFactor"], status["partitionCount"]) == (1, 3)
        wait_for("TopicAdopted", lambda: events(crds, namespace, adopted, "TopicAdopted"))
        wait_for("SpecMismatch event", lambda: events(crds, namespace, adopted, "SpecMismatch"))

        # no replication factor in the spec: the effective one (the cluster's default) shown
        wait_for(
            "plain Ready",
            lambda: (
                (c := condition(crds, f"topic/{plain}", namespace, "Ready"))
                and c["status"] == "True"
            ),
        )
        assert crds.get(f"topic/{plain}", "-n", namespace)["status"]["replicationFactor"] == 3
        wide = crds.kubectl("get", "topics", "-n", namespace, "-o", "wide").stdout.splitlines()
        header = wide[0].split()
        assert header[:4] == ["NAME", "CLUSTER", "PARTITIONS", "RF"], header
        assert {"LIVE-PARTITIONS", "REASON", "MISMATCH", "GENERATION"} <= set(header), header
        row = next(line.split() for line in wide if line.startswith(plain))
        assert row[3] == "3", wide
        wait_for("TopicCreated", lambda: events(crds, namespace, plain, "TopicCreated"))

        crds.kubectl("delete", f"topic/{plain}", "-n", namespace, "--timeout=60s")
        wait_for("TopicDeleted", lambda: events(crds, namespace, plain, "TopicDeleted"))
    # routine timer success is logged at debug only
    routine = records.of(too_wide, timer)
    assert routine and all(r.levelno == logging.DEBUG for r in routine)
