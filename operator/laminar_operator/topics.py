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
