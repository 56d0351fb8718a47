"""Record-batch codec: the one binary format producers send, the log stores and readers get.

Layout (little-endian; `docs/formats.md` is the full specification):

    header, BATCH_HEADER_BYTES = 72
      0  4s  magic            b"LMQB"
      4  u16 version          1
      6  u16 attributes       bit 0: control batch (Raft no-op / configuration / queue command /
                              transaction marker); bit 1: transactional (laminar.txn); bits 2-4:
                              compression codec (0 none, 3 lz4, 4 zstd: `compression.py`);
                              others 0
      8  u64 base_index       index of the first record, assigned by the log
     16  u64 term             Raft term, assigned by the leader that appended it
     24  u32 payload_bytes    length of the records section that follows the header, as stored
                              (compressed, when a codec is set)
     28  u32 record_count     >= 1
     32  u64 producer_id      0 = not an idempotent producer
     40  u64 producer_seq     sequence number of the first record
     48  i64 first_timestamp_ms
     56  i64 max_timestamp_ms
     64  u64 checksum         XXH3_64(header[0:64], seed=XXH3_64(payload))
    payload: record_count records, each
      i32 timestamp_delta_ms (from first_timestamp_ms), i32 key_bytes (-1 = null),
      i32 value_bytes (-1 = null), u16 header_count, key, value,
      then per header: u16 name_bytes, u32 value_bytes, name (UTF-8), value
    or, compressed: u32 records_bytes (the records' length decompressed), then one zstd or LZ4
    frame of those records

The checksum is chained through the payload hash so that the log can stamp `base_index` and
`term` into a verified batch by hashing 64 header bytes again, not the whole payload. The
broker's work per batch is framing checks, one hash pass and one walk over the records in C
(`records.py`: a checksum cannot tell a producer's malformed records from good ones): never
per-record work in Python. A compressed batch is decompressed for that walk, within the bound
of an uncompressed batch (`max_batch_bytes`), and stored, served and replicated as it came:
the header stays uncompressed, so indexing and the checksum need no decompression; readers
decompress (`iter_records`, `decompressed_batch`).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import xxhash

from .compression import (
    RECORDS_BYTES_LENGTH,
    Codec,
    codec_named,
    codec_of,
    compress,
    declared_bytes,
    decompress,
)
from .errors import (
    BatchChecksumError,
    BatchFramingError,
    BatchTooLargeError,
    DecompressionError,
    MalformedRecordsError,
)
from .records import MAX_TIMESTAMP_MS, MIN_TIMESTAMP_MS, records_problem

Buffer = bytes | bytearray | memoryview

BATCH_MAGIC = b"LMQB"
BATCH_VERSION = 1
BATCH_HEADER = struct.Struct("<4sHHQQIIQQqqQ")
BATCH_HEADER_BYTES = BATCH_HEADER.size
CHECKSUM_OFFSET = 64
BASE_INDEX_OFFSET = 8
RECORD_HEADER = struct.Struct("<iiiH")
RECORD_HEADER_BYTES = RECORD_HEADER.size
HEADER_FIELD = struct.Struct("<HI")
STAMP_FIELDS = struct.Struct("<QQ")  # base_index, term at BASE_INDEX_OFFSET
CONTROL_ATTRIBUTE = 0x1  # a Raft control batch (no-op, configuration change): not user data
#: records of a transaction (laminar.txn): visible to read_committed readers once it commits
TRANSACTIONAL_ATTRIBUTE = 0x2
#: bits 2-4: the codec of the records section (`compression.Codec`; 0 = not compressed)
CODEC_SHIFT = 2
CODEC_MASK = 0x7 << CODEC_SHIFT
KNOWN_ATTRIBUTES = CONTROL_ATTRIBUTE | TRANSACTIONAL_ATTRIBUTE | CODEC_MASK
ATTRIBUTES_OFFSET = 6
PAYLOAD_BYTES_OFFSET = 24
NULL_LENGTH = -1
MAX_PAYLOAD_BYTES = 2**32 - 1
MAX_HEADERS_PER_RECORD = 2**16 - 1
MAX_TIMESTAMP_DELTA_MS = 2**31 - 1
U64_MAX = 2**64 - 1

assert BATCH_HEADER_BYTES == 72


class BatchHeader(NamedTuple):
    """The fixed header of a record batch."""

    base_index: int
    term: int
    payload_bytes: int
    record_count: int
    producer_id: int
    producer_seq: int
    first_timestamp_ms: int
    max_timestamp_ms: int
    checksum: int
    attributes: int = 0

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_ATTRIBUTE)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_ATTRIBUTE)

    @property
    def codec(self) -> Codec:
        """The codec of the records section (`parse_header` refuses an unsupported one)."""
        return Codec((self.attributes & CODEC_MASK) >> CODEC_SHIFT)

    @property
    def is_compressed(self) -> bool:
        return bool(self.attributes & CODEC_MASK)

    @property
    def batch_bytes(self) -> int:
        return BATCH_HEADER_BYTES + self.payload_bytes

    @property
    def next_index(self) -> int:
        return self.base_index + self.record_count


@dataclass(frozen=True, slots=True)
class Record:
    """A record to produce. `timestamp_ms` None means "now" at encoding time."""

    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A record read back from the log, with its position in the partition."""

    index: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


