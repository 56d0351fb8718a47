"""Stored batches -> Arrow columns: the numpy fast path and the record walker give the rows
`iter_records` gives, cut to the range asked for, control batches skipped."""

from __future__ import annotations

import pytest

pytest.importorskip("pyarrow", reason="the Spark source needs pyarrow (pip install '.[spark]')")

from laminar.log.batch import (
    BATCH_HEADER_BYTES,
    Record,
    encode_batch,
    iter_records,
    payload_hash,
    split_batches,
    stamp_header,
)
from laminar.spark.arrow import ColumnBuilder


def stored(records: list[Record], base: int, *, control: bool = False) -> bytes:
    """A batch as the log stores it: base index and term stamped."""
    batch = encode_batch(records, now_ms=1_700_000_000_000, control=control)
    digest = payload_hash(memoryview(batch)[BATCH_HEADER_BYTES:])
    return stamp_header(batch, base, 1, digest) + batch[BATCH_HEADER_BYTES:]


UNIFORM = [Record(value=b"v%04d" % i, key=b"k%02d" % (i % 7)) for i in range(50)]
NO_KEYS = [Record(value=b"x" * 32) for _ in range(20)]
MIXED = [
    Record(value=b"y" * i, key=None if i % 3 else b"key", headers=(("h", b"%d" % i),) * (i % 2))
    for i in range(30)
]
TOMBSTONES = [Record(value=None, key=b"gone") for _ in range(5)]


def body() -> bytes:
    return (
        stored(UNIFORM, 10)
        + stored(NO_KEYS, 60)
        + stored([Record(value=b"")], 80, control=True)
        + stored(MIXED, 81)
        + stored(TOMBSTONES, 111)
        + stored(UNIFORM, 116)  # two of one shape: gathered into one buffer
        + stored(UNIFORM, 166)
    )


def expected(low: int, high: int) -> list[tuple[object, ...]]:
    rows = []
    for batch in split_batches(body()):
        if batch[6] & 1:  # the control attribute
            continue
        for index, ts_ms, key, value, headers in iter_records(batch):
            if low <= index < high:
                heads = [{"key": k, "value": v} for k, v in headers]
                rows.append((key, value, "orders", 4, index, ts_ms, heads))
    return rows


@pytest.mark.parametrize(
    ("low", "high"),
    [(0, 300), (10, 116), (35, 95), (80, 81), (112, 113), (100, 190), (140, 141), (170, 216)],
)
def test_columns_equal_the_walked_records(low: int, high: int) -> None:
    builder = ColumnBuilder("orders", 4, include_headers=True)
    after = builder.add(body(), low, high)
    assert after >= min(high, 216)
    batch = builder.take()
    want = expected(low, high)
    if not want:
        assert batch is None
        return
    assert batch is not None
    got = batch.to_pydict()
    rows = list(
        zip(
            got["key"], got["value"], got["topic"], got["partition"], got["index"],
            [int(t.timestamp() * 1000) for t in got["timestamp"]], got["headers"],
            strict=True,
        )
    )  # fmt: skip
    assert rows == want
    # Kafka's columns in Kafka's order, then Laminar's name of the offset
    assert batch.schema.names == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType",
        "headers", "index",
    ]  # fmt: skip
    assert got["offset"] == got["index"]
    assert set(got["timestampType"]) == {0}  # CreateTime: the producer's
    assert builder.take() is None  # taken


def test_rows_added_in_several_reads_come_out_in_order() -> None:
    builder = ColumnBuilder("orders", 4, include_headers=False)
    for low, high in ((0, 60), (60, 81), (81, 130), (130, 216)):
        builder.add(body(), low, high)
    batch = builder.take()
    assert batch is not None
    assert batch.column("index").to_pylist() == [row[4] for row in expected(0, 216)]
    assert batch.column("value").to_pylist() == [row[1] for row in expected(0, 216)]


def test_a_damaged_batch_is_refused() -> None:
    damaged = bytearray(stored(UNIFORM, 0))
    damaged[-1] ^= 0xFF
    with pytest.raises(Exception, match="checksum"):
        ColumnBuilder("t", 0, False).add(bytes(damaged), 0, 100)
