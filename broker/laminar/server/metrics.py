"""Prometheus metrics of one broker: per-partition gauges read at scrape time, latency
histograms and counters updated by the API, and prometheus_client's process and Python
collectors. docs/metrics.md lists every family; tests/integration/test_metrics.py holds the
two to each other."""

from __future__ import annotations

import dataclasses
import logging
import os
import platform
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from .. import __version__, xdp
from ..models.topics import is_under_replicated
from ..partition.status_table import leaders as view_leaders
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
        yield from _replication_metrics(broker)
        yield from _offline_metrics(broker)
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
        away = GaugeMetricFamily(
            "laminar_placement_away_seconds",
            "brokers SWIM reports dead or left (or has not heard from, though the metadata "
            "group has them: dead), by how long ago this broker saw them go, and "
            "whether placement keeps their replicas where they are (replicas=kept: one that "
            "left, until it is back or drained; a dead one for --dead-grace-ms) or replaces "
            "them (replicas=replaced)",
            labels=["broker", "state", "replicas"],
        )
        for node, (status, away_ms, kept) in broker.core.away().items():
            replicas = "kept" if kept else "replaced"
            away.add_metric([node, status.name.lower(), replicas], away_ms / 1000)
        yield away
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
            ("placement", "control_passes", "placement control passes this broker ran"),
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
        if broker.config.worker == 0:  # (the workers share the data directory's disk)
            yield from _data_dir_metrics(broker)
        info = GaugeMetricFamily(
            "laminar_build_info", "1, labelled with the broker's version", labels=BUILD_LABELS
        )
        info.add_metric([__version__, platform.python_version()], 1.0)
        yield info


BUILD_LABELS = ["version", "python"]
#: the methods `laminar_http_requests_total` names; any other is counted as "other" (a
#: client chooses the method: the label's values must stay few)
HTTP_METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"))
#: `laminar_http_requests_total`'s route for a request that matched none of the API's
UNMATCHED_ROUTE = "unmatched"


@dataclasses.dataclass(slots=True)
class TopicTraffic:
    """What one topic's appends and reads through this broker's API amounted to (totals)."""

    records_in: int = 0
    bytes_in: int = 0
    records_out: int = 0
    bytes_out: int = 0
    reads: int = 0


class _TrafficCollector(Collector):
    """The API's per-topic and per-route counters (plain integers, which cost the request
    paths less than prometheus_client's labelled counters)."""

    def __init__(self, metrics: BrokerMetrics, broker: Broker) -> None:
        self.metrics = metrics
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        topics = self.metrics.topics
        for name in [t for t in topics if t not in self.broker.core.state.topics]:
            del topics[name]  # deleted: its series end (a new topic of the name starts at 0)
        families = {
            field: CounterMetricFamily(f"laminar_topic_{field}", text, labels=["topic"])
            for field, text in (
                ("records_in", "records appended to the topic through this broker (committed)"),
                ("bytes_in", "request body bytes of those appends (JSON or binary)"),
                ("records_out", "records this broker served to reads of the topic"),
                ("bytes_out", "response body bytes of those reads (JSON or binary)"),
            )
        }
        reads = CounterMetricFamily(
            "laminar_read_requests",
            "record reads of the topic this broker answered (200)",
            labels=["topic"],
        )
        for name, traffic in sorted(topics.items()):
            for field, family in families.items():
                family.add_metric([name], getattr(traffic, field))
            reads.add_metric([name], traffic.reads)
        yield from families.values()
        yield reads
        requests = CounterMetricFamily(
            "laminar_http_requests",
            "HTTP requests answered, by route template (`unmatched`: none), method and status",
            labels=["route", "method", "status"],
        )
        for (route, method, status), count in sorted(self.metrics.http_requests.items()):
            requests.add_metric([route, method, str(status)], count)
        yield requests
        yield CounterMetricFamily(
            "laminar_http_connections_refused",
            "API connections refused over their client address's cap "
            "(--max-connections-per-client; plain HTTP: answered 429, TLS: closed at accept)",
            value=self.metrics.connections_refused(),
        )