def payload_hash(payload: Buffer) -> int:
    """XXH3-64 of a batch's records section: the seed of the header checksum."""
    return int(xxhash.xxh3_64_intdigest(payload))


def header_checksum(header_prefix: Buffer, payload_digest: int) -> int:
    """The batch checksum from the first 64 header bytes and the payload hash."""
    return int(xxhash.xxh3_64_intdigest(header_prefix, seed=payload_digest))


def encode_batch(
    records: Sequence[Record],
    *,
    producer_id: int = 0,
    producer_seq: int = 0,
    now_ms: int | None = None,
    control: bool = False,
    transactional: bool = False,
    compression: str | None = None,
) -> bytes:
    """Encode records as one batch with base_index 0 and term 0 (the log assigns both).

    This runs on producers; it is the only place that walks records on the write path.
    `control` marks a Raft control batch (consumers of user data skip those);
    `transactional` a batch of a transaction (`producer_id` names its producer and epoch).
    `compression` ("zstd", "lz4", None or "none") compresses the records section as a whole
    (ValueError for another name).
    """
    codec = codec_named(compression)
    if not records:
        raise BatchFramingError("a batch needs at least one record")
    if not 0 <= producer_id <= U64_MAX or not 0 <= producer_seq <= U64_MAX:
        raise BatchFramingError("producer_id and producer_seq must be unsigned 64-bit")
    default_ms = int(time.time() * 1000) if now_ms is None else now_ms
    timestamps = [default_ms if r.timestamp_ms is None else r.timestamp_ms for r in records]
    first_ms = timestamps[0]
    lowest, highest = min(timestamps), max(timestamps)
    if lowest < MIN_TIMESTAMP_MS or highest > MAX_TIMESTAMP_MS:
        bad = lowest if lowest < MIN_TIMESTAMP_MS else highest
        raise BatchFramingError(
            f"record timestamp {bad} is outside [{MIN_TIMESTAMP_MS}, {MAX_TIMESTAMP_MS}]"
        )
    parts: list[bytes] = []
    append = parts.append
    pack_record = RECORD_HEADER.pack
    for record, ts in zip(records, timestamps, strict=True):
        delta = ts - first_ms
        if not -MAX_TIMESTAMP_DELTA_MS <= delta <= MAX_TIMESTAMP_DELTA_MS:
            raise BatchFramingError(f"record timestamp {ts} is too far from {first_ms}")
        key, value, headers = record.key, record.value, record.headers
        if len(headers) > MAX_HEADERS_PER_RECORD:
            raise BatchFramingError(f"a record may carry at most {MAX_HEADERS_PER_RECORD} headers")
        append(
            pack_record(
                delta,
                NULL_LENGTH if key is None else len(key),
                NULL_LENGTH if value is None else len(value),
                len(headers),
            )
        )
        if key:
            append(key)
        if value:
            append(value)
        for name, header_value in headers:
            name_bytes = name.encode()
            append(HEADER_FIELD.pack(len(name_bytes), len(header_value)))
            append(name_bytes)
            append(header_value)
    payload = b"".join(parts)
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise BatchTooLargeError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES}")
    if codec is not Codec.NONE:
        payload = compress(codec, payload)
        if len(payload) > MAX_PAYLOAD_BYTES:
            raise BatchTooLargeError(
                f"compressed payload of {len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES}"
            )
    prefix = BATCH_HEADER.pack(
        BATCH_MAGIC,
        BATCH_VERSION,
        (CONTROL_ATTRIBUTE if control else 0)
        | (TRANSACTIONAL_ATTRIBUTE if transactional else 0)
        | codec << CODEC_SHIFT,
        0,
        0,
        len(payload),
        len(records),
        producer_id,
        producer_seq,
        first_ms,
        highest,
        0,
    )[:CHECKSUM_OFFSET]
    checksum = header_checksum(prefix, payload_hash(payload))
    return prefix + checksum.to_bytes(8, "little") + payload


