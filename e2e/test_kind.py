"""The user's whole story on a real kind cluster, against the real images: the operator
installed with Helm, `kubectl apply -f examples/cluster.yaml`, a Topic, records through the
client Service from a pod, a scale to 5 and back to 3, a force-deleted broker pod, a rolling
restart, the XDP router with two workers per broker, and deleting it all.

The scenarios run in order on one cluster (e2e/conftest.py makes it), each asserting on
state and waiting with bounded timeouts. Every record a producer had acknowledged is checked
after every disruption (`Ledger`). LAMINAR_KIND_KEEP=1 leaves the cluster for a look.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from laminar_operator.manifests import STEER_PORT

from .cluster import IMAGE_TAG, ROOT
from .conftest import Kube, wait_for, workload_out_file

pytestmark = pytest.mark.e2e

BROKER_IMAGE = f"localhost/laminar-broker:{IMAGE_TAG}"
OPERATOR_IMAGE = f"localhost/laminar-operator:{IMAGE_TAG}"
RELEASE, OPERATOR_NAMESPACE = "laminar-operator", "laminar-system"
BROKERS = "https://demo:7070"  # the client Service (TLS: the cluster's default)
#: Where the client pod has the cluster's CA (the Secret demo-ca, its certificate only); the
#: pod's LAMINAR_CA_FILE names it for the CLI and e2e/workload.py.
CA_DIR = "/etc/laminar/ca"
#: Where the client pod has the cluster's client token (the Secret demo-credentials, its key
#: client-token only: producer and consumer of every topic); LAMINAR_TOKEN_FILE names it.
TOKEN_DIR = "/etc/laminar/token"
CLIENT = "laminar-client"  # a pod of the broker image: it carries the CLI and the client
TOPIC, PARTITIONS = "orders", 6
PRODUCE_MAX_S = 300.0
PRODUCE_MAX_RECORDS = 20_000
CRDS = ("crd/laminarclusters.laminarmq.io", "crd/topics.laminarmq.io")
#: Where the scenarios keep what a person would see (kubectl output), to read after a run.
ARTIFACTS = Path(os.environ.get("LAMINAR_E2E_ARTIFACTS") or Path.home() / ".cache" / "laminar"
                 / "artifacts" / "e2e")  # fmt: skip


class Ledger:
    """Every record acknowledged in these tests, by value: where it was acknowledged."""

    def __init__(self) -> None:
        self.acknowledged: dict[str, tuple[int, int]] = {}

    def add(self, value: str, partition: int, index: int) -> None:
        assert value not in self.acknowledged, f"{value} acknowledged twice"
        self.acknowledged[value] = (partition, index)

    def check(self, kube: Kube) -> None:
        """Every acknowledged record is readable at its acknowledged place: each partition is
        read through its last acknowledged index, not only through the commit index the
        replica read reports (a follower's, just restarted, may lag the leader's)."""
        through: dict[int, int] = {}
        for partition, index in self.acknowledged.values():
            through[partition] = max(index, through.get(partition, -1))
        read = kube.workload(CLIENT, "read", BROKERS, TOPIC, json.dumps(through))
        stored = {(r["partition"], r["index"]): r["value"] for r in read}
        lost = {v: at for v, at in self.acknowledged.items() if stored.get(at) != v}
        assert not lost, f"{len(lost)} acknowledged records not where acknowledged: {lost!r:.2000}"


LEDGER = Ledger()


class Producer:
    """e2e/workload.py's idempotent producer running in the client pod while something
    happens to the cluster; `finish` stops it and records what it acknowledged."""

    def __init__(self, kube: Kube, prefix: str) -> None:
        self.kube = kube
        self.stop_file = f"/tmp/stop-{prefix}-{secrets.token_hex(4)}"  # this producer's own
        self.out_file = workload_out_file()
        self.process = kube.start_workload(
            CLIENT, self.out_file, "produce", BROKERS, TOPIC, prefix, str(PRODUCE_MAX_RECORDS),
            str(PRODUCE_MAX_S), self.stop_file,
        )  # fmt: skip

    def finish(self) -> dict[str, Any]:
        self.kube.kubectl("exec", CLIENT, "--", "touch", self.stop_file)
        out, err = self.process.communicate(timeout=PRODUCE_MAX_S + 180)
        assert self.process.returncode == 0, f"the producer failed:\n{err[-4000:]}"
        lines = self.kube.workload_lines(CLIENT, out, self.out_file)
        errors = [line for line in lines if "error" in line]
        for line in lines:
            if "index" in line:
                LEDGER.add(line["value"], line["partition"], line["index"])
        summary = lines[-1]
        assert summary["acknowledged"] > 0, summary
        return {**summary, "error_lines": errors}


class Watch:
    """Every version of an object while something happens (kubectl get --watch into a file,
    so no version is missed however long the test looks away)."""

    def __init__(self, kube: Kube, what: str, *args: str) -> None:
        self.file = tempfile.TemporaryFile("w+")  # noqa: SIM115 (kept until stop)
        command = [str(kube.tools.kubectl), "--kubeconfig", str(kube.kubeconfig), "get", what,
                   *args, "--watch", "-o", "json"]  # fmt: skip
        self.process = subprocess.Popen(command, stdout=self.file, stderr=subprocess.DEVNULL)

    def versions(self) -> list[dict[str, Any]]:
        self.file.seek(0)
        text, at, decoder = self.file.read(), 0, json.JSONDecoder()
        found: list[dict[str, Any]] = []
        while True:
            while at < len(text) and text[at].isspace():
                at += 1
            if at >= len(text):
                return found
            try:
                obj, at = decoder.raw_decode(text, at)
            except json.JSONDecodeError:  # the last version, half written
                return found
            found.append(obj)

    def stop(self) -> list[dict[str, Any]]:
        self.process.terminate()
        self.process.wait(timeout=30)
        versions = self.versions()
        self.file.close()
        return versions


def save_artifact(name: str, text: str) -> None:
    """Keep what a person would see, under ARTIFACTS (the CI job's log names the folder)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / name).write_text(text)


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


def cluster_status(kube: Kube) -> dict[str, Any]:
    return kube.get("laminarcluster/demo").get("status") or {}


def status_writers(obj: dict[str, Any], field: str) -> set[str]:
    """The field managers that set `field` of an object's status."""
    return {
        entry["manager"]
        for entry in obj["metadata"].get("managedFields") or []
        if entry.get("subresource") == "status"
        and field in (entry.get("fieldsV1") or {}).get("f:status", {})
    }


def topic_status(kube: Kube) -> dict[str, Any]:
    return kube.get(f"topic.laminarmq.io/{TOPIC}").get("status") or {}


def pod_names(kube: Kube) -> list[str]:
    pods = kube.get("pods", "-l", "app.kubernetes.io/instance=demo")["items"]
    return sorted(p["metadata"]["name"] for p in pods)


def gauge(metrics: str, name: str, **labels: str) -> float | None:
    """A sample's value in a Prometheus text exposition (None when absent)."""
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


def replica_positions(kube: Kube, pod: str) -> dict[int, tuple[float, float]]:
    """(log start, log end) of each partition of the topic that `pod` hosts, from its /metrics."""
    metrics = kube.metrics(pod)
    found = {}
    for partition in range(PARTITIONS):
        start = gauge(metrics, "laminar_partition_log_start", topic=TOPIC, partition=str(partition))
        end = gauge(metrics, "laminar_partition_log_end", topic=TOPIC, partition=str(partition))
        if start is not None and end is not None:
            found[partition] = (start, end)
    return found


def records_on(kube: Kube, pod: str) -> float:
    """How many records of the topic `pod`'s replicas end at, all partitions summed."""
    return sum(end for _, end in replica_positions(kube, pod).values())


def wait_for_progress(kube: Kube, pod: str, records: int) -> None:
    """Until `records` more have reached `pod`'s replicas: the producer is under way."""
    first = records_on(kube, pod)
    wait_for(f"{records} more records on {pod}", lambda: records_on(kube, pod) >= first + records)


def converged(kube: Kube, brokers: list[str]) -> dict[str, Any] | None:
    """The cluster status once Rebalancing is False with every partition's replicas among
    `brokers`, fully in sync, and every broker hosting some."""
    status, topic = cluster_status(kube), topic_status(kube)
    if condition(status, "Rebalancing").get("status") != "False":
        return None
    parts = topic.get("partitions") or []
    if len(parts) != PARTITIONS or topic.get("underReplicated") != 0:
        return None
    if {r for p in parts for r in p["replicas"]} != set(brokers):
        return None
    if not all(p["leader"] and sorted(p["inSync"]) == sorted(p["replicas"]) for p in parts):
        return None
    return status


# ---------------------------------------------------------------------------- 1. Helm


def test_1_helm_installs_the_operator(kube: Kube) -> None:
    kube.helm(
        "install", RELEASE, str(ROOT / "charts" / "laminar-operator"),
        "--namespace", OPERATOR_NAMESPACE, "--create-namespace", "--wait", "--timeout", "5m",
        "--set", f"image.repository={OPERATOR_IMAGE.split(':')[0]}",
        "--set", f"image.tag={IMAGE_TAG}",
        "--set", "xdp.allowed=true",  # scenario 8 runs the XDP router (docs/kubernetes.md)
    )  # fmt: skip
    kube.kubectl("wait", "--for=condition=Established", *CRDS, "--timeout=60s")
    kube.kubectl("wait", "--for=condition=Available", f"deployment/{RELEASE}",
                 "-n", OPERATOR_NAMESPACE, "--timeout=120s")  # fmt: skip
    tested = kube.helm("test", RELEASE, "--namespace", OPERATOR_NAMESPACE, "--timeout", "3m")
    assert re.search(r"Phase:\s+Succeeded", tested), tested


# ---------------------------------------------------------------------------- 2. the cluster


def test_2_a_cluster_of_three_brokers(kube: Kube) -> None:
    cluster = yaml.safe_load((ROOT / "examples" / "cluster.yaml").read_text())
    cluster["spec"]["image"] = BROKER_IMAGE
    # one kind node of 2 cores holds the control plane and 5 brokers: small requests
    cluster["spec"]["resources"] = {"requests": {"cpu": "50m", "memory": "128Mi"},
                                    "limits": {"memory": "1Gi"}}  # fmt: skip
    kube.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(cluster))

    def ready() -> dict[str, Any] | None:
        status = cluster_status(kube)
        alive = [m["name"] for m in status.get("members") or [] if m["state"] == "alive"]
        return status if (
            status.get("readyReplicas") == 3 and status.get("phase") == "Running"
            and condition(status, "Ready").get("status") == "True"
            and sorted(alive) == ["demo-0", "demo-1", "demo-2"]
        ) else None  # fmt: skip

    status = wait_for("3 brokers ready, Running, with 3 live members", ready)
    assert condition(status, "Ready")["reason"] == "AllBrokersReady"
    assert status["reportedAt"]  # written by the brokers
    assert pod_names(kube) == ["demo-0", "demo-1", "demo-2"]
    for ordinal in range(3):
        claim = kube.get(f"pvc/data-demo-{ordinal}")
        assert claim["status"]["phase"] == "Bound", claim["status"]
        assert claim["spec"]["storageClassName"] == "standard"  # kind's local-path class
    # one cluster by gossip: every broker sees the three alive
    for pod in pod_names(kube):
        assert gauge(kube.metrics(pod), "laminar_swim_members", state="alive") == 3, pod

    # the label the cluster's NetworkPolicy admits to the brokers' API port
    # TLS: the operator made the cluster's CA and the brokers' certificate; the CA's Secret
    # holds its certificate only (its key stays in the operator's namespace)
    assert set(kube.get("secret/demo-ca")["data"]) == {"ca.crt"}
    assert kube.get("secret/demo-tls")["type"] == "kubernetes.io/tls"
    uid = kube.get("laminarcluster/demo")["metadata"]["uid"]
    assert kube.exists(f"secret/laminar-ca-{uid}", "-n", OPERATOR_NAMESPACE)
    # client credentials: the brokers' file and two tokens made once; the operator's own token
    # kept in its namespace (docs/kubernetes.md, "Client credentials")
    assert set(kube.get("secret/demo-credentials")["data"]) == {
        "credentials.yaml", "admin-token", "client-token"}  # fmt: skip
    assert kube.exists(f"secret/laminar-token-{uid}", "-n", OPERATOR_NAMESPACE)
    client = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": CLIENT, "labels": {"laminarmq.io/client": "true"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "client", "image": BROKER_IMAGE, "imagePullPolicy": "Never",
                # (a shell that ends on SIGTERM: `sleep` as the pod's first process ignores
                # it, and deleting the pod would wait out its 30 s grace)
                "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 7200 & wait"],
                "env": [{"name": "LAMINAR_CA_FILE", "value": f"{CA_DIR}/ca.crt"},
                        {"name": "LAMINAR_TOKEN_FILE", "value": f"{TOKEN_DIR}/client-token"}],
                "volumeMounts": [{"name": "ca", "mountPath": CA_DIR, "readOnly": True},
                                 {"name": "token", "mountPath": TOKEN_DIR, "readOnly": True}],
            }],
            "volumes": [
                {"name": "ca", "secret": {"secretName": "demo-ca"}},
                {"name": "token", "secret": {"secretName": "demo-credentials",
                 "items": [{"key": "client-token", "path": "client-token"}]}},
            ],
        },
    }  # fmt: skip
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(client))
    kube.kubectl("wait", "--for=condition=Ready", f"pod/{CLIENT}", "--timeout=180s")


