"""Record-batch codec: round trips, framing and checksum errors, stamping."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from laminar.log import (
    BATCH_HEADER_BYTES,
    BatchError,
    BatchFramingError,
    BatchTooLargeError,
    Record,
    decode_batch,
    encode_batch,
    parse_header,
    split_batches,
    verify_batch,
)
from laminar.log.batch import records_from, stamp_header

header_names = st.text(min_size=0, max_size=8)
records = st.builds(
    Record,
    value=st.none() | st.binary(max_size=64),
    key=st.none() | st.binary(max_size=16),
    headers=st.lists(st.tuples(header_names, st.binary(max_size=8)), max_size=3).map(tuple),
    # (at least 2^31: the round trip adds deltas down to -(2^31 - 1), and a timestamp below 0
    # is refused, see test_records.py)
    timestamp_ms=st.integers(min_value=2**31, max_value=2**40),
)


@given(
    st.lists(records, min_size=1, max_size=20),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1),
    st.data(),
)
def test_round_trip(batch: list[Record], producer_id: int, producer_seq: int, data: st.DataObject):
    base = batch[0].timestamp_ms
    assert base is not None
    # keep timestamps within the i32 delta window
    batch = [batch[0]] + [
        Record(r.value, r.key, r.headers, base + data.draw(st.integers(-(2**31) + 1, 2**31 - 1)))
        for r in batch[1:]
    ]
    encoded = encode_batch(batch, producer_id=producer_id, producer_seq=producer_seq)
    header, _ = verify_batch(encoded, max_batch_bytes=len(encoded))
    assert header.record_count == len(batch)
    assert header.producer_id == producer_id and header.producer_seq == producer_seq
    assert header.first_timestamp_ms == batch[0].timestamp_ms
    assert header.max_timestamp_ms == max(r.timestamp_ms or 0 for r in batch)
    decoded = decode_batch(encoded)
    assert [(r.key, r.value, r.headers, r.timestamp_ms) for r in decoded] == [
        (r.key, r.value, r.headers, r.timestamp_ms) for r in batch
    ]
    assert [r.index for r in decoded] == list(range(len(batch)))


@given(st.lists(records, min_size=1, max_size=5), st.integers(0, 2**64 - 1), st.integers(0, 99))
def test_stamp_keeps_checksum_valid(batch: list[Record], base: int, term: int):
    batch = [Record(r.value, r.key, r.headers, 1000) for r in batch]
    encoded = encode_batch(batch)
    _, digest = verify_batch(encoded, len(encoded))
    stamped = stamp_header(encoded, base, term, digest) + encoded[BATCH_HEADER_BYTES:]
    header, _ = verify_batch(stamped, len(stamped))
    assert (header.base_index, header.term) == (base, term)
    assert [r.index for r in decode_batch(stamped)] == [base + i for i in range(len(batch))]


def test_every_single_byte_flip_is_detected():
    encoded = encode_batch([Record(b"value", b"key", (("a", b"b"),), 5) for _ in range(3)])
    for position in range(len(encoded)):
        damaged = bytearray(encoded)
        damaged[position] ^= 0x40
        with pytest.raises(BatchError):
            verify_batch(bytes(damaged), max_batch_bytes=1 << 20)


def test_framing_errors_are_specific():
    good = encode_batch([Record(b"x", timestamp_ms=1)])
    with pytest.raises(BatchFramingError, match="header needs"):
        verify_batch(good[:10], 1 << 20)
    with pytest.raises(BatchFramingError, match="magic"):
        verify_batch(b"XXXX" + good[4:], 1 << 20)
    with pytest.raises(BatchFramingError, match="declares"):
        verify_batch(good + b"extra", 1 << 20)
    with pytest.raises(BatchFramingError, match="declares"):
        verify_batch(good[:-1], 1 << 20)
    with pytest.raises(BatchTooLargeError):
        verify_batch(good, len(good) - 1)
    with pytest.raises(BatchFramingError, match="at least one record"):
        encode_batch([])
    zero_count = bytearray(good)
    struct.pack_into("<I", zero_count, 28, 0)
    with pytest.raises(BatchFramingError, match="at least one record"):
        parse_header(bytes(zero_count))
    with pytest.raises(BatchFramingError, match="too far"):
        encode_batch([Record(b"a", timestamp_ms=0), Record(b"b", timestamp_ms=2**32)])


def test_decode_rejects_records_that_do_not_fill_the_payload():
    # A producer bug: checksum valid, but the records section has a trailing byte.
    good = encode_batch([Record(b"x", timestamp_ms=1)])
    payload = good[BATCH_HEADER_BYTES:] + b"\0"
    header = bytearray(good[:BATCH_HEADER_BYTES])
    struct.pack_into("<I", header, 24, len(payload))
    from laminar.log.batch import CHECKSUM_OFFSET, header_checksum, payload_hash

    checksum = header_checksum(bytes(header[:CHECKSUM_OFFSET]), payload_hash(payload))
    header[CHECKSUM_OFFSET:] = checksum.to_bytes(8, "little")
    with pytest.raises(BatchFramingError, match="1 bytes follow the last of 1 records"):
        decode_batch(bytes(header) + payload)


def test_split_batches():
    batches = [encode_batch([Record(bytes([i]) * i, timestamp_ms=i)]) for i in range(1, 5)]
    assert [bytes(b) for b in split_batches(b"".join(batches))] == batches
    with pytest.raises(BatchFramingError, match="past the end"):
        list(split_batches(b"".join(batches)[:-1]))


def test_records_from_skips_control_batches_and_earlier_records_and_caps() -> None:
    def stamped(batch: bytes, base: int) -> bytes:
        _, digest = verify_batch(batch, 1 << 20)
        return stamp_header(batch, base, 1, digest) + batch[72:]

    first = stamped(encode_batch([Record(value=b"a"), Record(value=b"b")]), 0)
    control = stamped(encode_batch([Record(value=None, key=b"noop")], control=True), 2)
    last = stamped(encode_batch([Record(value=b"c"), Record(value=b"d")]), 3)
    data = first + control + last
    records, end, capped = records_from(data, 1, 10)
    assert [r.value for r in records] == [b"b", b"c", b"d"] and (end, capped) == (5, False)
    records, end, capped = records_from(data, 1, 2)
    assert [r.index for r in records] == [1, 3] and (end, capped) == (4, True)
    assert records_from(b"", 7, 10) == ([], None, False)


def test_the_transactional_attribute_and_the_reserved_ones() -> None:
    batch = encode_batch([Record(value=b"t")], producer_id=5 << 16 | 2, transactional=True)
    header = parse_header(batch)
    assert header.is_transactional and not header.is_control and header.attributes == 0x2
    assert not parse_header(encode_batch([Record(value=b"p")])).is_transactional
    for reserved in (0x20, 0x8000):  # (bits 2-4 are the compression codec's)
        bad = bytearray(batch)
        struct.pack_into("<H", bad, 6, 0x2 | reserved)
        with pytest.raises(BatchFramingError, match="unsupported batch attributes"):
            parse_header(bytes(bad))
    for codec in (1, 2, 5, 6, 7):  # Kafka's gzip and snappy, and numbers no codec has
        bad = bytearray(batch)
        struct.pack_into("<H", bad, 6, 0x2 | codec << 2)
        with pytest.raises(BatchFramingError, match=f"unsupported compression codec {codec}"):
            parse_header(bytes(bad))
