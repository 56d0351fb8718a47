"""A Topic custom object <-> a Laminar topic: pure functions, no I/O.

The Laminar topic has the object's name. `wanted` turns the spec (camelCase) into what the
admin API takes; `status_of` turns a topic description into the Topic's status: the first
MAX_LISTED_PARTITIONS partitions one by one, and `summarized: true` when there are more
(`underReplicated` counts them all), so that status stays small whatever the partition count.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from laminar.client.models import TopicDescription

#: Topic status lists at most this many partitions one by one (the CRD's maxItems).
MAX_LISTED_PARTITIONS = 256
#: A Topic's spec.config keys -> the broker's topic config keys.
CONFIG_KEYS = {
    "retentionBytes": "retention_bytes",
    "retentionMs": "retention_ms",
    "segmentBytes": "segment_bytes",
    "segmentMs": "segment_ms",
    "maxDeliveries": "max_deliveries",
}


@dataclass(frozen=True)
class Wanted:
    partitions: int
    replication_factor: int
    config: dict[str, Any]


def wanted(spec: Mapping[str, Any], cluster_spec: Mapping[str, Any]) -> Wanted:
    """What the broker should have for this Topic; unset settings take the cluster's."""
    defaults = cluster_spec.get("config") or {}
    config = {
        broker_key: value
        for source in (defaults, spec.get("config") or {})
        for key, value in source.items()
        if (broker_key := CONFIG_KEYS.get(key)) is not None
    }
    rf = spec.get("replicationFactor") or defaults.get("replicationFactor") or 3
    return Wanted(int(spec.get("partitions", 1)), int(rf), config)


def changes(want: Wanted, have: TopicDescription) -> dict[str, Any]:
    """The alter call that brings `have` to `want` ({} when nothing differs)."""
    out: dict[str, Any] = {}
    if want.partitions > have.partitions:
        out["partitions"] = want.partitions
    differing = {k: v for k, v in want.config.items() if have.config.get(k) != v}
    if differing:
        out["config"] = differing
    return out


def status_of(description: TopicDescription) -> dict[str, Any]:
    states = sorted(description.partition_states, key=lambda p: p.partition)
    rf = description.replication_factor
    under = sum(1 for p in states if len(p.in_sync) < rf)
    status: dict[str, Any] = {
        "underReplicated": under,
        "summarized": len(states) > MAX_LISTED_PARTITIONS,
        "partitions": [
            {
                "partition": p.partition,
                "leader": p.leader or "",
                "replicas": list(p.replicas),
                "inSync": list(p.in_sync),
                "commitIndex": p.commit_index,
            }
            for p in states[:MAX_LISTED_PARTITIONS]
        ],
    }
    return status