class BrokerMetrics:
    def __init__(self, broker: Broker) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_BrokerCollector(broker))
        #: per topic: appends and reads through the API (`appended`, `served`)
        self.topics: dict[str, TopicTraffic] = {}
        #: (route template, method, status) -> requests answered (`count_request`)
        self.http_requests: dict[tuple[str, str, int], int] = {}
        #: the API server's count of connections refused over the per-address cap (set when
        #: the server is made: `laminar.server.app.serve`)
        self.connections_refused: Callable[[], int] = lambda: 0
        self.registry.register(_TrafficCollector(self, broker))
        # prometheus_client's defaults (process_*, python_info, python_gc_*), in this
        # broker's registry: each worker is a process of its own
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
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

    def count_request(self, route: str | None, method: str, status: int) -> None:
        """One HTTP request answered `status`; `route`: the matched route's template (None:
        no route matched)."""
        key = (
            route or UNMATCHED_ROUTE,
            method if method in HTTP_METHODS else "other",
            status,
        )
        self.http_requests[key] = self.http_requests.get(key, 0) + 1

    def appended(self, topic: str, records: int, size_bytes: int) -> None:
        """An append to `topic` committed (and acknowledged): `records` records, sent as
        `size_bytes` bytes of request body (a stream's: the message)."""
        self.appended_records.inc(records)
        traffic = self.topics.get(topic) or self.topics.setdefault(topic, TopicTraffic())
        traffic.records_in += records
        traffic.bytes_in += size_bytes

    def served(self, topic: str, records: int, size_bytes: int) -> None:
        """A read of `topic` answered with `records` records in `size_bytes` bytes of body."""
        traffic = self.topics.get(topic) or self.topics.setdefault(topic, TopicTraffic())
        traffic.reads += 1
        traffic.records_out += records
        traffic.bytes_out += size_bytes

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
    families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
        name: GaugeMetricFamily(f"laminar_group_{name}", text, labels=labels)
        for name, text in (
            ("pending", "messages not handed out (or free again)"),
            ("acquired", "messages held under a lease"),
            ("dead_letter_pending", "dead letters waiting for their append"),
        )
    }
    for name, text in (
        ("accepted", "messages accepted"),
        ("dead_lettered", "messages moved to the dead-letter topic"),
    ):
        families[name] = CounterMetricFamily(f"laminar_group_{name}", text, labels=labels)
    lag = GaugeMetricFamily(
        "laminar_group_lag",
        "committed records from the group's cursor on not yet accepted or dead-lettered",
        labels=labels,
    )
    for replica in sorted(broker.core.replicas.values(), key=lambda r: r.group):
        if replica.groups is None or replica.raft.role is not Role.LEADER:
            continue
        for group in sorted(replica.groups.state.groups):
            described = replica.groups.state.describe(group)
            values = [replica.topic, str(replica.partition), group]
            for name, family in families.items():
                family.add_metric(values, described[name])
            # (pending: the records from the cursor on that are neither finished, held nor
            # waiting for their dead-letter append)
            unfinished = (
                described["pending"] + described["acquired"] + described["dead_letter_pending"]
            )
            lag.add_metric(values, unfinished)
    yield from families.values()
    yield lag


def _replication_metrics(broker: Broker) -> Iterator[Metric]:
    """The partitions this broker leads: their voters, and how many are in sync (the
    notion of the API's `in_sync`, by the same function: `NodeCore.in_sync`)."""
    labels = ["topic", "partition"]
    replicas = GaugeMetricFamily(
        "laminar_partition_replicas",
        "voters in the partition's configuration (leader)",
        labels=labels,
    )
    in_sync = GaugeMetricFamily(
        "laminar_partition_in_sync_replicas",
        "voters alive and within the catch-up lag of the leader's log, itself included (leader)",
        labels=labels,
    )
    under = GaugeMetricFamily(
        "laminar_partition_under_replicated",
        "1 when fewer voters are in sync than the topic's replication factor (leader)",
        labels=labels,
    )
    alive = broker.core.alive()
    topics = broker.core.state.topics
    for replica in sorted(broker.core.replicas.values(), key=lambda r: r.group):
        raft = replica.raft
        if raft.role is not Role.LEADER:
            continue
        values = [replica.topic, str(replica.partition)]
        voters = len(raft.conf.voters)
        synced = broker.core.in_sync(raft, alive)
        topic = topics.get(replica.topic)
        # against the topic's replication factor: a replica set shrunk below it counts too
        rf = topic.replication_factor if topic is not None else voters
        replicas.add_metric(values, voters)
        in_sync.add_metric(values, len(synced))
        under.add_metric(values, 1.0 if is_under_replicated(synced, rf) else 0.0)
    yield from (replicas, in_sync, under)


def _offline_metrics(broker: Broker) -> Iterator[Metric]:
    """On the metadata leader only: per topic, the partitions that no alive broker reports
    leading in the partition status table (the table the API routes by)."""
    if broker.core.metadata_leader != broker.id:
        return
    offline = GaugeMetricFamily(
        "laminar_offline_partitions",
        "partitions of the topic without a leader in the cluster's status table (metadata leader)",
        labels=["topic"],
    )
    led = view_leaders(broker.status.view())
    for name, topic in sorted(broker.core.state.topics.items()):
        count = sum(1 for p in range(topic.partitions) if f"{name}/{p}" not in led)
        offline.add_metric([name], count)
    yield offline


def _data_dir_metrics(broker: Broker) -> Iterator[Metric]:
    """The data directory's file system: its size, and the bytes left to the broker."""
    try:
        stat = os.statvfs(broker.config.data_dir)
    except OSError as e:  # (gone under a running broker: its logs fail louder elsewhere)
        log.warning("the data directory's file system is not measured: %s", e)
        return
    capacity = GaugeMetricFamily(
        "laminar_data_dir_capacity_bytes", "size of the data directory's file system"
    )
    capacity.add_metric([], stat.f_blocks * stat.f_frsize)
    free = GaugeMetricFamily(
        "laminar_data_dir_free_bytes",
        "bytes of the data directory's file system that the broker may still use",
    )
    free.add_metric([], stat.f_bavail * stat.f_frsize)
    yield from (capacity, free)
