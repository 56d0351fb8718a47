"""The binary acquire answer, `application/vnd.laminar.acquired` (docs/formats.md §8;
`laminar.contract.ACQUIRED_TYPE`).

    0  4s  magic          b"LMQA"
    4  u16 version        1
    6  u16 consumer_bytes
    8  u32 grant_count
   12  consumer id (UTF-8), then grant_count grants of (u64 index, u32 deliveries,
       i64 lease_deadline_ms), ascending index, then whole record batches back to back that
       hold every granted index (as stored, so they may hold other records too: skip those).

The broker ships the stored batches as they are (no per-record work) and the client decodes
only what it was granted; both sides save the JSON rendering of every value.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from ..log.batch import Buffer
from ..log.errors import BatchFramingError

ACQUIRED_MAGIC = b"LMQA"
ACQUIRED_VERSION = 1
PREAMBLE = struct.Struct("<4sHHI")
GRANT = struct.Struct("<QIq")

Grant = tuple[int, int, int]  # index, deliveries, lease_deadline_ms


def encode_acquired(consumer: str, grants: Sequence[Grant], batches: Sequence[Buffer]) -> bytes:
    name = consumer.encode()
    parts: list[Buffer] = [PREAMBLE.pack(ACQUIRED_MAGIC, ACQUIRED_VERSION, len(name), len(grants))]
    parts.append(name)
    pack = GRANT.pack
    parts.extend(pack(*grant) for grant in grants)
    parts.extend(batches)
    return b"".join(parts)


def decode_acquired(body: Buffer) -> tuple[str, list[Grant], memoryview]:
    """(consumer, grants, the batches section). Raises BatchFramingError on a malformed body
    (the batches are checked by whoever decodes them)."""
    view = memoryview(body)
    if len(view) < PREAMBLE.size:
        raise BatchFramingError(f"acquire answer of {len(view)} bytes is too short")
    magic, version, name_bytes, count = PREAMBLE.unpack_from(view)
    if magic != ACQUIRED_MAGIC or version != ACQUIRED_VERSION:
        raise BatchFramingError(f"not an acquire answer (magic {bytes(magic)!r}, v{version})")
    start = PREAMBLE.size + name_bytes
    end = start + count * GRANT.size
    if end > len(view):
        raise BatchFramingError(f"acquire answer ends inside its {count} grants")
    try:
        consumer = bytes(view[PREAMBLE.size : start]).decode()
    except UnicodeDecodeError as e:
        raise BatchFramingError(f"consumer id is not UTF-8: {e}") from e
    grants = list(GRANT.iter_unpack(view[start:end]))
    return consumer, grants, view[end:]
