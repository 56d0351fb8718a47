"""Arrow rows -> record batches (docs/formats.md), column by column: the sink's encoder.

`encode_batch` takes a `Record` per row; at the 1120-byte rows of bench/spark_bench.py that
Python work held the sink near 40k rows/s (bench/RESULTS.md). Here each row's record header
is a numpy row of a (rows x 14 bytes) table, the headers are joined per row by Arrow's
kernels, and `binary_join_element_wise` lays header, key, value and headers of every row back
to back: the data buffer of its result is the records section itself. The bytes are copied
once on the way, and hashed once for the checksum. `encode_batch` stays the reference: for
the same rows and time, `encode_rows` gives the same bytes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from ..log.batch import (
    BATCH_HEADER,
    BATCH_MAGIC,
    BATCH_VERSION,
    CHECKSUM_OFFSET,
    HEADER_FIELD,
    MAX_HEADERS_PER_RECORD,
    RECORD_HEADER_BYTES,
    TRANSACTIONAL_ATTRIBUTE,
    header_checksum,
)
from .options import OptionError

#: A record's header (RECORD_HEADER), one numpy row per record.
RECORD_FIELDS = np.dtype(
    [("delta_ms", "<i4"), ("key_bytes", "<i4"), ("value_bytes", "<i4"), ("header_count", "<u2")]
)
#: A header's lengths (HEADER_FIELD), one numpy row per header.
HEADER_FIELDS = np.dtype([("name_bytes", "<u2"), ("value_bytes", "<u4")])
assert RECORD_FIELDS.itemsize == RECORD_HEADER_BYTES
assert HEADER_FIELDS.itemsize == HEADER_FIELD.size
NULL_LENGTH = -1
MAX_HEADER_VALUE_BYTES = 2**32 - 1
MAX_HEADER_NAME_BYTES = 2**16 - 1


class Rows(NamedTuple):
    """Rows to write to one partition: `values` binary, `keys` binary or None (no key
    column), `headers` list<struct<key: string, value: binary>> or None."""

    values: pa.Array
    keys: pa.Array | None = None
    headers: pa.Array | None = None

    def __len__(self) -> int:
        return len(self.values)

    def slice(self, offset: int, length: int) -> Rows:
        return Rows(*(None if c is None else c.slice(offset, length) for c in self))

    def take(self, indexes: np.ndarray) -> Rows:
        chosen = pa.array(indexes)
        return Rows(*(None if c is None else c.take(chosen) for c in self))


def binary(column: pa.Array, name: str) -> pa.Array:
    """`column` as binary (strings as their UTF-8 bytes, no copy); OptionError otherwise."""
    kind = column.type
    if pa.types.is_binary(kind):
        return column
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return column.cast(pa.binary())
    if pa.types.is_large_binary(kind):
        return column.cast(pa.binary())
    if pa.types.is_null(kind):
        return pa.nulls(len(column), pa.binary())
    raise OptionError(f"column {name} must be binary or string, not {kind}")


def lengths(column: pa.Array) -> np.ndarray:
    """Each row's length in bytes (int64), NULL_LENGTH for a null."""
    sizes = pc.binary_length(column).fill_null(NULL_LENGTH)
    return np.asarray(sizes, dtype=np.int64)


def _fixed(table: np.ndarray) -> pa.Array:
    """A numpy table of fixed-size rows as a binary array, one row each (no copy)."""
    width = table.dtype.itemsize
    offsets = np.arange(len(table) + 1, dtype=np.int32) * width
    return pa.Array.from_buffers(
        pa.binary(), len(table), [None, pa.py_buffer(offsets), pa.py_buffer(table)]
    )


def _joined(*columns: pa.Array) -> pa.Array:
    return pc.binary_join_element_wise(*columns, b"", null_handling="replace", null_replacement=b"")