def parse_header(data: Buffer, offset: int = 0) -> BatchHeader:
    """Parse and frame-check a batch header (no checksum). Raises BatchFramingError."""
    if len(data) - offset < BATCH_HEADER_BYTES:
        raise BatchFramingError(
            f"batch header needs {BATCH_HEADER_BYTES} bytes, got {max(0, len(data) - offset)}"
        )
    magic, version, attributes, *fields = BATCH_HEADER.unpack_from(data, offset)
    fields.append(attributes)
    # (built as tuple.__new__ builds it: this runs several times per append)
    header: BatchHeader = _new_tuple(BatchHeader, fields)
    if (
        magic != BATCH_MAGIC
        or version != BATCH_VERSION
        or attributes & ~KNOWN_ATTRIBUTES
        or header.record_count < 1
        or header.max_timestamp_ms < header.first_timestamp_ms
        or attributes & CODEC_MASK
        or header.payload_bytes < header.record_count * RECORD_HEADER_BYTES
    ):
        _check_header(magic, version, attributes, header)  # raises, or passes a compressed one
    return header


_new_tuple = tuple.__new__


def _check_header(magic: bytes, version: int, attributes: int, header: BatchHeader) -> None:
    """The checks of `parse_header`, one at a time, raising the first that fails."""
    if magic != BATCH_MAGIC:
        raise BatchFramingError(f"bad batch magic {bytes(magic)!r}")
    if version != BATCH_VERSION:
        raise BatchFramingError(f"unsupported batch version {version}")
    if attributes & ~KNOWN_ATTRIBUTES:
        raise BatchFramingError(f"unsupported batch attributes {attributes:#x}")
    codec = codec_of((attributes & CODEC_MASK) >> CODEC_SHIFT)
    if header.record_count < 1:
        raise BatchFramingError("a batch needs at least one record")
    if codec is not Codec.NONE:
        # (the records' own length is checked once decompressed: see verify_records)
        if header.payload_bytes <= RECORDS_BYTES_LENGTH:
            raise BatchFramingError(
                f"{header.payload_bytes} payload bytes cannot hold compressed records"
            )
    elif header.payload_bytes < header.record_count * RECORD_HEADER_BYTES:
        raise BatchFramingError(
            f"{header.payload_bytes} payload bytes cannot hold {header.record_count} records"
        )
    if header.max_timestamp_ms < header.first_timestamp_ms:
        raise BatchFramingError("max_timestamp_ms is below first_timestamp_ms")


def verify_batch(
    data: Buffer, max_batch_bytes: int, *, check_records: bool = True
) -> tuple[BatchHeader, int]:
    """Check that `data` is exactly one valid batch; return its header and payload hash.

    Raises BatchTooLargeError, BatchFramingError or BatchChecksumError, and
    MalformedRecordsError (a BatchFramingError) when the checksum holds but the records do not
    (`verify_records`), or when compressed records do not decompress to at most
    `max_batch_bytes` less the header (the bound of an uncompressed batch's records: a
    decompression bomb is refused without ever being expanded past it).
    `check_records=False` checks the header and checksum only: for Raft
    replication, which must store what its leader committed (the leader checked the records
    when the batch entered the cluster; a batch stored before appends checked them must still
    reach every replica).
    """
    header = parse_header(data)
    if header.batch_bytes > max_batch_bytes:
        raise BatchTooLargeError(
            f"batch of {header.batch_bytes} bytes exceeds max_batch_bytes={max_batch_bytes}"
        )
    if len(data) != header.batch_bytes:
        raise BatchFramingError(
            f"header declares {header.batch_bytes} batch bytes, got {len(data)}"
        )
    view = memoryview(data)
    digest = payload_hash(view[BATCH_HEADER_BYTES:])
    if header_checksum(view[:CHECKSUM_OFFSET], digest) != header.checksum:
        raise BatchChecksumError(f"checksum mismatch in batch at index {header.base_index}")
    if check_records:
        verify_records(
            header,
            view[BATCH_HEADER_BYTES:],
            max_records_bytes=max_batch_bytes - BATCH_HEADER_BYTES,
        )
    return header, digest