# ---------------------------------------------------------------------------- 3. a Topic


def test_3_a_topic_reports_its_partitions(kube: Kube) -> None:
    topic = yaml.safe_load((ROOT / "examples" / "topic.yaml").read_text())
    topic["spec"]["partitions"] = PARTITIONS
    assert topic["spec"]["replicationFactor"] == 3
    kube.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(topic))

    def listed() -> dict[str, Any] | None:
        # two writers: the operator sets Ready once it created the topic, and the brokers
        # (server/kube_status.py) list the partitions, which may come first (CI35)
        status = topic_status(kube)
        parts = status.get("partitions") or []
        return status if len(parts) == PARTITIONS and all(
            p["leader"] and len(p["replicas"]) == 3 and len(p["inSync"]) == 3 for p in parts
        ) and condition(status, "Ready").get("status") == "True" else None  # fmt: skip

    status = wait_for("Ready, and every partition's leader, replicas and in-sync replicas", listed)
    assert sorted(p["partition"] for p in status["partitions"]) == list(range(PARTITIONS))
    for p in status["partitions"]:
        assert sorted(p["replicas"]) == ["demo-0", "demo-1", "demo-2"], p
        assert p["leader"] in p["replicas"] and isinstance(p["commitIndex"], int), p
    # (who wrote the partitions: the operator's answer to creating the topic, or a broker
    # first; the brokers' own writes are checked in test 4, once records moved the commit
    # indexes)

    # what a person sees (docs/kubernetes.md shows it): the effective replication factor, the
    # wide columns, and the operator's decisions as events in `kubectl describe`
    wide = kube.kubectl("get", "laminarclusters,topics", "-o", "wide")
    assert "LIVE-PARTITIONS" in wide and "RECONCILED" in wide, wide
    row = next(line.split() for line in wide.splitlines() if line.startswith("topic"))
    assert row[3] == "3", wide  # RF, from status
    save_artifact("get-wide.txt", wide)
    for what, reason in (("laminarcluster/demo", "Applied"), (f"topic/{TOPIC}", "TopicCreated")):

        def described(what: str = what, reason: str = reason) -> str | None:
            out = kube.kubectl("describe", what)
            return out if reason in out.split("Events:")[-1] else None

        out = wait_for(f"{what}'s {reason} event", described)
        save_artifact(f"describe-{what.replace('/', '-')}.txt", out)


