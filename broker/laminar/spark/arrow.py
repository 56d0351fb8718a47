"""Stored record batches -> Arrow columns of the Spark source's schema, without a Python object
per record where the records allow it.

Records of one batch that share their key and value lengths and carry no headers (the usual
case: fixed-size values, no key or fixed-size keys) are sliced out with numpy as one
(records x stride) matrix, and the values (and keys) of such batches are copied once, into
one buffer per Arrow batch; any other batch goes through the record walker
(`laminar.log.batch.iter_records`). Every batch used is checksum-verified, once. A compressed
batch (zstd, lz4) is verified and decompressed first (`decompressed_batch`), then read as any
other (the walker's path verifies the decompressed form again).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from ..log.batch import (
    BATCH_HEADER_BYTES,
    RECORD_HEADER,
    RECORD_HEADER_BYTES,
    BatchHeader,
    decompressed_batch,
    iter_records,
    parse_header,
    split_batches,
    verify_batch,
)

#: Spark's schema of the source: the Kafka connector's columns in its order (`headers` with
#: includeHeaders), then `index`, Laminar's name of `offset` (the same values).
SCHEMA_DDL = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int"
)
HEADERS_DDL = "headers array<struct<key:string,value:binary>>"
INDEX_DDL = "index long"
HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
#: Kafka's timestampType of a record whose timestamp its producer set (CreateTime): every
#: Laminar record's (the producer's clock, or the time it encoded the batch).
CREATE_TIME = 0
MAX_BATCH_BYTES = BATCH_HEADER_BYTES + 2**32 - 1


def schema_ddl(include_headers: bool) -> str:
    """The source's schema as Spark DDL."""
    return ", ".join([SCHEMA_DDL, *([HEADERS_DDL] if include_headers else []), INDEX_DDL])


