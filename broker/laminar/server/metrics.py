"""Prometheus metrics of one broker: per-partition gauges read at scrape time, latency
histograms and error counters updated by the API."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from .. import xdp
from ..raft.raft import Role
from ..swim.member import MemberStatus

if TYPE_CHECKING:
    from .node import Broker

log = logging.getLogger(__name__)

LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
)  # fmt: skip


class _BrokerCollector(Collector):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        broker = self.broker
        labels = ["topic", "partition"]
        role = GaugeMetricFamily(
            "laminar_partition_leader", "1 if this broker leads the partition", labels=labels
        )
        commit = GaugeMetricFamily(
            "laminar_partition_commit_index", "last committed index", labels=labels
        )
        end = GaugeMetricFamily("laminar_partition_log_end", "next index to write", labels=labels)
        start = GaugeMetricFamily(
            "laminar_partition_log_start", "first stored index", labels=labels
        )
        size = GaugeMetricFamily("laminar_partition_bytes", "bytes stored", labels=labels)
        term = GaugeMetricFamily("laminar_partition_term", "Raft term", labels=labels)
        inflight = GaugeMetricFamily(
            "laminar_partition_appends_in_flight", "appends awaiting commit", labels=labels
        )
        repairing = GaugeMetricFamily(
            "laminar_partition_repairing",
            "1 while the replica refetches records its log lost to damage on disk",
            labels=labels,
        )
        for replica in sorted(broker.core.replicas.values(), key=lambda r: r.group):
            values = [replica.topic, str(replica.partition)]
            role.add_metric(values, 1.0 if replica.raft.role is Role.LEADER else 0.0)
            commit.add_metric(values, replica.commit_index)
            end.add_metric(values, replica.log_end)
            start.add_metric(values, replica.log_start)
            size.add_metric(values, replica.log.size_bytes)
            term.add_metric(values, replica.raft.term)
            inflight.add_metric(values, len(replica.pending))
            repairing.add_metric(values, 1.0 if replica.repairing else 0.0)
        yield from (role, commit, end, start, size, term, inflight, repairing)
        yield from _group_metrics(broker)
        members = GaugeMetricFamily(
            "laminar_swim_members", "members by SWIM state", labels=["state"]
        )
        counts = dict.fromkeys(MemberStatus, 0)
        for status, _, _ in broker.members().values():
            counts[status] += 1
        for status, count in counts.items():
            members.add_metric([status.name.lower()], count)
        yield members
        meta = GaugeMetricFamily(
            "laminar_metadata_leader", "1 if this broker leads the metadata group"
        )
        meta.add_metric([], 1.0 if broker.core.metadata_leader == broker.id else 0.0)
        yield meta
        for prefix, name, help_text in (
            ("raft", "elections", "Raft elections this broker started"),
            ("raft", "leader_changes", "Raft leader changes this broker observed"),
            ("raft", "leader_rebalances", "leaderships handed back to preferred leaders"),
            ("raft", "quiesce_wakes", "quiesced Raft groups this broker woke"),
            ("raft", "fsyncs", "log fdatasync calls"),
            ("raft", "ready_rounds", "Raft Ready rounds persisted"),
            ("raft", "dropped_messages", "Raft messages dropped (unknown group or peer)"),
            ("raft", "bad_status_reports", "peers' partition status reports ignored (malformed)"),
            ("storage", "corrupt_batches", "damaged batches found on disk by reads (never served)"),
            ("storage", "repairs", "replicas cut at damage and refetched from their leader"),
            ("storage", "data_loss_repairs", "damaged only voters: the records after are lost"),
            ("storage", "quarantined_replicas", "replicas of topics never known here, set aside"),
        ):
            counter = CounterMetricFamily(f"laminar_{prefix}_{name}", help_text)
            counter.add_metric([], broker.core.counters[name])
            yield counter
        malformed = CounterMetricFamily(
            "laminar_malformed_records",
            "records of malformed batches (a valid checksum, broken framing; stored before "
            "appends checked records) skipped, by what met them: read (answered 422), acquire "
            "(settled unseen for a group), dead_letter (moved without the record); each once",
            labels=["path"],
        )
        for path, count in broker.core.malformed_records.items():
            malformed.add_metric([path], count)
        yield malformed
        for name, value in broker.timers.items():
            counter = CounterMetricFamily(f"laminar_raft_{name}", f"time in Ready {name}")
            counter.add_metric([], value)
            yield counter
        if broker.swim is not None and broker.swim.running:
            dropped = CounterMetricFamily(
                "laminar_swim_dropped_datagrams",
                "gossip datagrams dropped in user space, by reason (foreign, forged, late ...)",
                labels=["reason"],
            )
            for reason, count in sorted(broker.swim.core.dropped.items()):
                dropped.add_metric([reason], count)
            yield dropped
        if broker.config.worker == 0:  # (the pod's interface: once per broker)
            yield from _xdp_metrics(broker)
        stats = broker.transport.stats
        for key in sorted(stats):
            counter = CounterMetricFamily(f"laminar_peer_{key}", f"peer transport {key}")
            counter.add_metric([], stats[key])
            yield counter
        yield from _tls_metrics(broker)


class BrokerMetrics:
    def __init__(self, broker: Broker) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_BrokerCollector(broker))
        self.append_latency = Histogram(
            "laminar_append_latency_seconds",
            "append request to commit",
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.read_latency = Histogram(
            "laminar_read_latency_seconds",
            "read request handling (including long-poll waits)",
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.appended_records = Counter(
            "laminar_appended_records", "records appended (committed)", registry=self.registry
        )
        self.request_errors = Counter(
            "laminar_request_errors",
            "API error responses by HTTP status and error code",
            ["status", "code"],
            registry=self.registry,
        )

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def openmetrics(self) -> str:
        """The same, as OpenMetrics text: what a worker sends worker 0 (`merge_workers`)."""
        text: bytes = generate_openmetrics(self.registry)  # type: ignore[no-untyped-call]
        return text.decode()


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def merge_workers(texts: dict[int, str]) -> tuple[bytes, str]:
    """One exposition of a broker's workers' metrics (OpenMetrics texts by worker index, as
    `BrokerMetrics.openmetrics` makes them): every sample labelled with its `worker`, each
    family once. Worker 0's /metrics serves it (docs/workers.md)."""
    families: dict[str, Metric] = {}
    for worker, text in sorted(texts.items()):
        for family in text_string_to_metric_families(text):  # type: ignore[no-untyped-call]
            merged = families.setdefault(
                family.name, Metric(family.name, family.documentation, family.type, family.unit)
            )
            label = str(worker)
            merged.samples += [
                s._replace(labels={**s.labels, "worker": label}) for s in family.samples
            ]
    registry = CollectorRegistry()
    registry.register(_Families(list(families.values())))
    return generate_latest(registry), CONTENT_TYPE_LATEST