# ---------------------------------------------------------------------------- 4. records


def test_4_records_through_the_client_service(kube: Kube) -> None:
    lines = "".join(f"cli-{i}\n" for i in range(50))
    out = kube.kubectl("exec", "-i", CLIENT, "--", "laminar", "produce", f"--brokers={BROKERS}",
                       "--json", TOPIC, stdin=lines)  # fmt: skip
    produced = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(produced) == 50 and all("index" in p for p in produced), out[-2000:]
    for p in produced:
        LEDGER.add(f"cli-{p['line'] - 1}", p["partition"], p["index"])
    read = kube.kubectl("exec", CLIENT, "--", "laminar", "consume", f"--brokers={BROKERS}",
                        "--json", TOPIC)  # fmt: skip
    values = sorted(json.loads(line)["value"] for line in read.splitlines() if line.strip())
    assert values == sorted(f"cli-{i}" for i in range(50))
    # without the token: 401; with the client's token, no topic administration: 403
    refused = kube.kubectl("exec", CLIENT, "--", "sh", "-c",
                           f"env -u LAMINAR_TOKEN_FILE laminar topic list --brokers={BROKERS} "
                           "2>&1; echo exit=$?")  # fmt: skip
    assert "401 unauthorized" in refused and "exit=1" in refused, refused
    refused = kube.kubectl("exec", CLIENT, "--", "sh", "-c",
                           f"laminar topic create not-mine --brokers={BROKERS} 2>&1; "
                           "echo exit=$?")  # fmt: skip
    assert "403 forbidden" in refused and "exit=1" in refused, refused

    # and with the Python client
    done = kube.workload(CLIENT, "produce", BROKERS, TOPIC, "py", "300", "120", "/tmp/no-stop")
    summary = done[-1]
    assert summary == {"sent": 300, "acknowledged": 300, "errors": 0}, summary
    for line in done[:-1]:
        LEDGER.add(line["value"], line["partition"], line["index"])
    LEDGER.check(kube)

    # the commit indexes in the Topic's status follow the records: written by the brokers,
    # from inside their pods, with their own ServiceAccount (the operator's fallback reads the
    # brokers only while their reports are stale, and answers to creating the topic had none)
    through: dict[int, int] = {}
    for partition, index in LEDGER.acknowledged.values():
        through[partition] = max(index, through.get(partition, -1))

    def reported() -> dict[str, Any] | None:
        obj = kube.get(f"topic.laminarmq.io/{TOPIC}", "--show-managed-fields")
        shown = {p["partition"]: p["commitIndex"] for p in obj["status"]["partitions"]}
        return obj if all(shown.get(p, -1) >= i for p, i in through.items()) else None

    obj = wait_for("the Topic's commit indexes past every acknowledged record", reported)
    assert "laminar-broker" in status_writers(obj, "f:partitions"), obj["metadata"]