def arrow_schema(include_headers: bool) -> pa.Schema:
    fields = [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", TIMESTAMP_TYPE),
        ("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(("headers", HEADER_TYPE))
    fields.append(("index", pa.int64()))
    return pa.schema(fields)


class _Fixed(NamedTuple):
    """Bytes `start:start + length` of every row of `rows`, a (records x stride) byte matrix
    of one uniform batch; length -1: every value is null."""

    rows: np.ndarray
    start: int
    length: int


def _gather(run: list[_Fixed]) -> pa.Array:
    """The pieces of one length as one binary array: their bytes copied once, into one buffer."""
    rows = sum(piece.rows.shape[0] for piece in run)
    length = run[0].length
    if length < 0:
        return pa.nulls(rows, pa.binary())
    data = np.empty((rows, length), dtype=np.uint8)
    at = 0
    for piece in run:
        count = piece.rows.shape[0]
        data[at : at + count] = piece.rows[:, piece.start : piece.start + length]
        at += count
    offsets = np.arange(rows + 1, dtype=np.int32) * length
    return pa.Array.from_buffers(
        pa.binary(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def _binary_column(pieces: list[_Fixed | pa.Array]) -> pa.Array:
    """The pieces in order as one binary array. Runs of uniform pieces of one length are
    gathered into one buffer; only a mix of lengths or walked batches is concatenated."""
    arrays: list[pa.Array] = []
    run: list[_Fixed] = []
    for piece in pieces:
        if isinstance(piece, _Fixed) and (not run or run[0].length == piece.length):
            run.append(piece)
            continue
        if run:
            arrays.append(_gather(run))
            run = []
        if isinstance(piece, _Fixed):
            run.append(piece)
        else:
            arrays.append(piece)
    if run:
        arrays.append(_gather(run))
    return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)


@functools.cache
def _record_fields(stride: int) -> np.dtype:
    """The record header's fields (RECORD_HEADER) of records `stride` bytes apart."""
    return np.dtype(
        {
            "names": ["delta_ms", "key_bytes", "value_bytes", "header_count"],
            "formats": ["<i4", "<i4", "<i4", "<u2"],
            "offsets": [0, 4, 8, 12],
            "itemsize": stride,
        }
    )


def _uniform(batch: memoryview, header: BatchHeader) -> tuple[np.ndarray, np.ndarray] | None:
    """The records as a (count x stride) byte matrix and their header fields when they all
    have the first record's key and value lengths and no headers; None otherwise."""
    _, key_bytes, value_bytes, _ = RECORD_HEADER.unpack_from(batch, BATCH_HEADER_BYTES)
    stride = RECORD_HEADER_BYTES + max(key_bytes, 0) + max(value_bytes, 0)
    if stride * header.record_count != header.payload_bytes:
        return None
    fields = np.frombuffer(
        batch, _record_fields(stride), header.record_count, offset=BATCH_HEADER_BYTES
    )
    if (
        (fields["key_bytes"] != key_bytes).any()
        or (fields["value_bytes"] != value_bytes).any()
        or fields["header_count"].any()
    ):
        return None
    payload = np.frombuffer(batch, dtype=np.uint8, offset=BATCH_HEADER_BYTES)
    return payload.reshape(header.record_count, stride), fields


class ColumnBuilder:
    """Arrow columns for the rows of one topic partition, batch by batch."""

    def __init__(self, topic: str, partition: int, include_headers: bool) -> None:
        self.topic = topic
        self.partition = partition
        self.include_headers = include_headers
        self.keys: list[_Fixed | pa.Array] = []
        self.values: list[_Fixed | pa.Array] = []
        self.indexes: list[np.ndarray] = []
        self.timestamps_ms: list[np.ndarray] = []
        self.headers: list[pa.Array] = []
        self.rows = 0

    def add(self, body: bytes | bytearray | memoryview, low: int, high: int) -> int:
        """Add the records of `body` (whole batches back to back) with low <= index < high;
        return the index after the last batch looked at (control batches included)."""
        after = low
        for batch in split_batches(body):
            header = parse_header(batch)
            if header.base_index >= high:
                break
            after = max(after, header.next_index)
            if header.is_control or header.next_index <= low:
                continue
            first = max(low - header.base_index, 0)
            last = min(high - header.base_index, header.record_count)
            verified = header.is_compressed
            if verified:  # decompressed once, verified; then as if it had come uncompressed
                batch = memoryview(decompressed_batch(batch))
                header = parse_header(batch)
            uniform = _uniform(batch, header)
            if uniform is not None:
                if not verified:
                    verify_batch(batch, MAX_BATCH_BYTES)  # (the walker verifies by itself)
                self._add_uniform(header, uniform, first, last)
            else:
                self._add_walked(batch, header, first, last)
        return after

    def _add_uniform(
        self, header: BatchHeader, uniform: tuple[np.ndarray, np.ndarray], first: int, last: int
    ) -> None:
        matrix, fields = uniform
        key_bytes, value_bytes = int(fields["key_bytes"][0]), int(fields["value_bytes"][0])
        rows = matrix[first:last]
        key_start = RECORD_HEADER_BYTES
        self.keys.append(_Fixed(rows, key_start, key_bytes))
        self.values.append(_Fixed(rows, key_start + max(key_bytes, 0), value_bytes))
        deltas = fields["delta_ms"][first:last]
        self.timestamps_ms.append(deltas.astype(np.int64) + header.first_timestamp_ms)
        count = last - first
        self.indexes.append(np.arange(count, dtype=np.int64) + header.base_index + first)
        if self.include_headers:
            self.headers.append(
                pa.ListArray.from_arrays(
                    pa.array(np.zeros(count + 1, dtype=np.int32)),
                    pa.array([], type=HEADER_TYPE.value_type),
                )
            )
        self.rows += count

    def _add_walked(self, batch: memoryview, header: BatchHeader, first: int, last: int) -> None:
        records = list(iter_records(batch))[first:last]
        self.keys.append(pa.array([r[2] for r in records], type=pa.binary()))
        self.values.append(pa.array([r[3] for r in records], type=pa.binary()))
        self.timestamps_ms.append(np.array([r[1] for r in records], dtype=np.int64))
        self.indexes.append(np.array([r[0] for r in records], dtype=np.int64))
        if self.include_headers:
            self.headers.append(
                pa.array(
                    [[{"key": k, "value": v} for k, v in r[4]] for r in records],
                    type=HEADER_TYPE,
                )
            )
        self.rows += len(records)

    def take(self) -> pa.RecordBatch | None:
        """The rows added since the last take, as one record batch (None if there are none)."""
        if not self.rows:
            return None
        rows = self.rows
        topic = self.topic.encode()
        topics = pa.Array.from_buffers(
            pa.string(),
            rows,
            [None, pa.py_buffer(np.arange(rows + 1, dtype=np.int32) * len(topic)),
             pa.py_buffer(topic * rows)],
        )  # fmt: skip
        micros = np.concatenate(self.timestamps_ms) * 1000
        offsets = pa.array(np.concatenate(self.indexes))
        columns = [
            _binary_column(self.keys),
            _binary_column(self.values),
            topics,
            pa.array(np.full(rows, self.partition, dtype=np.int32)),
            offsets,
            pa.array(micros, type=TIMESTAMP_TYPE),
            pa.array(np.full(rows, CREATE_TIME, dtype=np.int32)),
        ]
        if self.include_headers:
            columns.append(pa.concat_arrays(self.headers))
        columns.append(offsets)  # index
        batch = pa.RecordBatch.from_arrays(columns, schema=arrow_schema(self.include_headers))
        self.keys, self.values, self.indexes, self.timestamps_ms, self.headers = [], [], [], [], []
        self.rows = 0
        return batch
