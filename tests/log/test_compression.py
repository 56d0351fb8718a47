"""Compressed record batches (zstd, lz4): round trips, what is stored, and every way a
compressed records section can be wrong, a decompression bomb included, refused with the
error a reader can skip (MalformedRecordsError) and without expanding past the limit."""

from __future__ import annotations

import functools
import json
import struct
import tracemalloc

import lz4.frame
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from laminar.log import (
    BATCH_HEADER_BYTES,
    BatchChecksumError,
    BatchFramingError,
    MalformedRecordsError,
    MemoryDirectory,
    Record,
    SegmentedLog,
    decode_batch,
    encode_batch,
    parse_header,
    verify_batch,
)
from laminar.log.batch import (
    CHECKSUM_OFFSET,
    decompressed_batch,
    header_checksum,
    payload_hash,
    records_bytes,
    records_from,
)
from laminar.log.compression import (
    RECORDS_BYTES,
    Codec,
    codec_named,
    compress,
    decompress,
)
from laminar.log.config import LogConfig
from laminar.log.errors import DecompressionError

CODECS = ["zstd", "lz4"]
NOW_MS = 1_700_000_000_000
MIB = 1 << 20


def log_lines(count: int) -> list[Record]:
    """JSON log lines: the text-like payload compression is for."""
    return [
        Record(
            json.dumps(
                {
                    "ts": NOW_MS + i,
                    "level": "info" if i % 5 else "warn",
                    "service": "checkout",
                    "msg": f"order {1000 + i} paid",
                    "user": f"user-{i % 37}",
                }
            ).encode(),
            key=f"user-{i % 37}".encode(),
            headers=(("trace", b"%08x" % i),),
            timestamp_ms=NOW_MS + i,
        )
        for i in range(count)
    ]


def resealed(batch: bytes | bytearray) -> bytes:
    """`batch` with a checksum that holds for whatever bytes it has (a producer's bug, not
    damage on the way: the checks behind the checksum must catch it)."""
    prefix = bytes(batch[:CHECKSUM_OFFSET])
    payload = bytes(batch[BATCH_HEADER_BYTES:])
    checksum = header_checksum(prefix, payload_hash(payload))
    return prefix + checksum.to_bytes(8, "little") + payload


def with_section(batch: bytes, section: bytes) -> bytes:
    """`batch` with its records section replaced by `section` (payload_bytes and checksum
    made to match)."""
    header = bytearray(batch[:BATCH_HEADER_BYTES])
    struct.pack_into("<I", header, 24, len(section))
    return resealed(bytes(header) + section)


records = st.builds(
    Record,
    value=st.none() | st.binary(max_size=64),
    key=st.none() | st.binary(max_size=16),
    headers=st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=8)), max_size=3).map(tuple),
    timestamp_ms=st.integers(NOW_MS, NOW_MS + 10_000),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(records, min_size=1, max_size=20), st.sampled_from(CODECS))
def test_round_trip_every_codec(batch: list[Record], codec: str) -> None:
    encoded = encode_batch(batch, producer_id=7, producer_seq=3, compression=codec)
    header, _ = verify_batch(encoded, max_batch_bytes=1 << 20)
    assert header.codec is codec_named(codec) and header.is_compressed
    assert header.record_count == len(batch) and header.producer_id == 7
    plain = encode_batch(batch, producer_id=7, producer_seq=3)
    assert decode_batch(encoded) == decode_batch(plain)
    # the same batch as if sent uncompressed: what the Spark source reads the columns of
    assert bytes(decompressed_batch(encoded)) == plain
    assert records_bytes(encoded) == records_bytes(plain) == parse_header(plain).payload_bytes


@pytest.mark.parametrize("codec", CODECS)
def test_text_is_stored_compressed_and_read_back(codec: str) -> None:
    lines = log_lines(500)
    plain = encode_batch(lines)
    compressed = encode_batch(lines, compression=codec)
    assert len(compressed) * 3 < len(plain), (codec, len(compressed), len(plain))
    log = SegmentedLog.open(MemoryDirectory(), LogConfig(segment_bytes=4 * MIB))
    first = log.append(compressed, term=1)
    log.append(plain, term=1)
    stored = log.read_range(first.base_index, 8 * MIB).data
    # stored as sent (stamped only): the broker never rewrites a batch uncompressed
    assert stored[BATCH_HEADER_BYTES : len(compressed)] == compressed[BATCH_HEADER_BYTES:]
    got, end, cut = records_from(stored, 0, 10_000)
    assert (end, cut) == (1000, False)
    assert [r.value for r in got] == [r.value for r in lines] * 2
    assert [r.index for r in got] == list(range(1000))