# ---------------------------------------------------------------------------- 5. scaling


def test_5_scale_to_five_and_back_to_three(kube: Kube) -> None:
    watch = Watch(kube, "laminarcluster/demo")
    kube.kubectl("scale", "laminarcluster/demo", "--replicas=5")
    wait_for("5 brokers ready", lambda: cluster_status(kube).get("readyReplicas") == 5)
    five = [f"demo-{i}" for i in range(5)]
    status = wait_for("Rebalancing over, partitions on all 5", lambda: converged(kube, five))
    members = {m["name"]: m for m in status["members"]}
    assert members["demo-3"]["replicas"] > 0 and members["demo-4"]["replicas"] > 0, members
    versions = watch.stop()
    shown = [condition(v.get("status") or {}, "Rebalancing") for v in versions]
    assert any(c.get("status") == "True" for c in shown), f"Rebalancing never True: {shown}"
    LEDGER.check(kube)

    watch = Watch(kube, "laminarcluster/demo")
    sts_watch = Watch(kube, "statefulset/demo")
    kube.kubectl("scale", "laminarcluster/demo", "--replicas=3")
    three = [f"demo-{i}" for i in range(3)]
    wait_for("the StatefulSet back at 3",
             lambda: kube.get("statefulset/demo")["spec"]["replicas"] == 3)  # fmt: skip
    wait_for("3 brokers, partitions back on them", lambda: converged(kube, three))
    wait_for("demo-3 and demo-4 gone", lambda: pod_names(kube) == three)
    versions, sizes = watch.stop(), [s["spec"]["replicas"] for s in sts_watch.stop()]
    # one ordinal at a time, the highest first, each only once it hosted nothing
    assert [n for i, n in enumerate(sizes) if i == 0 or n != sizes[i - 1]] == [5, 4, 3], sizes
    drains = [condition(v.get("status") or {}, "ScaleDown") for v in versions]
    messages = [c.get("message", "") for c in drains if c.get("reason") in ("Draining", "Drained")]
    assert any(m.startswith("demo-4 drained") for m in messages), messages
    assert any(m.startswith("demo-3 drained") for m in messages), messages
    first4 = next(i for i, m in enumerate(messages) if "demo-4" in m)
    first3 = next(i for i, m in enumerate(messages) if "demo-3" in m)
    assert first4 < first3, messages
    wait_for("phase Running", lambda: cluster_status(kube).get("phase") == "Running")
    LEDGER.check(kube)


