"""The Spark source's columns from compressed batches (zstd, lz4): the same rows as from the
same batches uncompressed, on both paths (numpy's uniform slices and the record walker), and a
batch whose compressed records are damaged is refused, not read as garbage."""

from __future__ import annotations

import struct

import pytest

pytest.importorskip("pyarrow", reason="the Spark source needs pyarrow (pip install '.[spark]')")

from laminar.log.batch import (
    BATCH_HEADER_BYTES,
    CHECKSUM_OFFSET,
    Record,
    encode_batch,
    header_checksum,
    payload_hash,
    stamp_header,
)
from laminar.log.errors import MalformedRecordsError
from laminar.spark.arrow import ColumnBuilder

UNIFORM = [Record(value=b'{"n": %04d}' % i, key=b"k%02d" % (i % 7)) for i in range(50)]
MIXED = [
    Record(value=b"y" * i, key=None if i % 3 else b"key", headers=(("h", b"%d" % i),) * (i % 2))
    for i in range(30)
]


def stored(records: list[Record], base: int, compression: str | None) -> bytes:
    """A batch as the log stores it: base index and term stamped, compressed as sent."""
    batch = encode_batch(records, now_ms=1_700_000_000_000, compression=compression)
    digest = payload_hash(memoryview(batch)[BATCH_HEADER_BYTES:])
    return stamp_header(batch, base, 1, digest) + batch[BATCH_HEADER_BYTES:]


def body(compression: str | None) -> bytes:
    return (
        stored(UNIFORM, 0, compression)
        + stored(MIXED, 50, compression)
        + stored(UNIFORM, 80, None)  # (a partition may hold both)
        + stored(UNIFORM, 130, compression)
    )


def rows(compression: str | None, low: int, high: int) -> dict[str, list[object]]:
    builder = ColumnBuilder("logs", 2, include_headers=True)
    builder.add(body(compression), low, high)
    batch = builder.take()
    assert batch is not None
    return batch.to_pydict()


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
@pytest.mark.parametrize(("low", "high"), [(0, 180), (10, 60), (49, 51), (75, 140)])
def test_compressed_batches_give_the_rows_of_uncompressed_ones(
    codec: str, low: int, high: int
) -> None:
    got = rows(codec, low, high)
    assert got == rows(None, low, high)
    assert got["index"] == list(range(low, high))


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_damaged_compressed_records_are_refused(codec: str) -> None:
    batch = bytearray(stored(UNIFORM, 0, codec))
    struct.pack_into("<I", batch, BATCH_HEADER_BYTES, 7)  # declares 7 bytes decompressed
    prefix = bytes(batch[:CHECKSUM_OFFSET])  # (a checksum that holds: a producer's bug)
    payload = bytes(batch[BATCH_HEADER_BYTES:])
    sealed = prefix + header_checksum(prefix, payload_hash(payload)).to_bytes(8, "little")
    with pytest.raises(MalformedRecordsError):
        ColumnBuilder("logs", 2, include_headers=False).add(sealed + payload, 0, 100)
