"""The sink's appends (`laminar.spark.sink`, what each task runs) against a real cluster,
without Spark: rows go to their `partition`, else where their key hashes, else (keyless) to
one partition per append in turn; the same rows always land in the same places; one append
the broker refuses as too large is cut in halves; and wrong rows are refused by name."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("pyarrow", reason="the Spark sink needs pyarrow (pip install '.[spark]')")

import pyarrow as pa

from laminar.client import Client
from laminar.client.partitioner import partition_for
from laminar.local_cluster import LocalCluster
from laminar.log.batch import BATCH_HEADER_BYTES, RECORD_HEADER_BYTES
from laminar.spark.arrow import HEADER_TYPE
from laminar.spark.options import OptionError, Options
from laminar.spark.sink import BYTES_PER_APPEND, Written, _Appender, _end, _write

from ..integration.conftest import make_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = make_cluster(tmp_path_factory.mktemp("sink"))
    yield cluster
    cluster.stop()


_topics = itertools.count()


def topic(cluster: LocalCluster, partitions: int, **config: object) -> str:
    name = f"sunk-{next(_topics)}"
    with Client(cluster.urls, token=cluster.token) as client:
        client.create_topic(name, partitions=partitions, replication_factor=3, config=config)
        client.wait_for_leaders(name)
    return name


def options(cluster: LocalCluster, name: str | None) -> Options:
    raw = {"brokers": ",".join(cluster.urls), "token": cluster.token}
    return Options.parse({**raw, **({"topic": name} if name else {})}, stream=False, sink=True)


def write(cluster: LocalCluster, name: str | None, batches: list[pa.RecordBatch],
          txn_id: str, first_partition: int = 0) -> Written:  # fmt: skip
    """What a task and the driver's commit do: append in the task's transaction, commit."""
    opts = options(cluster, name)
    written = _write(opts, iter(batches), txn_id, tag=None, expiry_ms=60_000,
                     first_partition=first_partition)  # fmt: skip
    _end(opts, [written], commit=True, tag=None)
    return written


def contents(
    cluster: LocalCluster, name: str, expected: int
) -> dict[int, list[tuple[bytes | None, bytes]]]:
    """(key, value) of every committed record, per partition, in order, once all `expected`
    are seen (a replica that answers may learn of the commit a moment after the leader)."""
    deadline = time.monotonic() + 30
    with Client(cluster.urls, token=cluster.token) as client:
        while True:
            out: dict[int, list[tuple[bytes | None, bytes]]] = {}
            for state in client.describe_topic(name).partition_states:
                records, index = [], state.log_start
                for _ in range(1000):  # bounded
                    read = client.read(name, state.partition, index, max_records=10_000)
                    records += [(r.key, r.value or b"") for r in read.records]
                    if read.next_index <= index or read.next_index > read.commit_index:
                        break
                    index = read.next_index
                out[state.partition] = records
            if sum(map(len, out.values())) >= expected or time.monotonic() > deadline:
                return out
            time.sleep(0.2)


def test_rows_go_to_their_partition_their_keys_or_in_turn(cluster: LocalCluster) -> None:
    name = topic(cluster, 3)
    keyed = [(b"key-%d" % i, b"keyed-%d" % i) for i in range(200)]
    placed = [(None, b"placed-%d" % i, i % 3) for i in range(30)]
    first = pa.record_batch(
        {"key": pa.array([k for k, _ in keyed], pa.binary()),
         "value": pa.array([v for _, v in keyed], pa.binary())}
    )  # fmt: skip
    second = pa.record_batch(
        {"value": pa.array([v.decode() for _, v, _ in placed]),  # strings: their UTF-8 bytes
         "partition": pa.array([p for _, _, p in placed], pa.int32()),
         "headers": pa.array([[{"key": "n", "value": b"%d" % i}] for i in range(30)], HEADER_TYPE)}
    )  # fmt: skip
    written = write(cluster, name, [first, second], "spark-test-routes")
    assert (written.records, written.duplicates) == (230, 0)
    got = contents(cluster, name, 230)
    for key, value in keyed:
        assert (key, value) in got[partition_for(key, 3)]
    for _, value, partition in placed:
        assert (None, value) in got[partition]
    assert sum(map(len, got.values())) == 230


def test_keyless_rows_fill_one_partition_per_append_the_same_way_every_time(
    cluster: LocalCluster,
) -> None:
    per_append = BYTES_PER_APPEND // (RECORD_HEADER_BYTES + 1120)  # rows of 1120 bytes
    rows = [b"%05d" % i * 224 for i in range(per_append + 300)]
    batches = [pa.record_batch({"value": pa.array(rows[i : i + 1000], pa.binary())})
               for i in range(0, len(rows), 1000)]  # fmt: skip
    twice = [topic(cluster, 3), topic(cluster, 3)]
    for at, name in enumerate(twice):
        write(cluster, name, batches, f"spark-test-sticky-{at}", first_partition=1)
    first, second = (contents(cluster, name, len(rows)) for name in twice)
    assert first == second  # the same rows, in the same order: the same places
    # partition 1 first (the task's), a full append; the rest to the next one
    assert [len(first[p]) for p in range(3)] == [0, per_append, 300]
    assert [v for p in (1, 2) for _, v in first[p]] == rows


def test_an_append_the_broker_refuses_as_too_large_is_cut_in_halves(
    cluster: LocalCluster,
) -> None:
    """The appender keeps appends below the topic's batch limit when the topic's config
    names it; here it is made to think the limit higher, as with a broker's own default."""
    name = topic(cluster, 1, max_batch_bytes=64 * 1024)
    rows = [b"%04d" % i * 100 for i in range(300)]  # 400 bytes each: 120 KB in all
    with Client(cluster.urls, token=cluster.token) as client:
        appender = _Appender(options(cluster, name), client, "spark-test-halves", 60_000)
        appender._partition_count(name)
        assert appender.limits[name] == 64 * 1024 - BATCH_HEADER_BYTES  # from the config
        appender.limits[name] = 1 << 20  # too high: the broker refuses the first append
        appender.add_batch(pa.record_batch({"value": pa.array(rows, pa.binary())}))
        written = appender.finish()
    _end(options(cluster, name), [written], commit=True, tag=None)
    assert written.records == 300
    assert [v for _, v in contents(cluster, name, 300)[0]] == rows


@pytest.mark.parametrize(
    ("columns", "name", "message"),
    [
        ({"value": pa.array([b"v"]), "partition": pa.array([3])}, "of-two", "row partition 3"),
        ({"value": pa.array([b"v"]), "partition": pa.array([-1])}, "of-two", "row partition -1"),
        ({"value": pa.array([b"v"]), "partition": pa.array(["0"])}, "of-two", "an integer"),
        ({"value": pa.array([1])}, "of-two", "column value must be binary or string, not int64"),
        ({"key": pa.array([b"k"])}, "of-two", "needs a value column"),
        ({"value": pa.array([b"v"]), "topic": pa.array([None], pa.string())}, None, "no topic"),
    ],
)
def test_wrong_rows_are_refused_by_name(
    cluster: LocalCluster, columns: dict[str, pa.Array], name: str | None, message: str
) -> None:
    if name is not None:
        name = f"{name}-{next(_topics)}"
        with Client(cluster.urls, token=cluster.token) as client:
            client.create_topic(name, partitions=2, replication_factor=3)
    with pytest.raises(OptionError) as caught:
        write(cluster, name, [pa.record_batch(columns)], f"spark-test-wrong-{next(_topics)}")
    assert message in str(caught.value)
