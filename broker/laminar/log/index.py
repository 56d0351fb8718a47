"""A segment's sparse index: one entry per batch, relative index → 64-bit position, term and
the time index.

In memory it is four parallel arrays searched with bisect. The fourth, `max_timestamps`, is
Kafka's time index made dense: for each batch, the largest record timestamp of the segment's
record batches up to and including it (`NO_TIMESTAMP_MS` before the first; control batches and
damaged spans add nothing). It never decreases, so the first batch holding a record at or
after a time T is found by bisecting it, although producers' timestamps may go back and forth
(`SegmentedLog.index_at_time`).

On disk, `<base_index:020d>.index` is written whole when a segment is sealed or the log closes
cleanly: a checksummed header (base and next index, entry count, the store size it describes),
then interleaved (relative_index, position, term, max_timestamp) 64-bit entries. The file is a
cache: it is trusted only if its version, checksum, base index and store size match, and
otherwise rebuilt from the store (an index file of version 1, which had no time column, is
rebuilt once). It is never fsynced on the append path.
"""

from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import accumulate

import xxhash

from .errors import SegmentIndexError, StorageError
from .storage import Storage

INDEX_MAGIC = b"LMQI"
INDEX_VERSION = 2
# magic, version, flags, base index, next index, entry count, store size, xxh3-64
INDEX_HEADER = struct.Struct("<4sHHQQQQQ")
INDEX_HEADER_BYTES = INDEX_HEADER.size
INDEX_ENTRY_FIELDS = 4
INDEX_ENTRY_BYTES = 8 * INDEX_ENTRY_FIELDS
#: The time index before the segment's first record batch (record timestamps are >= 0); also
#: what a control batch or a damaged span contributes.
NO_TIMESTAMP_MS = -1