def header_blobs(headers: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Each row's headers encoded as the records section lays them out, and their count."""
    counts = np.asarray(pc.list_value_length(headers).fill_null(0), dtype=np.int64)
    if counts.max(initial=0) > MAX_HEADERS_PER_RECORD:
        raise OptionError(f"a row may carry at most {MAX_HEADERS_PER_RECORD} headers")
    flat = headers.flatten()
    names = binary(flat.field("key"), "headers.key")
    if names.null_count:
        raise OptionError("a header's key may not be null")
    values = binary(flat.field("value"), "headers.value")
    fields = np.zeros(len(flat), HEADER_FIELDS)
    name_bytes, value_bytes = lengths(names), np.maximum(lengths(values), 0)
    if name_bytes.max(initial=0) > MAX_HEADER_NAME_BYTES:
        raise OptionError(f"a header's key may take {MAX_HEADER_NAME_BYTES} bytes at most")
    if value_bytes.max(initial=0) > MAX_HEADER_VALUE_BYTES:
        raise OptionError(f"a header's value may take {MAX_HEADER_VALUE_BYTES} bytes at most")
    fields["name_bytes"], fields["value_bytes"] = name_bytes, value_bytes
    each = _joined(_fixed(fields), names, values)
    offsets = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    per_row = pa.ListArray.from_arrays(pa.array(offsets), each)
    return pc.binary_join(per_row, b""), counts


def records_section(rows: Rows) -> tuple[pa.Array, np.ndarray]:
    """Each row as a record of the records section (`docs/formats.md`), and each record's
    size in bytes. Every record's timestamp delta is 0: the batch's first timestamp."""
    count = len(rows)
    table = np.zeros(count, RECORD_FIELDS)
    value_bytes = lengths(rows.values)
    table["value_bytes"] = value_bytes
    key_bytes = lengths(rows.keys) if rows.keys is not None else np.full(count, NULL_LENGTH)
    table["key_bytes"] = key_bytes
    columns = [_fixed(table)]
    if rows.keys is not None:
        columns.append(rows.keys)
    columns.append(rows.values)
    sizes = RECORD_HEADER_BYTES + np.maximum(key_bytes, 0) + np.maximum(value_bytes, 0)
    if rows.headers is not None and rows.headers.null_count < count:
        blobs, counts = header_blobs(rows.headers)
        table["header_count"] = counts
        columns.append(blobs)
        sizes += lengths(blobs)
    return _joined(*columns), sizes


def _data(joined: pa.Array) -> memoryview:
    """The bytes of a binary array's rows, back to back (no copy)."""
    offsets = np.frombuffer(
        joined.buffers()[1], dtype=np.int32, count=len(joined) + 1, offset=joined.offset * 4
    )
    data = joined.buffers()[2]
    return memoryview(data if data is not None else b"")[int(offsets[0]) : int(offsets[-1])]


def encode_rows(
    chunks: Sequence[Rows], *, producer_id: int, producer_seq: int, transactional: bool,
    now_ms: int | None = None,
) -> bytes:  # fmt: skip
    """The rows of `chunks`, in order, as one batch with base_index 0 and term 0, as
    `encode_batch` encodes `Record`s of the same keys, values and headers at `now_ms`."""
    stamp_ms = int(time.time() * 1000) if now_ms is None else now_ms
    pieces = [_data(records_section(chunk)[0]) for chunk in chunks if len(chunk)]
    count = sum(len(chunk) for chunk in chunks)
    if not count:
        raise ValueError("a batch needs at least one record")
    digest = xxhash.xxh3_64()
    for piece in pieces:
        digest.update(piece)
    payload_bytes = sum(len(piece) for piece in pieces)
    prefix = BATCH_HEADER.pack(
        BATCH_MAGIC, BATCH_VERSION, TRANSACTIONAL_ATTRIBUTE if transactional else 0, 0, 0,
        payload_bytes, count, producer_id, producer_seq, stamp_ms, stamp_ms, 0,
    )[:CHECKSUM_OFFSET]  # fmt: skip
    checksum = header_checksum(prefix, digest.intdigest())
    return b"".join([prefix, checksum.to_bytes(8, "little"), *pieces])


def row_sizes(rows: Rows) -> np.ndarray:
    """What each row takes in a records section, in bytes (headers counted roughly: their
    keys and values and 6 bytes each), to cut appends by size."""
    sizes: np.ndarray = RECORD_HEADER_BYTES + np.maximum(lengths(rows.values), 0)
    if rows.keys is not None:
        sizes += np.maximum(lengths(rows.keys), 0)
    if rows.headers is not None and rows.headers.null_count < len(rows):
        flat = rows.headers.flatten()
        each = HEADER_FIELD.size + np.maximum(lengths(binary(flat.field("key"), "headers.key")), 0)
        each += np.maximum(lengths(binary(flat.field("value"), "headers.value")), 0)
        counts = np.asarray(pc.list_value_length(rows.headers).fill_null(0), dtype=np.int64)
        ends = np.cumsum(counts)
        totals = np.concatenate([[0], np.cumsum(each)])
        sizes += totals[ends] - totals[ends - counts]
    return sizes