# ---------------------------------------------------------------------------- 6. force delete


def test_6_a_broker_pod_force_deleted_under_load(kube: Kube) -> None:
    victim = "demo-1"
    claim = kube.get(f"pvc/data-{victim}")["metadata"]["uid"]
    started = kube.get(f"pod/{victim}")["metadata"]["uid"]
    producer = Producer(kube, "forced")
    wait_for_progress(kube, victim, 200)
    before = replica_positions(kube, victim)
    kube.kubectl("delete", "pod", victim, "--force", "--grace-period=0")

    def back() -> bool:
        if not kube.exists(f"pod/{victim}"):  # deleted, not yet made again
            return False
        pod = kube.get(f"pod/{victim}")
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        replaced = pod["metadata"]["uid"] != started
        return replaced and bool(statuses) and all(c["ready"] for c in statuses)

    wait_for(f"{victim} back and ready", back)
    wait_for_progress(kube, victim, 200)  # and taking records again
    summary = producer.finish()
    assert summary["errors"] == 0, summary
    assert kube.get(f"pvc/data-{victim}")["metadata"]["uid"] == claim  # the same volume
    after = replica_positions(kube, victim)
    assert set(after) == set(before), (before, after)
    for partition, (start, end) in before.items():
        assert after[partition][0] == start, (partition, before, after)  # nothing re-fetched
        assert after[partition][1] >= end, (partition, before, after)  # nothing lost
    LEDGER.check(kube)