def _tls_metrics(broker: Broker) -> Iterator[Metric]:
    """The certificate in use (alert well before it expires) and its reloads (with TLS)."""
    tls = broker.tls
    if tls is None:
        return
    expiry = GaugeMetricFamily(
        "laminar_tls_certificate_expiry_timestamp_seconds",
        "when the certificate in use expires (Unix time)",
    )
    expiry.add_metric([], tls.not_after)
    reloads = CounterMetricFamily(
        "laminar_tls_reloads", "new certificate, key and CA files loaded since start"
    )
    reloads.add_metric([], tls.reloads)
    failing = GaugeMetricFamily(
        "laminar_tls_reload_failing",
        "1 while the newest TLS files do not load (the previous ones stay in use)",
    )
    failing.add_metric([], 1.0 if tls.error else 0.0)
    yield from (expiry, reloads, failing)


_xdp_warned: set[str] = set()


def _xdp_metrics(broker: Broker) -> Iterator[Metric]:
    """The XDP router's counters (laminar-xdp's pinned map), when it is loaded here."""
    pin_dir = broker.config.xdp_pin_dir
    try:
        counted = xdp.stats(pin_dir)
    except xdp.XdpError as e:
        if str(pin_dir) not in _xdp_warned:
            _xdp_warned.add(str(pin_dir))
            log.warning("the XDP router's counters in %s are not exported: %s", pin_dir, e)
        return
    help_texts = {
        "packets": "packets the XDP router saw, by class",
        "bytes": "bytes the XDP router saw, by class",
        "drops": "packets the XDP router dropped (foreign gossip), by class",
    }
    for field, help_text in help_texts.items():
        family = CounterMetricFamily(f"laminar_xdp_{field}", help_text, labels=["class"])
        for name, values in counted.items():
            family.add_metric([name], values[field])
        yield family


def _group_metrics(broker: Broker) -> Iterator[Metric]:
    """Consumer groups of the partitions this broker leads (the leader's applied state)."""
    labels = ["topic", "partition", "group"]
    families = {
        name: GaugeMetricFamily(f"laminar_group_{name}", text, labels=labels)
        for name, text in (
            ("pending", "messages not handed out (or free again)"),
            ("acquired", "messages held under a lease"),
            ("dead_letter_pending", "dead letters waiting for their append"),
            ("accepted", "messages accepted (total)"),
            ("dead_lettered", "messages moved to the dead-letter topic (total)"),
        )
    }
    for replica in sorted(broker.core.replicas.values(), key=lambda r: r.group):
        if replica.groups is None or replica.raft.role is not Role.LEADER:
            continue
        for group in sorted(replica.groups.state.groups):
            described = replica.groups.state.describe(group)
            values = [replica.topic, str(replica.partition), group]
            for name, family in families.items():
                family.add_metric(values, described[name])
    yield from families.values()
