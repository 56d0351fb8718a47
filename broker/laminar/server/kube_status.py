"""Partition leadership and membership reported into Kubernetes status (docs/kubernetes.md).

Run by every broker started with --kube-namespace and --kube-cluster; only the one leading
the metadata group (`__cluster`) reports, so there is one writer. Every REPORT_INTERVAL_S it
lists the namespace's Topic objects of its cluster and merge-patches the status of each whose
partitions (leader, replicas, in-sync set, commit index) changed since its last patch, and the
LaminarCluster's members and counts likewise (with `rebalancingPartitions`, the partitions
not yet where placement wants them, from which the operator derives Rebalancing): nothing is
patched when nothing changed, except the cluster's `reportedAt` heartbeat every HEARTBEAT_S
(the operator reads status from the brokers itself while it is stale). The ServiceAccount
needs get/patch on the two status subresources and list on topics, nothing more. Kubernetes
errors are logged (rate-limited) and retried at the next round; they never disturb the broker.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from typing import TYPE_CHECKING, Any

from ..kube import Credentials, KubeClient, KubeError, topic_status
from ..partition.status_table import misplaced_partitions
from .http import ApiError

if TYPE_CHECKING:
    from .api import Api

log = logging.getLogger(__name__)

API_VERSION = "laminarmq.io/v1alpha1"
REPORT_INTERVAL_S = 1.0
FIELD_MANAGER = "laminar-broker"  # the brokers' writes, in the objects' managedFields
HEARTBEAT_S = 30.0
WARN_INTERVAL_S = 60.0


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeStatusReporter:
    def __init__(self, api: Api, namespace: str, cluster: str, kube_config: str | None) -> None:
        self.api = api
        self.namespace = namespace
        self.cluster = cluster
        self.kube = KubeClient(Credentials.from_path(kube_config), field_manager=FIELD_MANAGER)
        self._members: dict[str, Any] | None = None
        self._heartbeat = 0.0
        self._warned = 0.0

    async def run(self) -> None:
        try:
            while True:
                await asyncio.sleep(REPORT_INTERVAL_S)
                broker = self.api.broker
                if broker.core.metadata_leader != broker.id:
                    self._members = None
                    continue
                try:
                    await self.report()
                except (KubeError, OSError, TimeoutError) as e:
                    self._warn(f"reporting status to Kubernetes failed: {e}")
                except Exception:  # a bug here must not stop the broker or its reports
                    log.exception("reporting status to Kubernetes failed")
        finally:
            await self.kube.close()

    async def report(self) -> None:
        broker = self.api.broker
        objects = await self.kube.list(API_VERSION, "Topic", self.namespace)
        view = self.api.cluster_view()  # one view for the whole round
        leaders, under, partitions = dict.fromkeys(broker.members(), 0), 0, 0
        for obj in objects:
            name = obj["metadata"]["name"]
            if (obj.get("spec") or {}).get("cluster") != self.cluster:
                continue
            if name not in broker.core.state.topics or obj["metadata"].get("deletionTimestamp"):
                continue
            try:
                described = await self.api.describe(name, view)
            except ApiError:
                continue  # deleted meanwhile
            status = topic_status(described)
            partitions += status["partitionCount"]
            under += status["underReplicated"]
            for p in status["partitions"]:
                if p["leader"] in leaders:
                    leaders[p["leader"]] += 1
            # against what the object shows now, not what this broker last wrote: the operator
            # writes the status too (the answer to creating the topic, maybe before leaders)
            shown = obj.get("status") or {}
            if any(shown.get(key) != value for key, value in status.items()):
                await self.kube.patch_status(API_VERSION, "Topic", self.namespace, name, status)
        hosted = {node: len(items) for node, items in view.items()}
        members = {
            "members": [
                {
                    "name": node,
                    "state": state.name.lower(),
                    "weight": broker.core.state.weight(node),
                    "leaders": leaders.get(node, 0),
                    "replicas": hosted.get(node, 0),
                }
                for node, (state, _, _) in sorted(broker.members().items())
            ],
            "leaders": sum(leaders.values()),
            "partitions": partitions,
            "underReplicated": under,
            "rebalancingPartitions": misplaced_partitions(
                view, broker.core.state.topics, broker.core.candidates()
            ),
        }
        now = time.monotonic()
        if members != self._members or now - self._heartbeat >= HEARTBEAT_S:
            await self.kube.patch_status(
                API_VERSION, "LaminarCluster", self.namespace, self.cluster,
                {**members, "reportedAt": _now()},
            )  # fmt: skip
            self._members = members
            self._heartbeat = now

    def _warn(self, message: str) -> None:
        now = time.monotonic()
        if now - self._warned >= WARN_INTERVAL_S:
            self._warned = now
            log.warning("%s", message)
