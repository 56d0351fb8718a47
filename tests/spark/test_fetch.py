"""The Spark source's reads (`laminar.spark.fetch`) against a real cluster, without Spark: the
plain path receives into reused buffers exactly what the general client reads, and anything it
does not handle goes to the general client, which raises its usual errors."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("pyarrow", reason="the Spark source needs pyarrow (pip install '.[spark]')")

from laminar.client import Client
from laminar.client.errors import NotFound, Unauthorized
from laminar.local_cluster import LocalCluster
from laminar.log.batch import Record
from laminar.spark.fetch import Fetcher
from laminar.spark.options import Options, Range
from laminar.spark.source import bounds_of, read_range

from ..integration.conftest import make_cluster

RECORDS = 3000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = make_cluster(tmp_path_factory.mktemp("fetch"))
    with Client(cluster.urls, token=cluster.token) as client:
        client.create_topic("reads", partitions=2, replication_factor=3)
        client.wait_for_leaders("reads")
        for start in range(0, RECORDS, 500):
            batch = [
                Record(value=b"r%05d" % i, key=b"k%d" % (i % 3)) for i in range(start, start + 500)
            ]
            client.append("reads", 0, batch)
    yield cluster
    cluster.stop()


def test_the_plain_path_reads_what_the_general_client_reads(cluster: LocalCluster) -> None:
    with (
        Client(cluster.urls, token=cluster.token) as client,
        Fetcher(client, "reads", 0, token=cluster.token, ca_file=None, wait_ms=0) as fetcher,
    ):
        at, seen = 0, 0
        while at < RECORDS:
            answer = fetcher.submit(at, 700, 20_000).result()
            general = client.read_batches("reads", 0, at, max_records=700, max_bytes=20_000)
            assert answer.buffer is not None  # received by the plain path, into a buffer
            assert bytes(answer.read.body) == general.body
            assert answer.read[1:] == general[1:]  # next, commit index, log start
            fetcher.release(answer)
            assert answer.read.next_index is not None and answer.read.next_index > at
            at = answer.read.next_index
            seen += 1
        assert seen > 3  # several reads, so buffers were given back and used again


def test_read_range_gives_every_record_of_the_range(cluster: LocalCluster) -> None:
    raw = {"brokers": ",".join(cluster.urls), "topic": "reads", "token": cluster.token}
    options = Options.parse(raw, stream=False)
    bounds = bounds_of(options)["reads"]["0"]
    every = list(read_range(options, Range("reads", 0, bounds.log_start, bounds.end)))
    assert sum(b.num_rows for b in every) == RECORDS
    first = every[0].column("offset")[0].as_py()  # (after the leader's first entries)
    batches = list(read_range(options, Range("reads", 0, first + 250, first + 2750)))
    offsets = [o for b in batches for o in b.column("offset").to_pylist()]
    assert offsets == list(range(first + 250, first + 2750))
    values = [v for b in batches for v in b.column("value").to_pylist()]
    assert values == [b"r%05d" % i for i in range(250, 2750)]


def test_other_answers_are_the_general_clients(cluster: LocalCluster) -> None:
    # no partition 5: the plain path has nowhere to go; the general client says why
    with (
        Client(cluster.urls, token=cluster.token) as client,
        Fetcher(client, "reads", 5, token=cluster.token, ca_file=None, wait_ms=0) as gone,
        pytest.raises(NotFound),
    ):
        gone.submit(0, 10, 1000).result()
    stranger = "lmq_not-a-token"
    with (
        Client(cluster.urls, token=stranger) as client,
        Fetcher(client, "reads", 0, token=stranger, ca_file=None, wait_ms=0) as refused,
        pytest.raises(Unauthorized),
    ):
        refused.submit(0, 10, 1000).result()
