"""The validity rules of a batch's records section (docs/formats.md §1, "Valid records").

A batch whose checksum holds can still be malformed: a producer bug (or a fuzzer) can frame a
key past the end of its record, count more records than it frames, leave bytes after the
last one, name a header with bytes that are not UTF-8, or carry timestamps that overflow 64
bits once the deltas are added. Accepted, such a batch breaks every reader after it. So the
log checks, at append, that:

* `record_count` records are framed, and they fill the section exactly;
* every length (key, value, header count, header name and value) stays within the section;
  key and value lengths are -1 (null) or more;
* header names are valid UTF-8;
* every record timestamp (`first_timestamp_ms + timestamp_delta_ms`) lies in
  [MIN_TIMESTAMP_MS, MAX_TIMESTAMP_MS], the first record's delta is 0 (`first_timestamp_ms` is
  its timestamp) and `max_timestamp_ms` is the largest record timestamp.

That is a walk over every record, too slow for the append path in Python: `records_problem`
is the C walker (`_records.c`, compiled when the package is installed). `records_problem_py`
is its reference, with the very same semantics and messages: it is used only when the
extension is missing (the broker then logs a warning), and by the tests, which compare the
two on random and mutated batches.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

Buffer = bytes | bytearray | memoryview
#: A record timestamp, in ms since the Unix epoch, is valid from the epoch to the last
#: millisecond of the year 9999 (what ISO 8601 and most date libraries can represent).
MIN_TIMESTAMP_MS = 0
MAX_TIMESTAMP_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
RECORD_HEADER_BYTES = 14  # i32 timestamp_delta_ms, i32 key_bytes, i32 value_bytes, u16 headers
HEADER_FIELD_BYTES = 6  # u16 name_bytes, u32 value_bytes


def records_problem_py(
    payload: Buffer, record_count: int, first_timestamp_ms: int, max_timestamp_ms: int
) -> str | None:
    """None if `payload` (a batch's records section) is valid for the header's record count
    and timestamps, else the first problem found (the reference of the C walker)."""
    view = memoryview(payload).cast("B")
    n = len(view)
    if record_count < 1:
        return f"record_count {record_count} is below 1"
    if not MIN_TIMESTAMP_MS <= first_timestamp_ms <= MAX_TIMESTAMP_MS:
        return f"first_timestamp_ms {first_timestamp_ms} is outside [0, {MAX_TIMESTAMP_MS}]"
    pos = 0
    largest = first_timestamp_ms
    for i in range(record_count):
        if n - pos < RECORD_HEADER_BYTES:
            return f"record {i}: its header runs past the records section end (byte {pos} of {n})"
        delta = _i32(view, pos)
        key_bytes = _i32(view, pos + 4)
        value_bytes = _i32(view, pos + 8)
        header_count = view[pos + 12] | view[pos + 13] << 8
        pos += RECORD_HEADER_BYTES
        if i == 0 and delta != 0:
            return (
                f"record 0: timestamp delta {delta} is not 0 (first_timestamp_ms is the first "
                "record's timestamp)"
            )
        timestamp = first_timestamp_ms + delta
        if not MIN_TIMESTAMP_MS <= timestamp <= MAX_TIMESTAMP_MS:
            return f"record {i}: timestamp {timestamp} is outside [0, {MAX_TIMESTAMP_MS}]"
        largest = max(largest, timestamp)
        for what, length in (("key", key_bytes), ("value", value_bytes)):
            if length < -1:
                return f"record {i}: {what} length {length} is below -1"
            if length > 0:
                if length > n - pos:
                    return (
                        f"record {i}: {what} of {length} bytes runs past the records section "
                        f"end (byte {pos} of {n})"
                    )
                pos += length
        for h in range(header_count):
            if n - pos < HEADER_FIELD_BYTES:
                return (
                    f"record {i}: header {h} runs past the records section end (byte {pos} of {n})"
                )
            name_bytes = view[pos] | view[pos + 1] << 8
            field_bytes = int.from_bytes(view[pos + 2 : pos + 6], "little")
            pos += HEADER_FIELD_BYTES
            if name_bytes > n - pos:
                return (
                    f"record {i}: header {h}: name of {name_bytes} bytes runs past the records "
                    f"section end (byte {pos} of {n})"
                )
            try:
                bytes(view[pos : pos + name_bytes]).decode("utf-8")
            except UnicodeDecodeError:
                return f"record {i}: header {h}: name is not valid UTF-8"
            pos += name_bytes
            if field_bytes > n - pos:
                return (
                    f"record {i}: header {h}: value of {field_bytes} bytes runs past the "
                    f"records section end (byte {pos} of {n})"
                )
            pos += field_bytes
    if pos != n:
        return f"{n - pos} bytes follow the last of {record_count} records"
    if largest != max_timestamp_ms:
        return f"max_timestamp_ms {max_timestamp_ms} is not the largest record timestamp, {largest}"
    return None


def _i32(view: memoryview, pos: int) -> int:
    return int.from_bytes(view[pos : pos + 4], "little", signed=True)


RecordsCheck = Callable[[Buffer, int, int, int], "str | None"]
_compiled: RecordsCheck | None
try:
    from ._records import records_problem as _compiled
except ImportError:  # (a source tree nobody built: `pip install -e .` compiles it)
    _compiled = None
    log.warning(
        "laminar.log._records (the C record walker) is not built: appends check records "
        "in Python, much more slowly"
    )

#: True when appends check records with the C walker.
COMPILED = _compiled is not None
#: The check appends use: the C walker, or the reference where it is missing.
records_problem: RecordsCheck = _compiled if _compiled is not None else records_problem_py