def test_codec_names() -> None:
    assert codec_named(None) is codec_named("none") is Codec.NONE
    assert (codec_named("zstd"), codec_named("lz4")) == (Codec.ZSTD, Codec.LZ4)
    # Kafka's numbers, in bits 2-4 of the attributes
    assert parse_header(encode_batch([Record(b"x")], compression="lz4")).attributes == 3 << 2
    assert parse_header(encode_batch([Record(b"x")], compression="zstd")).attributes == 4 << 2
    for name in ("gzip", "snappy", "ZSTD", ""):
        with pytest.raises(ValueError, match="unknown compression"):
            encode_batch([Record(b"x")], compression=name)


def test_old_batches_without_a_codec_still_read() -> None:
    plain = encode_batch(log_lines(3))
    header = parse_header(plain)
    assert header.codec is Codec.NONE and not header.is_compressed
    assert [r.value for r in decode_batch(plain)] == [r.value for r in log_lines(3)]


@pytest.mark.parametrize("codec", CODECS)
def test_damage_in_transit_is_a_checksum_error(codec: str) -> None:
    damaged = bytearray(encode_batch(log_lines(20), compression=codec))
    damaged[-3] ^= 0x10
    with pytest.raises(BatchChecksumError):
        verify_batch(bytes(damaged), MIB)


@pytest.mark.parametrize("codec", CODECS)
def test_corrupt_compressed_records_are_refused(codec: str) -> None:
    """A checksum that holds over a section that does not decompress to valid records: each
    refused by the append check and by every decoder, with where the batch's indexes end."""
    batch = encode_batch(log_lines(20), compression=codec)
    section = batch[BATCH_HEADER_BYTES:]
    frame = section[4:]
    declared = struct.unpack_from("<I", section)[0]
    flipped = bytearray(frame)
    flipped[0] ^= 0xFF  # (the frame's magic; a flip inside may decode, to other records)
    shapes = {
        "garbage frame": RECORDS_BYTES.pack(declared) + b"not a frame at all",
        "cut short": section[:-5],
        "bytes after the frame": section + b"\0\0",
        "two frames": section + frame,
        "declares one byte less": RECORDS_BYTES.pack(declared - 1) + frame,
        "declares one byte more": RECORDS_BYTES.pack(declared + 1) + frame,
        "bad magic": RECORDS_BYTES.pack(declared) + bytes(flipped),
    }
    # valid frames of records that break the rules (a producer's bug under the compression)
    plain = encode_batch(log_lines(20))
    bad_records = bytearray(plain[BATCH_HEADER_BYTES:])
    struct.pack_into("<i", bad_records, 4, 10_000)  # record 0's key runs past the end
    codec_id = codec_named(codec)
    shapes["malformed records inside"] = compress(codec_id, bytes(bad_records))
    shapes["empty records"] = compress(codec_id, b"")
    for shape, bad_section in shapes.items():
        bad = with_section(batch, bad_section)
        with pytest.raises(MalformedRecordsError) as caught:
            verify_batch(bad, MIB)
        assert caught.value.next_index == 20, shape
        for decoder in (decode_batch, decompressed_batch):
            with pytest.raises(MalformedRecordsError):
                decoder(bad)
        log = SegmentedLog.open(MemoryDirectory(), LogConfig(segment_bytes=4 * MIB))
        with pytest.raises(MalformedRecordsError):
            log.append(bad, term=1)
        assert log.next_index == 0, shape


def test_a_compressed_section_too_short_for_its_length_is_a_framing_error() -> None:
    batch = encode_batch([Record(b"x")], compression="zstd")
    for section in (b"", b"\x01\0\0\0"):
        with pytest.raises(BatchFramingError, match="cannot hold compressed records"):
            verify_batch(with_section(batch, section), MIB)