# ---------------------------------------------------------------------------- 7. rolling restart


def test_7_a_rolling_restart_hands_leaderships_over(kube: Kube) -> None:
    started = {p: kube.get(f"pod/{p}")["metadata"]["uid"] for p in pod_names(kube)}
    producer = Producer(kube, "rolling")
    wait_for_progress(kube, "demo-0", 200)

    def spec_hash() -> str:
        template = kube.get("statefulset/demo")["spec"]["template"]["metadata"]
        return str((template.get("annotations") or {}).get("laminarmq.io/spec-hash"))

    before = spec_hash()
    kube.kubectl("patch", "laminarcluster/demo", "--type=merge",
                 "-p", json.dumps({"spec": {"config": {"segmentBytes": 8 << 20}}}))  # fmt: skip
    # the operator applied it: else the rollout awaited below is the old, finished one
    wait_for("the StatefulSet's template of the new spec", lambda: spec_hash() != before)
    kube.kubectl("rollout", "status", "statefulset/demo", "--timeout=600s", timeout_s=660)

    def replaced_and_ready() -> bool:  # the pods themselves (the cluster's status lags them)
        for name, uid in started.items():
            pod = kube.get(f"pod/{name}")
            conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions") or []}
            if pod["metadata"]["uid"] == uid or conditions.get("Ready") != "True":
                return False
        return True

    wait_for("every broker pod replaced and ready", replaced_and_ready)
    summary = producer.finish()
    # the Producer retried the 503s and 307s of the roll: no record failed
    assert summary["errors"] == 0, summary
    # the hooks of the pods this roll stopped (test 6's force delete leaves its hook 2 s: that
    # one may fail, killed with its container, and its event is still listed)
    rolled = set(started.values())
    events = kube.get("events", "--field-selector", "reason=FailedPreStopHook")["items"]
    failed = [e for e in events if e["involvedObject"].get("uid") in rolled]
    assert not failed, [(e["involvedObject"]["name"], e["message"]) for e in failed]
    for pod in pod_names(kube):
        config = kube.kubectl("exec", pod, "-c", "broker", "--", "sh", "-c", "env")
        assert "LAMINAR_SEGMENT_BYTES=8388608" in config, pod
    wait_for("in sync after the roll", lambda: converged(kube, [f"demo-{i}" for i in range(3)]))
    LEDGER.check(kube)


