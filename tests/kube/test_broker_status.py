"""Brokers report partition leadership and membership into Topic and LaminarCluster status
themselves (no operator running), with the broker ServiceAccount the operator makes (status
patch, topic list) and nothing more."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from laminar.client import AsyncClient
from laminar.local_cluster import LocalCluster
from laminar_operator import manifests

from ..integration.conftest import make_cluster
from .conftest import ROOT, KubeApi
from .test_operator import wait_for


@pytest.fixture(scope="module")
def reporting(
    crds: KubeApi, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LocalCluster, str]]:
    namespace = "broker-status"
    crds.kubectl("create", "namespace", namespace)
    cluster = yaml.safe_load((ROOT / "examples" / "cluster.yaml").read_text())
    cluster["metadata"]["namespace"] = namespace
    crds.apply(cluster)
    obj = crds.get("laminarcluster/demo", "-n", namespace)
    crds.apply([manifests.service_account(obj), manifests.role(obj), manifests.role_binding(obj)])
    token = crds.kubectl("create", "token", "demo-broker", "-n", namespace).stdout.strip()
    config = crds.kubeconfig_for("broker", token, namespace)
    args = ("--kube-namespace", namespace, "--kube-cluster", "demo", "--kube-config", str(config))
    brokers = make_cluster(tmp_path_factory.mktemp("reporting"), extra_args=args)
    yield brokers, namespace
    brokers.stop()


def test_the_broker_account_may_only_touch_status(
    crds: KubeApi, reporting: tuple[LocalCluster, str]
) -> None:
    _, namespace = reporting
    token = crds.kubectl("create", "token", "demo-broker", "-n", namespace).stdout.strip()
    config = crds.kubeconfig_for("broker-check", token, namespace)

    def can(*args: str) -> str:
        return crds.kubectl(
            "auth", "can-i", *args, "-n", namespace, kubeconfig=config, check=False
        ).stdout.strip()

    assert can("patch", "topics.laminarmq.io", "--subresource=status") == "yes"
    assert can("patch", "laminarclusters.laminarmq.io", "--subresource=status") == "yes"
    assert can("patch", "topics.laminarmq.io") == "no"
    assert can("delete", "laminarclusters.laminarmq.io") == "no"
    assert can("get", "secrets") == "no"
    assert can("get", "laminarclusters.laminarmq.io", "--subresource=status") == "no"


def test_status_follows_leadership(crds: KubeApi, reporting: tuple[LocalCluster, str]) -> None:
    brokers, namespace = reporting

    async def create() -> Any:
        async with AsyncClient(brokers.urls, token=brokers.token) as client:
            await client.create_topic("payments", partitions=4, replication_factor=3)
            return await client.wait_for_leaders("payments")

    described = asyncio.run(create())
    crds.apply(
        {
            "apiVersion": "laminarmq.io/v1alpha1",
            "kind": "Topic",
            "metadata": {"name": "payments", "namespace": namespace},
            "spec": {"cluster": "demo", "partitions": 4},
        }
    )

    def topic() -> dict[str, Any]:
        found: dict[str, Any] = crds.get("topic.laminarmq.io/payments", "-n", namespace)
        return found

    def led() -> dict[str, Any] | None:
        status = topic().get("status") or {}
        parts = status.get("partitions") or []
        return status if len(parts) == 4 and all(p["leader"] for p in parts) else None

    status = wait_for("leaders reported", led)
    shown = crds.get("topic.laminarmq.io/payments", "-n", namespace, "--show-managed-fields")
    writers = {
        entry["manager"]
        for entry in shown["metadata"]["managedFields"]
        if "f:partitions" in (entry.get("fieldsV1") or {}).get("f:status", {})
    }
    assert writers == {"laminar-broker"}, shown["metadata"]["managedFields"]
    for entry, state in zip(status["partitions"], described.partition_states, strict=True):
        assert sorted(entry["replicas"]) == sorted(state.replicas)
        assert entry["leader"] in state.replicas

    cluster_status = wait_for(
        "members reported",
        lambda: (
            (s := crds.get("laminarcluster/demo", "-n", namespace).get("status") or {}).get(
                "members"
            )
            and s.get("leaders") == 4
            and s
        ),
    )
    assert sorted(m["name"] for m in cluster_status["members"]) == sorted(brokers.nodes)
    assert sum(m["leaders"] for m in cluster_status["members"]) == 4
    assert cluster_status["reportedAt"]

    # nothing changes: nothing is patched
    settled = wait_for(
        "in-sync sets complete", lambda: (s := led()) and s["underReplicated"] == 0 and s
    )
    version = topic()["metadata"]["resourceVersion"]
    time.sleep(3.5)  # more than three report rounds
    assert topic()["metadata"]["resourceVersion"] == version
    assert (topic().get("status") or {})["partitions"] == settled["partitions"]

    # another writer (the operator, with its answer to creating the topic, before leaders were
    # elected) overwrites the status: the reporting broker puts it right
    leaderless = [{**p, "leader": ""} for p in settled["partitions"]]
    crds.kubectl(
        "patch", "topic.laminarmq.io/payments", "-n", namespace, "--subresource=status",
        "--type=merge", "-p", json.dumps({"status": {"partitions": leaderless}}),
    )  # fmt: skip
    assert wait_for("leaders reported again", led)["partitions"] == settled["partitions"]

    killed = settled["partitions"][0]["leader"]
    brokers.kill(killed)
    try:

        def new_leader() -> dict[str, Any] | None:
            s = led()
            first = s["partitions"][0] if s else None
            return first if first and first["leader"] != killed else None

        moved = wait_for("a new leader reported", new_leader)
        assert moved["leader"] in described.partition_states[0].replicas
    finally:
        brokers.start_node(killed)
        brokers.wait_ready()


def test_a_new_broker_is_rebalanced_onto_and_reported(
    crds: KubeApi, reporting: tuple[LocalCluster, str]
) -> None:
    brokers, namespace = reporting

    def reported() -> dict[str, Any]:
        found: dict[str, Any] = crds.get("laminarcluster/demo", "-n", namespace)
        return found.get("status") or {}

    settled = wait_for(
        "a converged placement reported", lambda: reported().get("rebalancingPartitions") == 0
    )
    assert settled
    added = brokers.add_node()
    seen: list[int] = []

    def rebalanced() -> dict[str, Any] | None:
        status = reported()
        seen.append(int(status.get("rebalancingPartitions", -1)))
        members = {m["name"]: m for m in status.get("members") or []}
        joined = members.get(added.id)
        # moved, and caught up: a replica promoted to voter may lag the leader a moment (an
        # under-replicated partition, truly) before the next report shows it in sync
        done = joined and joined["replicas"] > 0 and seen[-1] == 0
        return status if done and status.get("underReplicated") == 0 else None

    status = wait_for("partitions moved onto the new broker", rebalanced, timeout_s=120)
    assert len(status["members"]) == len(brokers.nodes)