@functools.cache
def zstd_bomb(decompressed_bytes: int, *, content_size: bool) -> bytes:
    """A zstd frame of `decompressed_bytes` zeros, built without holding them (a few KiB)."""
    compressor = zstandard.ZstdCompressor(level=1, write_content_size=content_size)
    chunk = bytes(MIB)
    if content_size:
        writer = compressor.compressobj(size=decompressed_bytes)
    else:
        writer = compressor.compressobj()
    parts = [writer.compress(chunk) for _ in range(decompressed_bytes // MIB)]
    return b"".join([*parts, writer.flush()])


@functools.cache
def lz4_bomb(decompressed_bytes: int) -> bytes:
    compressor = lz4.frame.LZ4FrameCompressor()
    chunk = bytes(MIB)
    parts = [compressor.begin()]
    parts += [compressor.compress(chunk) for _ in range(decompressed_bytes // MIB)]
    return b"".join([*parts, compressor.flush()])


BOMB_BYTES = 256 * MIB
LIMIT_BYTES = 4 * MIB


BOMBS = {  # (lz4 expands at most ~255 times: its bomb is smaller, and larger on the wire)
    "zstd-sized": ("zstd", BOMB_BYTES, lambda: zstd_bomb(BOMB_BYTES, content_size=True)),
    "zstd-unsized": ("zstd", BOMB_BYTES, lambda: zstd_bomb(BOMB_BYTES, content_size=False)),
    "lz4": ("lz4", BOMB_BYTES // 4, lambda: lz4_bomb(BOMB_BYTES // 4)),
}


@pytest.mark.parametrize("bomb_name", list(BOMBS))
def test_a_decompression_bomb_is_refused_without_expanding_it(bomb_name: str) -> None:
    """A frame of hundreds of MiB of zeros (KiB sent), whatever length it declares, is
    refused within the limit: memory stays within a few times the limit, never the bomb."""
    codec, bomb_bytes, make_frame = BOMBS[bomb_name]
    frame = make_frame()
    batch = encode_batch([Record(b"x")], compression=codec)
    declared_lengths = {
        "honest": bomb_bytes,
        "within the limit": LIMIT_BYTES - 100,
        "small": 14,
    }
    for how, declared in declared_lengths.items():
        bomb = with_section(batch, RECORDS_BYTES.pack(declared) + frame)
        assert len(bomb) < LIMIT_BYTES // 4  # (small on the wire: that is the trick)
        tracemalloc.start()
        try:
            with pytest.raises(MalformedRecordsError) as caught:
                verify_batch(bomb, LIMIT_BYTES + BATCH_HEADER_BYTES)
            _, peak_bytes = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak_bytes < 3 * LIMIT_BYTES, (how, peak_bytes)
        if how == "honest":
            assert "over the limit" in str(caught.value), caught.value


def test_a_zstd_frame_must_declare_its_content_size() -> None:
    """So that its decoder needs one buffer of the declared size, and no more."""
    records = encode_batch(log_lines(10))[BATCH_HEADER_BYTES:]
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(records)
    section = RECORDS_BYTES.pack(len(records)) + unsized
    with pytest.raises(DecompressionError, match="does not declare its content size"):
        decompress(Codec.ZSTD, section, MIB)


def test_decompress_is_bounded_by_what_the_section_declares() -> None:
    frame = zstd_bomb(64 * MIB, content_size=True)
    for limit in (MIB, 64 * MIB - 1):
        with pytest.raises(DecompressionError, match="over the limit"):
            decompress(Codec.ZSTD, RECORDS_BYTES.pack(64 * MIB) + frame, limit)
    records = decompress(Codec.ZSTD, RECORDS_BYTES.pack(64 * MIB) + frame, 64 * MIB)
    assert len(records) == 64 * MIB and not any(records[:: 4 * MIB])


def test_the_append_bound_is_max_batch_bytes_decompressed() -> None:
    """A compressed batch may hold as many record bytes as an uncompressed one, not more."""
    lines = log_lines(2000)
    plain = encode_batch(lines)
    compressed = encode_batch(lines, compression="zstd")
    verify_batch(compressed, len(plain))  # (records exactly max_batch_bytes less the header)
    with pytest.raises(MalformedRecordsError, match="over the limit"):
        verify_batch(compressed, len(plain) - 1)
    config = LogConfig(segment_bytes=4 * MIB, max_batch_bytes=len(plain) - 1)
    log = SegmentedLog.open(MemoryDirectory(), config)
    with pytest.raises(MalformedRecordsError, match="over the limit"):
        log.append(compressed, term=1)
    assert len(compressed) < len(plain) // 3  # (the stored size alone would have passed)


def test_streamed_appends_check_compressed_records_too() -> None:
    lines = log_lines(50)
    config = LogConfig(segment_bytes=4 * MIB)
    log = SegmentedLog.open(MemoryDirectory(), config)
    good = encode_batch(lines, compression="lz4")
    stream = log.begin_stream(good[:BATCH_HEADER_BYTES])
    stream.write(good[BATCH_HEADER_BYTES:])
    assert stream.commit().base_index == 0
    bad = with_section(good, RECORDS_BYTES.pack(10**6) + good[BATCH_HEADER_BYTES + 4 :])
    stream = log.begin_stream(bad[:BATCH_HEADER_BYTES])
    stream.write(bad[BATCH_HEADER_BYTES:])
    with pytest.raises(MalformedRecordsError):
        stream.commit()
    assert log.next_index == 50
    got, _, _ = records_from(log.read_range(0, MIB).data, 0, 100)
    assert [r.value for r in got] == [r.value for r in lines]
