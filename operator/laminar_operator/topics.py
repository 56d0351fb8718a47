"""A Topic custom object <-> a Laminar topic: pure functions, no I/O.

The Laminar topic has the object's name. `wanted` turns the spec (camelCase) into what the
admin API takes, `changes` what to alter. (A Topic's status is `laminar.kube.topic_status`,
shared with the brokers, which report it.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from laminar.client.models import TopicDescription

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


def mismatch(spec: Mapping[str, Any], want: Wanted, have: TopicDescription) -> str:
    """What the brokers' topic has that the spec cannot change ("" when none): a topic
    adopted from the brokers with another replication factor (when the spec sets one), or
    with more partitions than the spec asks (partitions never shrink)."""
    found = []
    if spec.get("replicationFactor") and have.replication_factor != want.replication_factor:
        found.append(
            f"the brokers' topic has replication factor {have.replication_factor}, the spec "
            f"asks {want.replication_factor} (a replication factor never changes: set the "
            f"spec to {have.replication_factor}, or recreate the topic)"
        )
    if have.partitions > want.partitions:
        found.append(
            f"the brokers' topic has {have.partitions} partitions, the spec asks "
            f"{want.partitions} (partitions never shrink: set the spec to {have.partitions})"
        )
    return "; ".join(found)
