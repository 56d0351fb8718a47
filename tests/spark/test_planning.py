"""The source's planning on the driver against a real cluster, without Spark: which partitions
subscribe, subscribePattern and assign read; where timestamps start and end them (the brokers'
offsets for times); and the stream's trigger limits (minOffsetsPerTrigger, maxTriggerDelay,
maxOffsetsPerTrigger) and data loss, as the engine calls `latestOffset`."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("pyspark", reason="pip install '.[spark]' for the Spark tests")

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from laminar.client import Client
from laminar.local_cluster import LocalCluster
from laminar.log.batch import Record
from laminar.spark.options import OptionError, Options
from laminar.spark.source import (
    DataLossError,
    StreamReader,
    bounds_of,
    ending_offsets,
    starting_offsets,
)

from ..integration.conftest import make_cluster

BASE_MS = 1_800_000_000_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = make_cluster(tmp_path_factory.mktemp("planning"))
    with Client(cluster.urls, token=cluster.token) as client:
        for name, partitions in (("plan-a", 2), ("plan-b", 1), ("other", 1)):
            client.create_topic(name, partitions=partitions, replication_factor=3)
            client.wait_for_leaders(name)
        # plan-a/0: records 1 s apart from BASE_MS; plan-a/1: one record, at BASE_MS + 50 s
        client.append(
            "plan-a", 0, [Record(b"%d" % i, timestamp_ms=BASE_MS + i * 1000) for i in range(20)]
        )
        client.append("plan-a", 1, [Record(b"late", timestamp_ms=BASE_MS + 50_000)])
    yield cluster
    cluster.stop()


def options(cluster: LocalCluster, *, stream: bool = False, **given: str) -> Options:
    raw = {"kafka.bootstrap.servers": ",".join(cluster.urls), "token": cluster.token}
    return Options.parse({**raw, **given}, stream=stream)


def index_of(cluster: LocalCluster, topic: str, partition: int, value: bytes) -> int:
    with Client(cluster.urls, token=cluster.token) as client:
        records = client.read(topic, partition, 0, max_records=1000).records
    return next(r.index for r in records if r.value == value)


def test_what_each_strategy_reads(cluster: LocalCluster) -> None:
    pattern = bounds_of(options(cluster, subscribePattern="plan-.*"))
    assert {t: sorted(p) for t, p in pattern.items()} == {"plan-a": ["0", "1"], "plan-b": ["0"]}
    assert bounds_of(options(cluster, subscribePattern="plan")) == {}  # the whole name matches
    assigned = bounds_of(options(cluster, assign='{"plan-a": [1], "other": [0]}'))
    assert {t: sorted(p) for t, p in assigned.items()} == {"plan-a": ["1"], "other": ["0"]}
    subscribed = bounds_of(options(cluster, subscribe="plan-b,other"))
    assert sorted(subscribed) == ["other", "plan-b"]
    with pytest.raises(OptionError, match=r"topic 'plan-a' has no partitions \[2\]"):
        bounds_of(options(cluster, assign='{"plan-a": [1, 2]}'))
    with pytest.raises(OptionError, match="topic 'nope' does not exist"):
        bounds_of(options(cluster, subscribe="nope"))
    # JSON offsets may only name what is read
    only_one = options(cluster, assign='{"plan-a": [1]}', startingOffsets='{"plan-a": {"0": 3}}')
    with pytest.raises(OptionError, match=r"not read: plan-a \['0'\]"):
        starting_offsets(only_one, bounds_of(only_one))


def test_timestamps_start_and_end_where_the_brokers_find_them(cluster: LocalCluster) -> None:
    at_5s = index_of(cluster, "plan-a", 0, b"5")
    at_12s = index_of(cluster, "plan-a", 0, b"12")
    late = index_of(cluster, "plan-a", 1, b"late")
    # every partition from 4.5 s: the first record at or after it
    every = options(cluster, subscribe="plan-a", startingTimestamp=str(BASE_MS + 4_500))
    bounds = bounds_of(every)
    assert starting_offsets(every, bounds) == {"plan-a": {"0": at_5s, "1": late}}
    # per partition; the one left out starts as startingOffsets says (earliest here)
    named = options(
        cluster,
        subscribe="plan-a",
        startingOffsetsByTimestamp=json.dumps({"plan-a": {"0": BASE_MS + 5_000}}),
        endingOffsetsByTimestamp=json.dumps({"plan-a": {"0": BASE_MS + 12_000, "1": BASE_MS}}),
    )
    start = starting_offsets(named, bounds)
    assert start == {"plan-a": {"0": at_5s, "1": bounds["plan-a"]["1"].log_start}}
    # the end is exclusive: the record at 12 s is not read; partition 1's record at 50 s is
    # the first at or after BASE_MS, so partition 1 ends before it
    assert ending_offsets(named, bounds) == {"plan-a": {"0": at_12s, "1": late}}
    # no record that late: the start fails (Kafka's default) or is the latest; an end is
    after = str(BASE_MS + 60_000)
    with pytest.raises(OptionError, match="has no record at or after timestamp"):
        starting_offsets(options(cluster, subscribe="plan-a", startingTimestamp=after), bounds)
    latest = options(
        cluster, subscribe="plan-a", startingTimestamp=after,
        startingOffsetsByTimestampStrategy="latest", endingTimestamp=after,
    )  # fmt: skip
    ends = {"plan-a": {p: b.end for p, b in bounds["plan-a"].items()}}
    assert starting_offsets(latest, bounds) == ends
    assert ending_offsets(latest, bounds) == ends


def produce(cluster: LocalCluster, topic: str, count: int) -> None:
    with Client(cluster.urls, token=cluster.token) as client:
        client.append(topic, 0, [Record(b"x")] * count)


def test_min_offsets_per_trigger_holds_a_batch_back_until_enough_wait_or_the_delay_passes(
    cluster: LocalCluster,
) -> None:
    with Client(cluster.urls, token=cluster.token) as client:
        client.create_topic("trickle", partitions=1, replication_factor=3)
        client.wait_for_leaders("trickle")
    reader = StreamReader(
        options(
            cluster, stream=True, subscribe="trickle", startingOffsets="earliest",
            minOffsetsPerTrigger="100", maxOffsetsPerTrigger="150", maxTriggerDelay="1h",
        )
    )  # fmt: skip
    assert reader.getDefaultReadLimit() == ReadMaxRows(150)
    start = reader.initialOffset()
    produce(cluster, "trickle", 10)
    first = reader.latestOffset(start, ReadMaxRows(150))  # the first batch is never held
    assert first != start
    produce(cluster, "trickle", 60)
    assert reader.latestOffset(first, ReadMaxRows(150)) == first  # 60 < 100: held back
    assert reader.latestOffset(first, ReadMinRows(100)) == first
    produce(cluster, "trickle", 200)  # 260 wait: let through, 150 of them
    second = reader.latestOffset(first, ReadMaxRows(150))
    assert second["trickle"]["0"] - first["trickle"]["0"] == 150
    # the engine's "everything" (Trigger.Once) ignores both limits
    everything = reader.latestOffset(second, ReadAllAvailable())
    assert everything["trickle"]["0"] - second["trickle"]["0"] == 110
    # maxTriggerDelay: a small batch goes once that long has passed since the last one (the
    # delay is long enough for the two calls right after the first to come before it)
    quick = StreamReader(
        options(
            cluster, stream=True, subscribe="trickle", minOffsetsPerTrigger="1000",
            maxTriggerDelay="10s",
        )
    )  # fmt: skip
    held = quick.latestOffset(everything, ReadMinRows(1000))  # the first: let through
    produce(cluster, "trickle", 5)
    assert quick.latestOffset(held, ReadMinRows(1000)) == held
    deadline = time.monotonic() + 60
    while (now := quick.latestOffset(held, ReadMinRows(1000))) == held:
        assert time.monotonic() < deadline, "maxTriggerDelay never let the batch through"
        time.sleep(0.1)
    assert now["trickle"]["0"] - held["trickle"]["0"] == 5


def test_a_deleted_topic_of_a_pattern_is_data_loss(cluster: LocalCluster) -> None:
    with Client(cluster.urls, token=cluster.token) as client:
        client.create_topic("fleeting-1", partitions=1, replication_factor=3)
        client.wait_for_leaders("fleeting-1")
    strict = StreamReader(options(cluster, stream=True, subscribePattern="fleeting-.*"))
    start = strict.initialOffset()
    assert list(start) == ["fleeting-1"]
    with Client(cluster.urls, token=cluster.token) as client:
        client.delete_topic("fleeting-1")
        client.create_topic("fleeting-2", partitions=1, replication_factor=3)
        client.wait_for_leaders("fleeting-2")
    deadline = time.monotonic() + 60
    for url in cluster.urls:  # every broker knows of both (any of them may be asked)
        with Client([url], token=cluster.token) as one:
            while {s.topic for s in one.partitions()} & {"fleeting-1", "fleeting-2"} != {
                "fleeting-2"
            }:
                assert time.monotonic() < deadline, f"{url} still shows the old topics"
                time.sleep(0.1)
    with pytest.raises(DataLossError, match=r"fleeting-1/0.*failOnDataLoss=false"):
        strict.latestOffset(start, ReadAllAvailable())
    lenient = StreamReader(
        options(cluster, stream=True, subscribePattern="fleeting-.*", failOnDataLoss="false")
    )
    # the new topic that matches is read from its start; the deleted one is left behind
    assert list(lenient.latestOffset(start, ReadAllAvailable())) == ["fleeting-2"]