def verify_records(
    header: BatchHeader, payload: Buffer, *, max_records_bytes: int = MAX_PAYLOAD_BYTES
) -> Buffer:
    """Check the records section `payload` (as stored) of the batch whose header is `header`
    against the rules of `laminar.log.records` (one walk in C), and return it decompressed (or
    `payload` itself, not compressed). Compressed records may take at most
    `max_records_bytes` decompressed. Raises MalformedRecordsError, which says where the
    batch's indexes end (`next_index`) so that a reader can go on after it."""
    records = records_section(header, payload, max_records_bytes)
    problem = records_problem(
        records, header.record_count, header.first_timestamp_ms, header.max_timestamp_ms
    )
    if problem is not None:
        raise MalformedRecordsError(
            f"malformed records in batch {header.base_index}: {problem}",
            base_index=header.base_index,
            next_index=header.next_index,
        )
    return records


def records_section(
    header: BatchHeader, payload: Buffer, max_records_bytes: int = MAX_PAYLOAD_BYTES
) -> Buffer:
    """The records section of a batch from its stored payload: decompressed, within
    `max_records_bytes`, when the header names a codec; else `payload` itself (unchecked:
    `verify_records` checks). Raises MalformedRecordsError for compressed records that do not
    decompress within bounds."""
    if not header.is_compressed:
        return payload
    try:
        return decompress(header.codec, payload, max_records_bytes)
    except DecompressionError as e:
        raise MalformedRecordsError(
            f"malformed records in batch {header.base_index}: {e}",
            base_index=header.base_index,
            next_index=header.next_index,
        ) from e


def records_bytes(batch: Buffer) -> int:
    """The length of a (framed) batch's records section decompressed: `payload_bytes` for a
    batch that is not compressed, else what its compressed section declares."""
    header = parse_header(batch)
    if not header.is_compressed:
        return header.payload_bytes
    return declared_bytes(memoryview(batch)[BATCH_HEADER_BYTES : header.batch_bytes])


def decompressed_batch(batch: Buffer) -> Buffer:
    """Verify `batch` and return it as if it had been sent uncompressed: the same records and
    header fields, no codec, the checksum redone (`batch` itself when it is not compressed).
    For readers that work on the bytes of a records section (the Spark source's columns)."""
    header, _ = verify_batch(batch, BATCH_HEADER_BYTES + MAX_PAYLOAD_BYTES, check_records=False)
    view = memoryview(batch)
    records = verify_records(header, view[BATCH_HEADER_BYTES:])
    if not header.is_compressed:
        return batch
    prefix = bytearray(view[:CHECKSUM_OFFSET])
    struct.pack_into("<H", prefix, ATTRIBUTES_OFFSET, header.attributes & ~CODEC_MASK)
    struct.pack_into("<I", prefix, PAYLOAD_BYTES_OFFSET, len(records))
    checksum = header_checksum(prefix, payload_hash(records))
    return b"".join((prefix, checksum.to_bytes(8, "little"), records))


def stamp_header(header_bytes: Buffer, base_index: int, term: int, digest: int) -> bytes:
    """Return the 72-byte header with `base_index` and `term` set and the checksum redone."""
    stamped = bytearray(header_bytes[:BATCH_HEADER_BYTES])
    STAMP_FIELDS.pack_into(stamped, BASE_INDEX_OFFSET, base_index, term)
    checksum = header_checksum(memoryview(stamped)[:CHECKSUM_OFFSET], digest)
    stamped[CHECKSUM_OFFSET:] = checksum.to_bytes(8, "little")
    return bytes(stamped)


def split_batches(data: Buffer) -> Iterator[memoryview]:
    """Split concatenated whole batches (as `read_range` returns them) into single batches."""
    view = memoryview(data)
    offset = 0
    while offset < len(view):
        header = parse_header(view, offset)
        end = offset + header.batch_bytes
        if end > len(view):
            raise BatchFramingError(f"batch at byte {offset} runs past the end of the buffer")
        yield view[offset:end]
        offset = end


RecordTuple = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes], ...]]


def decode_batch(batch: Buffer) -> list[StoredRecord]:
    """Verify one batch and decode its records (consumer side: per-record work is fine here).
    A batch whose records are malformed raises MalformedRecordsError before any is decoded."""
    return [StoredRecord(*fields) for fields in iter_records(batch)]


