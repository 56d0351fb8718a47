"""The charts' numbers (laminar.server.console.rates): what a scrape of /metrics holds, the
rates and percentiles between two scrapes, counter resets, and the record browser's way of
showing bytes."""

from __future__ import annotations

import math

import pytest

from laminar.server.console.rates import (
    Snapshot,
    buckets_increase,
    parse_metrics,
    quantile,
    rates_between,
)
from laminar.server.console.routes import SHOWN_BYTES, shown

INF = math.inf


def metrics(records_in: int, appends: tuple[int, int, int], *, new_names: bool = True) -> str:
    """A broker's exposition: `appends` observations at <= 1 ms, <= 10 ms, above."""
    fast, medium, slow = appends
    counters = (
        f"# TYPE laminar_topic_records_in_total counter\n"
        f'laminar_topic_records_in_total{{topic="a"}} {records_in - 1}\n'
        f'laminar_topic_records_in_total{{topic="b"}} 1\n'
        f"# TYPE laminar_topic_records_out_total counter\n"
        f'laminar_topic_records_out_total{{topic="a"}} {2 * records_in}\n'
        if new_names
        else ""
    )
    return (
        counters + "# TYPE laminar_appended_records_total counter\n"
        f"laminar_appended_records_total {records_in}\n"
        "# TYPE laminar_append_latency_seconds histogram\n"
        f'laminar_append_latency_seconds_bucket{{le="0.001"}} {fast}\n'
        f'laminar_append_latency_seconds_bucket{{le="0.01"}} {fast + medium}\n'
        f'laminar_append_latency_seconds_bucket{{le="+Inf"}} {fast + medium + slow}\n'
        f"laminar_append_latency_seconds_count {fast + medium + slow}\n"
        "laminar_append_latency_seconds_sum 1.0\n"
    )


def test_a_scrape_sums_topics_and_reads_the_buckets() -> None:
    snapshot = parse_metrics(metrics(10, (1, 2, 3)))
    assert snapshot.records_in == 10 and snapshot.records_out == 20
    assert snapshot.append_buckets == {0.001: 1, 0.01: 3, INF: 6}
    assert snapshot.read_buckets == {} and snapshot.xdp_packets is None
    older = parse_metrics(metrics(7, (0, 0, 0), new_names=False))
    assert older.records_in == 7 and older.records_out is None  # (the older counter)
    with pytest.raises(ValueError):
        parse_metrics("this is { not prometheus")


def test_quantiles_interpolate_within_their_bucket() -> None:
    buckets = {0.001: 50.0, 0.01: 100.0, INF: 100.0}
    assert quantile(0.5, buckets) == pytest.approx(0.001)
    assert quantile(0.75, buckets) == pytest.approx(0.0055)
    assert quantile(0.25, buckets) == pytest.approx(0.0005)
    assert quantile(0.99, {0.001: 0.0, 0.01: 0.0, INF: 4.0}) == 0.01  # (in +Inf: its bound)
    assert quantile(0.5, {0.001: 0.0, INF: 0.0}) is None
    assert quantile(0.5, {}) is None


def test_rates_between_two_scrapes_of_every_broker() -> None:
    before = {"n1": parse_metrics(metrics(100, (10, 0, 0))), "n2": Snapshot(records_in=50)}
    after = {
        "n1": parse_metrics(metrics(160, (10, 100, 0))),
        "n2": Snapshot(records_in=90),
        "n3": Snapshot(records_in=1000),  # (new: not in the first scrape)
    }
    rates = rates_between(before, after, 2.0)
    assert rates.brokers == 2
    assert rates.publish_per_s == pytest.approx((60 + 40) / 2)
    assert rates.consume_per_s == pytest.approx(120 / 2)
    # the interval's 100 appends were all between 1 and 10 ms
    assert 1.0 < rates.latency_ms["append_p50_ms"] < rates.latency_ms["append_p99_ms"] <= 10.0
    assert rates.latency_ms["read_p50_ms"] is None
    assert set(rates.to_json()) >= {"publish_per_s", "consume_per_s", "append_p99_ms"}


def test_a_restarted_broker_counts_from_zero() -> None:
    before = {"n1": parse_metrics(metrics(1000, (0, 50, 0)))}
    after = {"n1": parse_metrics(metrics(30, (4, 0, 0)))}
    rates = rates_between(before, after, 1.0)
    assert rates.publish_per_s == 30
    assert rates.latency_ms["append_p99_ms"] == pytest.approx(0.99)
    assert buckets_increase({1.0: 5, INF: 5}, {1.0: 7, INF: 9}) == {1.0: 2, INF: 4}


def test_bytes_are_shown_as_text_or_hex() -> None:
    assert shown(None).kind == "none"
    assert (shown(b"caf\xc3\xa9\tok").kind, shown(b"caf\xc3\xa9\tok").text) == ("text", "café\tok")
    assert (shown(b"\x00\xff").kind, shown(b"\x00\xff").text) == ("hex", "00 ff")
    assert shown(b"bell\x07").kind == "hex"  # (valid UTF-8, not printable)
    long = "é" * SHOWN_BYTES  # (2 bytes each: the cut falls inside a character, or not)
    for data in (long.encode(), b"x" + long.encode()):
        seen = shown(data)
        assert seen.kind == "text" and seen.cut and seen.length == len(data)
        assert data.startswith(seen.text.encode()) and seen.shown_bytes >= SHOWN_BYTES - 3
    assert shown(b"\xff" * (SHOWN_BYTES + 5)).shown_bytes == SHOWN_BYTES