# ---------------------------------------------------------------------------- 8. XDP


def test_8_the_xdp_router_and_two_workers_in_the_pods(kube: Kube) -> None:
    """One roll: the XDP router in an init container, and two worker processes per broker
    (docs/workers.md), while a producer runs."""
    producer = Producer(kube, "workers")
    wait_for_progress(kube, "demo-0", 200)
    kube.kubectl("patch", "laminarcluster/demo", "--type=merge", "-p",
                 json.dumps({"spec": {"xdp": {"enabled": True}, "workersPerPod": 2}}))  # fmt: skip

    def templated() -> bool:  # the operator applied it: else the rollout below is the old one
        spec = kube.get("statefulset/demo")["spec"]["template"]["spec"]
        ports = {p["name"] for c in spec["containers"] for p in c.get("ports") or []}
        xdp = any(c["name"] == "xdp-router" for c in spec.get("initContainers") or [])
        return xdp and {"api-1", "peer-1"} <= ports

    wait_for("the StatefulSet's template with the XDP init container and worker 1", templated)
    kube.kubectl("rollout", "status", "statefulset/demo", "--timeout=600s", timeout_s=660)
    wait_for("3 brokers ready", lambda: cluster_status(kube).get("readyReplicas") == 3)
    summary = producer.finish()
    assert summary["errors"] == 0, summary  # (the client retried the roll's 503s and 307s)
    for pod in pod_names(kube):
        loaded = kube.kubectl("logs", pod, "-c", "xdp-router")
        assert "router attached" in loaded, loaded
        # beside the router, the steer port's program (docs/workers.md, routing layer 3),
        # which the unprivileged broker attached to its steer port
        assert "steer port's program pinned for 2 workers" in loaded, loaded
        served = kube.kubectl("logs", pod, "-c", "broker")
        assert "by the pinned program" in served, served[-2000:]

    def counted() -> float:
        return sum(gauge(kube.metrics(p), "laminar_xdp_packets_total", **{"class": "membership"})
                   or 0 for p in pod_names(kube))  # fmt: skip

    first = wait_for("XDP counters exported", counted)
    wait_for("XDP counters moving (gossip passes the router)", lambda: counted() > first)

    # each broker's worker 1 hosts a share of the partitions (placement moved them within
    # the broker), and worker 0's /metrics has its samples, labelled
    def on_worker_1() -> set[str]:
        parts = topic_status(kube).get("partitions") or []
        return {r for p in parts for r in p["replicas"] if r.endswith("~1")}

    wait_for("replicas on the brokers' worker 1", lambda: len(on_worker_1()) == 3)
    for ordinal, pod in enumerate(pod_names(kube)):
        leads = gauge(kube.metrics(pod), "laminar_partition_term", worker="1", topic=TOPIC)
        assert leads is not None, f"{pod}'s /metrics has no replica of its worker 1"
        # a connection to the steer port from a source port naming worker w is worker w's
        address = kube.get(f"pod/{pod}")["status"]["podIP"]
        # fresh source ports (no TIME_WAIT met) below the pod's ephemeral range: the producer
        # in the same pod has its own connections on ports from that range (one took 41020,
        # and the bind failed with EADDRINUSE, in CI88)
        base = SOURCE_PORT_BASE + 10 * ordinal
        out = kube.kubectl("exec", "-i", CLIENT, "--", "python3", "-", address, str(STEER_PORT),
                           str(base), stdin=STEERED)  # fmt: skip
        assert json.loads(out) == [[w % 2, f"{pod}~{w % 2}" if w % 2 else pod] for w in range(6)]
    LEDGER.check(kube)