def iter_records(batch: Buffer) -> Iterator[RecordTuple]:
    """Verify one batch, then yield its records as (index, timestamp_ms, key, value, headers)
    tuples: the one record walker, for callers that build their own record objects."""
    header, _ = verify_batch(
        batch, max_batch_bytes=BATCH_HEADER_BYTES + MAX_PAYLOAD_BYTES, check_records=False
    )
    # (checked by the C walker, and decompressed first when compressed)
    view = memoryview(verify_records(header, memoryview(batch)[BATCH_HEADER_BYTES:]))
    pos = 0
    end = len(view)
    base, first_ms = header.base_index, header.first_timestamp_ms
    unpack_record = RECORD_HEADER.unpack_from
    unpack_field = HEADER_FIELD.unpack_from
    try:
        for i in range(header.record_count):
            delta, key_bytes, value_bytes, header_count = unpack_record(view, pos)
            pos += RECORD_HEADER_BYTES
            key: bytes | None
            value: bytes | None
            if key_bytes > 0 and pos + key_bytes <= end:  # (the usual cases inline)
                key = view[pos : pos + key_bytes].tobytes()
                pos += key_bytes
            else:
                key, pos = _take(view, pos, key_bytes, end)
            if value_bytes > 0 and pos + value_bytes <= end:
                value = view[pos : pos + value_bytes].tobytes()
                pos += value_bytes
            else:
                value, pos = _take(view, pos, value_bytes, end)
            if not header_count:
                yield base + i, first_ms + delta, key, value, ()
                continue
            headers = []
            for _ in range(header_count):
                name_bytes, field_bytes = unpack_field(view, pos)
                pos += HEADER_FIELD.size
                name, pos = _take(view, pos, name_bytes, end)
                field, pos = _take(view, pos, field_bytes, end)
                assert name is not None and field is not None
                headers.append((name.decode(), field))
            yield base + i, first_ms + delta, key, value, tuple(headers)
    except (struct.error, UnicodeDecodeError) as e:
        raise BatchFramingError(f"malformed record in batch {header.base_index}: {e}") from e
    if pos != end:
        raise BatchFramingError(
            f"batch {header.base_index} has {end - pos} bytes after its last record"
        )


def single_record_batch(record: StoredRecord, term: int) -> bytes:
    """`record` alone as a stored batch (base_index = its index): how an answer carries a
    record without the rest of the batch it was stored in."""
    batch = encode_batch([Record(record.value, record.key, record.headers, record.timestamp_ms)])
    view = memoryview(batch)
    header = stamp_header(view, record.index, term, payload_hash(view[BATCH_HEADER_BYTES:]))
    return header + batch[BATCH_HEADER_BYTES:]


def decode_batches(data: Buffer) -> Iterable[StoredRecord]:
    """Decode every record of concatenated whole batches."""
    for batch in split_batches(data):
        yield from decode_batch(batch)


def records_from(
    data: Buffer, from_index: int, max_records: int
) -> tuple[list[StoredRecord], int | None, bool]:
    """The records of concatenated whole batches (a read's answer) at or after `from_index`,
    control batches skipped, at most `max_records`. Also returns where reading goes on: just
    after the last record kept when `max_records` cut it short (the third value, True), else
    the end of the last batch (None when `data` is empty).

    A batch with malformed records (stored before appends checked them) cuts the answer short
    too (True): reading goes on at its base index; when no record comes before it,
    MalformedRecordsError says where its indexes end (`next_index`), so that the reader can
    skip it."""
    records: list[StoredRecord] = []
    end: int | None = None
    for batch in split_batches(data):
        header = parse_header(batch)
        if not header.is_control:
            try:
                decoded = decode_batch(batch)
            except MalformedRecordsError:
                if records:
                    return records, header.base_index, True
                raise
            for record in decoded:
                if record.index < from_index:
                    continue
                if len(records) >= max_records:
                    return records, records[-1].index + 1, True
                records.append(record)
        end = header.next_index
    return records, end, False


def _take(view: memoryview, pos: int, length: int, end: int) -> tuple[bytes | None, int]:
    if length == NULL_LENGTH:
        return None, pos
    if length < 0 or pos + length > end:
        raise BatchFramingError(f"record field of {length} bytes runs past the batch end")
    return bytes(view[pos : pos + length]), pos + length