class SegmentIndex:
    """Relative index → (position, term, time index) for every batch of one segment."""

    __slots__ = ("max_timestamps", "positions", "starts", "terms")

    def __init__(self) -> None:
        self.starts = array("Q")  # base index of each batch, relative to the segment base
        self.positions = array("Q")  # byte position of each batch in the store
        self.terms = array("Q")
        #: the largest record timestamp of the record batches up to each (non-decreasing)
        self.max_timestamps = array("q")

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def max_timestamp_ms(self) -> int:
        """The largest record timestamp in the segment (NO_TIMESTAMP_MS: no record batch)."""
        return self.max_timestamps[-1] if self.max_timestamps else NO_TIMESTAMP_MS

    def add(self, relative_index: int, position: int, term: int, timestamp_ms: int) -> None:
        """One more batch; `timestamp_ms` is its largest record timestamp (NO_TIMESTAMP_MS for
        a control batch)."""
        self.starts.append(relative_index)
        self.positions.append(position)
        self.terms.append(term)
        self.max_timestamps.append(max(timestamp_ms, self.max_timestamp_ms))

    def copy(self) -> SegmentIndex:
        index = SegmentIndex()
        index.starts = array("Q", self.starts)
        index.positions = array("Q", self.positions)
        index.terms = array("Q", self.terms)
        index.max_timestamps = array("q", self.max_timestamps)
        return index

    def slot_of(self, relative_index: int) -> int:
        """The slot of the batch holding `relative_index` (which must be inside the segment)."""
        return bisect_right(self.starts, relative_index) - 1

    def slot_at_time(self, timestamp_ms: int) -> int | None:
        """The slot of the first record batch holding a record whose timestamp is at or after
        `timestamp_ms`, by the batches' largest timestamps (None: no such batch here)."""
        slot = bisect_left(self.max_timestamps, timestamp_ms)
        return slot if slot < len(self.max_timestamps) else None

    def truncate(self, slots: int) -> None:
        """Keep the first `slots` entries."""
        del self.starts[slots:]
        del self.positions[slots:]
        del self.terms[slots:]
        del self.max_timestamps[slots:]

    @classmethod
    def from_scan(
        cls,
        base_index: int,
        positions: Sequence[int],
        base_indexes: Sequence[int],
        terms: Sequence[int],
        timestamps: Sequence[int],
    ) -> SegmentIndex:
        """The index of a scanned store; `timestamps` are each batch's own largest record
        timestamp (NO_TIMESTAMP_MS for control batches and damaged spans)."""
        index = cls()
        index.positions = array("Q", positions)
        index.starts = array("Q", [b - base_index for b in base_indexes])
        index.terms = array("Q", terms)
        index.max_timestamps = array("q", accumulate(timestamps, max, initial=NO_TIMESTAMP_MS))
        del index.max_timestamps[0]
        return index

    def encode(self, base_index: int, next_index: int, store_size: int) -> bytes:
        count = len(self.starts)
        entries = array("Q", bytes(INDEX_ENTRY_BYTES * count))
        entries[0::INDEX_ENTRY_FIELDS] = self.starts
        entries[1::INDEX_ENTRY_FIELDS] = self.positions
        entries[2::INDEX_ENTRY_FIELDS] = self.terms
        entries[3::INDEX_ENTRY_FIELDS] = array("Q", self.max_timestamps.tobytes())
        if sys.byteorder != "little":
            entries.byteswap()
        body = entries.tobytes()
        fields = (INDEX_MAGIC, INDEX_VERSION, 0, base_index, next_index, count, store_size, 0)
        prefix = INDEX_HEADER.pack(*fields)[:-8]
        digest = xxhash.xxh3_64(prefix)
        digest.update(body)
        return prefix + digest.intdigest().to_bytes(8, "little") + body

    @classmethod
    def decode(cls, data: bytes, base_index: int, store_size: int) -> tuple[SegmentIndex, int]:
        """Parse an index file into (index, next_index); SegmentIndexError unless it describes
        exactly this store."""
        if len(data) < INDEX_HEADER_BYTES:
            raise SegmentIndexError(f"index file of {len(data)} bytes has no header")
        magic, version, _flags, base, next_index, count, size, checksum = INDEX_HEADER.unpack_from(
            data
        )
        if magic != INDEX_MAGIC or version != INDEX_VERSION:
            raise SegmentIndexError("bad index magic or version")
        if len(data) != INDEX_HEADER_BYTES + count * INDEX_ENTRY_BYTES:
            raise SegmentIndexError(f"index file length {len(data)} does not fit {count} entries")
        digest = xxhash.xxh3_64(data[: INDEX_HEADER_BYTES - 8])
        digest.update(memoryview(data)[INDEX_HEADER_BYTES:])
        if digest.intdigest() != checksum:
            raise SegmentIndexError("index checksum mismatch")
        if base != base_index or size != store_size:
            raise SegmentIndexError(
                f"index describes base {base} size {size}, store is base {base_index} "
                f"size {store_size}"
            )
        entries = array("Q")
        entries.frombytes(memoryview(data)[INDEX_HEADER_BYTES:])
        if sys.byteorder != "little":
            entries.byteswap()
        index = cls()
        index.starts = entries[0::INDEX_ENTRY_FIELDS]
        index.positions = entries[1::INDEX_ENTRY_FIELDS]
        index.terms = entries[2::INDEX_ENTRY_FIELDS]
        index.max_timestamps = array("q", entries[3::INDEX_ENTRY_FIELDS].tobytes())
        if count and not index.starts[-1] < next_index - base_index:
            raise SegmentIndexError("index next_index is not after its last batch")
        return index, next_index

    def save(
        self, storage: Storage, base_index: int, next_index: int, store_size: int, *, sync: bool
    ) -> None:
        """Replace the index file's contents with this index."""
        data = self.encode(base_index, next_index, store_size)
        try:
            storage.truncate(0)
            storage.write(0, (data,))
            if sync:
                storage.sync()
        except StorageError as e:
            raise SegmentIndexError(f"cannot write {storage.name}: {e}") from e

    @classmethod
    def load(cls, storage: Storage, base_index: int, store_size: int) -> tuple[SegmentIndex, int]:
        try:
            data = storage.read(0, storage.size)
        except StorageError as e:
            raise SegmentIndexError(f"cannot read {storage.name}: {e}") from e
        return cls.decode(data, base_index, store_size)
