"""The console's live numbers from the brokers' own metrics: what one scrape of a broker's
/metrics holds (`parse_metrics`), and the cluster's rates and latency percentiles between two
scrapes (`rates_between`).

Publish and consume rates are the sums over brokers and topics of
`laminar_topic_records_in_total` and `laminar_topic_records_out_total` (a broker that does not
export them yet: `laminar_appended_records_total` for publishing, nothing for consuming);
latencies are the `laminar_append_latency_seconds` and `laminar_read_latency_seconds`
histograms, whose buckets are summed over brokers and differenced between the scrapes, then
interpolated as Prometheus's `histogram_quantile` does. A counter that went down (its broker
restarted) counts from zero.

Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

RECORDS_IN = "laminar_topic_records_in_total"
RECORDS_OUT = "laminar_topic_records_out_total"
#: what an older broker exports instead of RECORDS_IN
APPENDED = "laminar_appended_records_total"
APPEND_BUCKET = "laminar_append_latency_seconds_bucket"
READ_BUCKET = "laminar_read_latency_seconds_bucket"
XDP_PACKETS = "laminar_xdp_packets_total"
XDP_DROPS = "laminar_xdp_drops_total"
QUANTILES = (0.5, 0.99)

Buckets = dict[float, float]  # upper bound (s) -> cumulative count


@dataclass(frozen=True)
class Snapshot:
    """What one broker's /metrics said."""

    records_in: float | None = None
    records_out: float | None = None
    append_buckets: Buckets = field(default_factory=dict)
    read_buckets: Buckets = field(default_factory=dict)
    #: the XDP router's packets and drops (None: no router loaded on that broker)
    xdp_packets: float | None = None
    xdp_drops: float | None = None


def parse_metrics(text: str) -> Snapshot:
    """The numbers the console uses from a broker's Prometheus text (ValueError if it is not
    Prometheus text). Samples are summed over their labels (topics, workers)."""
    sums: dict[str, float] = {}
    buckets: dict[str, Buckets] = {APPEND_BUCKET: {}, READ_BUCKET: {}}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, value = sample.name, float(sample.value)
            if name in buckets:
                bound = float(sample.labels.get("le", "nan"))
                if not math.isnan(bound):
                    table = buckets[name]
                    table[bound] = table.get(bound, 0.0) + value
            elif name in (RECORDS_IN, RECORDS_OUT, APPENDED, XDP_PACKETS, XDP_DROPS):
                sums[name] = sums.get(name, 0.0) + value
    return Snapshot(
        records_in=sums.get(RECORDS_IN, sums.get(APPENDED)),
        records_out=sums.get(RECORDS_OUT),
        append_buckets=buckets[APPEND_BUCKET],
        read_buckets=buckets[READ_BUCKET],
        xdp_packets=sums.get(XDP_PACKETS),
        xdp_drops=sums.get(XDP_DROPS),
    )


def counter_increase(before: float | None, after: float | None) -> float | None:
    """How much a counter grew between two scrapes (from zero, if it was reset)."""
    if before is None or after is None:
        return None
    return after - before if after >= before else after


def buckets_increase(before: Buckets, after: Buckets) -> Buckets:
    """How much each bucket grew (all from zero if any went down: a reset histogram)."""
    if any(after.get(bound, 0.0) < count for bound, count in before.items()):
        return dict(after)
    return {bound: count - before.get(bound, 0.0) for bound, count in after.items()}


def quantile(q: float, buckets: Buckets) -> float | None:
    """The q-quantile of a histogram's cumulative buckets, interpolated linearly within its
    bucket (None without observations; the highest finite bound if it falls in +Inf's)."""
    bounds = sorted(buckets)
    if not bounds or not math.isinf(bounds[-1]):
        return None
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


@dataclass(frozen=True)
class Rates:
    """The cluster between two scrapes."""

    interval_s: float
    #: brokers scraped both times (the rates cover these)
    brokers: int
    publish_per_s: float | None
    consume_per_s: float | None
    #: latency percentiles in milliseconds, by name (`append_p50_ms` ...), None: no request
    latency_ms: dict[str, float | None]

    def to_json(self) -> dict[str, Any]:
        return {
            "interval_s": round(self.interval_s, 3),
            "brokers": self.brokers,
            "publish_per_s": self.publish_per_s,
            "consume_per_s": self.consume_per_s,
            **self.latency_ms,
        }


def _sum(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def rates_between(
    before: Mapping[str, Snapshot], after: Mapping[str, Snapshot], interval_s: float
) -> Rates:
    """The rates and percentiles between two scrapes (node -> snapshot), `interval_s` apart,
    over the brokers present in both."""
    nodes = sorted(set(before) & set(after))
    span = max(interval_s, 1e-9)
    published = _sum([counter_increase(before[n].records_in, after[n].records_in) for n in nodes])
    consumed = _sum([counter_increase(before[n].records_out, after[n].records_out) for n in nodes])
    latency: dict[str, float | None] = {}
    histograms = {
        "append": [(before[n].append_buckets, after[n].append_buckets) for n in nodes],
        "read": [(before[n].read_buckets, after[n].read_buckets) for n in nodes],
    }
    for name, pairs in histograms.items():
        summed: Buckets = {}
        for earlier, later in pairs:
            for bound, count in buckets_increase(earlier, later).items():
                summed[bound] = summed.get(bound, 0.0) + count
        for q in QUANTILES:
            value = quantile(q, summed)
            latency[f"{name}_p{round(q * 100)}_ms"] = None if value is None else value * 1000
    return Rates(
        interval_s=interval_s,
        brokers=len(nodes),
        publish_per_s=None if published is None else published / span,
        consume_per_s=None if consumed is None else consumed / span,
        latency_ms=latency,
    )