#: the first source port of the steered connections: below Linux's ephemeral range (from
#: 32768), which only connections that name their own port use
SOURCE_PORT_BASE = 21000
#: In the client pod: which worker (node id) answers GET /v1/cluster on a connection to the
#: steer port from a source port naming worker (port mod 2), for 6 fresh source ports.
STEERED = """
import json, os, socket, ssl, sys
address, port, base = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])  # (base: even)
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
assert base + 6 <= low, f"source ports {base}-{base + 5} fall in the ephemeral range from {low}"
context = ssl.create_default_context(cafile=os.environ["LAMINAR_CA_FILE"])
context.check_hostname = False  # (by IP; the CA is still checked)
token = open(os.environ["LAMINAR_TOKEN_FILE"]).read().strip()
out = []
for n in range(6):
    plain = socket.create_connection((address, port), timeout=10,
                                     source_address=("", base + n))
    with context.wrap_socket(plain) as tls:
        tls.sendall(f"GET /v1/cluster HTTP/1.1\\r\\nHost: {address}\\r\\nConnection: close\\r\\n"
                    f"Authorization: Bearer {token}\\r\\n\\r\\n".encode())
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
    body = answer.partition(b"\\r\\n\\r\\n")[2]
    out.append([n % 2, json.loads(body)["node_id"]])
print(json.dumps(out))
"""


# ---------------------------------------------------------------------------- 9. deleting


def test_9_deleting_removes_what_it_owns(kube: Kube) -> None:
    kube.kubectl("delete", f"topic.laminarmq.io/{TOPIC}", "--timeout=120s")
    kube.kubectl("delete", "pod", CLIENT, "--timeout=120s")
    owned = ("statefulset/demo", "service/demo", "service/demo-peers", "configmap/demo-config",
             "secret/demo-secret", "poddisruptionbudget/demo", "networkpolicy/demo",
             "serviceaccount/demo-broker",
             "role/demo-broker", "rolebinding/demo-broker", "secret/demo-ca",
             "secret/demo-tls", "secret/demo-credentials")  # fmt: skip
    for what in owned:
        assert kube.exists(what), what
    kube.kubectl("delete", "laminarcluster/demo", "--timeout=180s")

    def collected() -> bool:
        return not any(kube.exists(what) for what in owned) and not pod_names(kube)

    wait_for("everything the cluster owned collected", collected)
    # the data outlives its cluster, as it outlives a scale-down (the StatefulSet's claims
    # have no owner: deleting a cluster must not delete its logs)
    claims = kube.get("pvc", "-l", "app.kubernetes.io/instance=demo")["items"]
    assert sorted(c["metadata"]["name"] for c in claims) == [f"data-demo-{i}" for i in range(5)]
    kube.kubectl("delete", "pvc", "-l", "app.kubernetes.io/instance=demo", "--timeout=120s")

    kube.helm("uninstall", RELEASE, "--namespace", OPERATOR_NAMESPACE, "--wait")

    def left() -> list[str]:
        names = kube.kubectl("get", "all,serviceaccounts,roles,rolebindings,configmaps,secrets",
                             "-n", OPERATOR_NAMESPACE, "-o", "name").split()  # fmt: skip
        return [n for n in names if not n.endswith(("/default", "/kube-root-ca.crt"))]

    wait_for("nothing of the release left (its pod collected)", lambda: not left())
    cluster_wide = kube.kubectl("get", "clusterroles,clusterrolebindings", "-o", "name")
    assert RELEASE not in cluster_wide, cluster_wide
    # Helm never deletes the CRDs of a chart's crds/ directory (their objects would go with
    # them): the one step left to the user, as docs/kubernetes.md says
    for crd in CRDS:
        assert kube.exists(crd)
    assert not kube.get("laminarclusters.laminarmq.io,topics.laminarmq.io", "-A")["items"]
    kube.kubectl("delete", *CRDS, "--timeout=120s")
    wait_for("the CRDs gone", lambda: not any(kube.exists(crd) for crd in CRDS))


def test_the_readme_shows_these_commands() -> None:
    """The README's Kubernetes section is what these tests do."""
    readme = (ROOT / "README.md").read_text()
    for command in ("helm install laminar-operator charts/laminar-operator",
                    "kubectl apply -f examples/cluster.yaml",
                    "kubectl apply -f examples/topic.yaml",
                    "kubectl scale laminarcluster/demo --replicas=5",
                    "python3 e2e/cluster.py up"):  # fmt: skip
        assert command in readme, command
