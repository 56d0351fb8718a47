"""A segment's sparse index: one entry per batch, relative index → 64-bit position and term.

In memory it is three parallel `array('Q')` columns searched with bisect. On disk,
`<base_index:020d>.index` is written whole when a segment is sealed or the log closes cleanly:
a checksummed header (base and next index, entry count, the store size it describes), then
interleaved (relative_index, position, term) u64 entries. The file is a cache: it is trusted
only if its checksum, base index and store size match, and otherwise rebuilt from the store.
It is never fsynced on the append path.
"""

from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_right
from collections.abc import Sequence

import xxhash

from .errors import SegmentIndexError, StorageError
from .storage import Storage

INDEX_MAGIC = b"LMQI"
INDEX_VERSION = 1
# magic, version, flags, base index, next index, entry count, store size, xxh3-64
INDEX_HEADER = struct.Struct("<4sHHQQQQQ")
INDEX_HEADER_BYTES = INDEX_HEADER.size
INDEX_ENTRY_FIELDS = 3
INDEX_ENTRY_BYTES = 8 * INDEX_ENTRY_FIELDS


class SegmentIndex:
    """Relative index → (position, term) for every batch of one segment."""

    __slots__ = ("positions", "starts", "terms")

    def __init__(self) -> None:
        self.starts = array("Q")  # base index of each batch, relative to the segment base
        self.positions = array("Q")  # byte position of each batch in the store
        self.terms = array("Q")

    def __len__(self) -> int:
        return len(self.starts)

    def add(self, relative_index: int, position: int, term: int) -> None:
        self.starts.append(relative_index)
        self.positions.append(position)
        self.terms.append(term)

    def copy(self) -> SegmentIndex:
        index = SegmentIndex()
        index.starts = array("Q", self.starts)
        index.positions = array("Q", self.positions)
        index.terms = array("Q", self.terms)
        return index

    def slot_of(self, relative_index: int) -> int:
        """The slot of the batch holding `relative_index` (which must be inside the segment)."""
        return bisect_right(self.starts, relative_index) - 1

    def truncate(self, slots: int) -> None:
        """Keep the first `slots` entries."""
        del self.starts[slots:]
        del self.positions[slots:]
        del self.terms[slots:]

    @classmethod
    def from_scan(
        cls,
        base_index: int,
        positions: Sequence[int],
        base_indexes: Sequence[int],
        terms: Sequence[int],
    ) -> SegmentIndex:
        index = cls()
        index.positions = array("Q", positions)
        index.starts = array("Q", [b - base_index for b in base_indexes])
        index.terms = array("Q", terms)
        return index

    def encode(self, base_index: int, next_index: int, store_size: int) -> bytes:
        count = len(self.starts)
        entries = array("Q", bytes(INDEX_ENTRY_BYTES * count))
        entries[0::INDEX_ENTRY_FIELDS] = self.starts
        entries[1::INDEX_ENTRY_FIELDS] = self.positions
        entries[2::INDEX_ENTRY_FIELDS] = self.terms
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
