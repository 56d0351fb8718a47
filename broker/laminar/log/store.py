"""A segment's store file, `<base_index:020d>.log`: a small header followed by whole batches.

The header (STORE_HEADER_BYTES) carries the segment's base index, its creation time and, once
sealed, the wall time of sealing; that is the segment age retention uses, so a restart does not
reset it. Batches follow back to back; their positions are 64-bit.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import xxhash

from .batch import (
    BATCH_HEADER_BYTES,
    BATCH_MAGIC,
    CHECKSUM_OFFSET,
    BatchHeader,
    Buffer,
    header_checksum,
    parse_header,
    payload_hash,
)
from .errors import BatchError, StorageError, StoreError
from .index import NO_TIMESTAMP_MS
from .storage import Storage

STORE_MAGIC = b"LMQS"
STORE_VERSION = 1
STORE_HEADER = struct.Struct("<4sHHQqqQ")  # magic, version, flags, base, created, sealed, xxh3
STORE_HEADER_BYTES = STORE_HEADER.size
SCAN_CHUNK_BYTES = 1 << 20
MAX_INDEX = (1 << 63) - 1


@dataclass(slots=True)
class ScanResult:
    """What a scan of a store found: index entries up to `end_position`, and why it stopped.

    Entries are whole batches, except that a sealed-segment scan may add a *hole*: a damaged
    span that frames no batch, entered under the indexes it hides so that reads refuse it.
    """

    positions: list[int] = field(default_factory=list)
    base_indexes: list[int] = field(default_factory=list)
    terms: list[int] = field(default_factory=list)
    #: each batch's largest record timestamp (NO_TIMESTAMP_MS: a control batch, a hole)
    timestamps: list[int] = field(default_factory=list)
    next_index: int = 0
    end_position: int = STORE_HEADER_BYTES
    #: None when the scan reached the end of the store; else why the bytes after end_position
    #: are not batches (torn write, bad framing, checksum failure).
    stop_reason: str | None = None
    #: first indexes of batches (or holes) that fail verification, kept but never served
    corrupt_indexes: list[int] = field(default_factory=list)
    #: Active segment: (index, term) of the last record of valid batches found *after* the
    #: damage where the scan stopped. Set, the damage is not a torn write at the end (which
    #: only loses bytes that were never all written) but lies inside data written later, so
    #: cutting there loses records that may have been synced and acknowledged.
    lost_last: tuple[int, int] | None = None
    #: Active segment: the scan stopped at damage to bytes that were all written (not a
    #: torn write at the end): what is cut from there may have been synced
    damaged: bool = False


class Store:
    """The store file of one segment."""

    def __init__(self, storage: Storage, base_index: int, created_ms: int, sealed_ms: int) -> None:
        self.storage = storage
        self.base_index = base_index
        self.created_ms = created_ms
        self.sealed_ms = sealed_ms
        self._read_ahead: tuple[int, bytes] = (0, b"")

    @classmethod
    def create(cls, storage: Storage, base_index: int, created_ms: int) -> Store:
        store = cls(storage, base_index, created_ms, 0)
        store._write_header()
        return store

    @classmethod
    def open(cls, storage: Storage, base_index: int, *, repair_ms: int) -> tuple[Store, bool]:
        """Open a store; a damaged header is rewritten (base index from the file name, times
        `repair_ms`, sealed unless empty) rather than losing the batches behind it.

        Returns the store and whether its header was repaired.
        """
        if storage.size < STORE_HEADER_BYTES:
            raise StoreError(f"{storage.name}: no store header ({storage.size} bytes)")
        try:
            raw = storage.read(0, STORE_HEADER_BYTES)
        except StorageError as e:
            raise StoreError(f"{storage.name}: {e}") from e
        magic, version, _flags, base, created_ms, sealed_ms, checksum = STORE_HEADER.unpack(raw)
        if magic == STORE_MAGIC and checksum == xxhash.xxh3_64_intdigest(raw[:-8]):
            if version != STORE_VERSION:
                raise StoreError(f"{storage.name}: unsupported store version {version}")
            if base != base_index:
                raise StoreError(f"{storage.name}: header says base index {base}")
            return cls(storage, base, created_ms, sealed_ms), False
        sealed_ms = repair_ms if storage.size > STORE_HEADER_BYTES else 0
        store = cls(storage, base_index, repair_ms, sealed_ms)
        store._write_header()
        return store, True

    def _write_header(self) -> None:
        prefix = STORE_HEADER.pack(
            STORE_MAGIC, STORE_VERSION, 0, self.base_index, self.created_ms, self.sealed_ms, 0
        )[:-8]
        checksum = xxhash.xxh3_64_intdigest(prefix).to_bytes(8, "little")
        self._write(0, (prefix, checksum))

    @property
    def size(self) -> int:
        return self.storage.size

    def set_sealed(self, sealed_ms: int) -> None:
        """Record (or with 0, clear) the time this segment was sealed."""
        self.sealed_ms = sealed_ms
        self._write_header()

    def append(self, parts: Sequence[Buffer]) -> int:
        position = self.storage.size
        self._write(position, parts)
        return position

    def write_at(self, position: int, parts: Sequence[Buffer]) -> None:
        self._write(position, parts)

    def _write(self, position: int, parts: Sequence[Buffer]) -> None:
        try:
            self.storage.write(position, parts)
        except StorageError as e:
            raise StoreError(f"{self.storage.name}: {e}") from e

    def read(self, position: int, length: int) -> bytes:
        try:
            return self.storage.read(position, length)
        except StorageError as e:
            raise StoreError(f"{self.storage.name}: {e}") from e

    def truncate(self, position: int) -> None:
        assert position >= STORE_HEADER_BYTES
        try:
            self.storage.truncate(position)
        except StorageError as e:
            raise StoreError(f"{self.storage.name}: {e}") from e

    def sync(self) -> None:
        try:
            self.storage.sync()
        except StorageError as e:
            raise StoreError(f"{self.storage.name}: {e}") from e

    def close(self) -> None:
        self.storage.close()

    def scan(
        self,
        start_index: int,
        max_batch_bytes: int,
        *,
        sealed_next_index: int | None = None,
    ) -> ScanResult:
        """Walk the batches of the store, checking framing, base indexes and checksums.

        Active segment (`sealed_next_index` None): stop at the first torn or corrupt batch;
        the caller cuts there. Sealed segment, whose records must end at `sealed_next_index`:
        keep going past damage: resynchronise at the next valid batch (or the end of the
        store) and enter the damaged span as a hole that reads refuse.
        """
        result = ScanResult(next_index=start_index)
        position = STORE_HEADER_BYTES
        end = self.size
        self._read_ahead = (0, b"")
        while position < end:
            found = self._batch_at(position, result.next_index, max_batch_bytes)
            if isinstance(found, tuple) and found[1]:
                header = found[0]
                self._add(
                    result,
                    position,
                    header.base_index,
                    header.term,
                    header.next_index,
                    position + header.batch_bytes,
                    NO_TIMESTAMP_MS if header.is_control else header.max_timestamp_ms,
                )
                position += header.batch_bytes
                continue
            if isinstance(found, str):
                reason = found
            else:
                reason = f"checksum mismatch in batch {result.next_index}"
            if sealed_next_index is None:
                result.stop_reason = reason
                result.lost_last = self._last_record_after(position + 1, max_batch_bytes, result)
                result.damaged = result.lost_last is not None or not self._torn(position)
                break
            # Nothing in a damaged batch's header can be trusted, its record count included:
            # the next valid batch (or the next segment) says where the damage ends.
            resync = self._next_valid_batch(
                position + 1, max_batch_bytes, result.next_index, sealed_next_index
            )
            hole_end, hole_next_index = resync or (end, sealed_next_index)
            if hole_next_index <= result.next_index:
                result.stop_reason = reason
                break
            result.corrupt_indexes.append(result.next_index)
            self._add(
                result, position, result.next_index, 0, hole_next_index, hole_end, NO_TIMESTAMP_MS
            )
            position = hole_end
        self._read_ahead = (0, b"")
        return result

    def _scan_read(self, position: int, length: int) -> bytes | memoryview:
        """Read for scans through a SCAN_CHUNK_BYTES read-ahead buffer (small batches)."""
        start, buffer = self._read_ahead
        if not start <= position or position + length > start + len(buffer):
            if length >= SCAN_CHUNK_BYTES:
                return self.read(position, length)
            buffer = self.read(position, min(SCAN_CHUNK_BYTES, self.size - position))
            start = position
            self._read_ahead = (start, buffer)
        return memoryview(buffer)[position - start : position - start + length]

    @staticmethod
    def _add(
        result: ScanResult,
        position: int,
        base: int,
        term: int,
        next_index: int,
        end: int,
        timestamp_ms: int,
    ) -> None:
        result.positions.append(position)
        result.base_indexes.append(base)
        result.terms.append(term)
        result.timestamps.append(timestamp_ms)
        result.next_index = next_index
        result.end_position = end

    def _batch_at(
        self, position: int, expected_index: int, max_batch_bytes: int
    ) -> tuple[BatchHeader, bool] | str:
        """(header, checksum ok) of the batch framed at `position`, or why none is."""
        end = self.size
        try:
            header = parse_header(
                self._scan_read(position, min(BATCH_HEADER_BYTES, end - position))
            )
        except BatchError as e:
            return f"bad framing at byte {position}: {e}"
        if header.base_index != expected_index:
            return (
                f"batch at byte {position} has base index {header.base_index}, "
                f"expected {expected_index}"
            )
        if header.batch_bytes > max_batch_bytes or position + header.batch_bytes > end:
            return (
                f"batch {expected_index} at byte {position} claims {header.batch_bytes} "
                f"bytes, {end - position} remain (torn write)"
            )
        view = memoryview(self._scan_read(position, header.batch_bytes))
        digest = payload_hash(view[BATCH_HEADER_BYTES:])
        return header, header_checksum(view[:CHECKSUM_OFFSET], digest) == header.checksum

    def _torn(self, position: int) -> bool:
        """Does the batch at `position` look cut short, as a write that did not finish leaves
        it (too few bytes for its header, or for the length its header declares)? Anything
        else at the end of a store (a whole batch failing its checksum, a header that does
        not parse) is damage to bytes that were all written."""
        remaining = self.size - position
        if remaining < BATCH_HEADER_BYTES:
            return True
        try:
            header = parse_header(self._scan_read(position, BATCH_HEADER_BYTES))
        except BatchError:
            return False
        return header.batch_bytes > remaining

    def _last_record_after(
        self, from_position: int, max_batch_bytes: int, result: ScanResult
    ) -> tuple[int, int] | None:
        """(index, term) of the last record of the valid batches after damage at
        `result.next_index`, resynchronising past further damage; None if none follows."""
        last = None
        above = result.next_index
        position = from_position
        while found := self._next_valid_batch(position, max_batch_bytes, above, MAX_INDEX):
            position, expected = found
            while position < self.size:
                batch = self._batch_at(position, expected, max_batch_bytes)
                if isinstance(batch, str) or not batch[1]:
                    break
                header = batch[0]
                last = (header.next_index - 1, header.term)
                position += header.batch_bytes
                expected = header.next_index
            above = expected
            position += 1
        self._read_ahead = (0, b"")
        return last

    def _next_valid_batch(
        self, from_position: int, max_batch_bytes: int, above_index: int, below_index: int
    ) -> tuple[int, int] | None:
        """(position, base index) of the next checksum-valid batch after damage whose base
        index lies in (above_index, below_index), else None."""
        end = self.size
        position = from_position
        while position < end:
            chunk = self.read(position, min(SCAN_CHUNK_BYTES, end - position))
            offset = chunk.find(BATCH_MAGIC)
            while offset >= 0:
                candidate = position + offset
                try:
                    header = parse_header(self.read(candidate, BATCH_HEADER_BYTES))
                except (BatchError, StoreError):
                    header = None
                if (
                    header is not None
                    and above_index < header.base_index < below_index
                    and header.batch_bytes <= min(max_batch_bytes, end - candidate)
                ):
                    found = self._batch_at(candidate, header.base_index, max_batch_bytes)
                    if not isinstance(found, str) and found[1]:
                        return candidate, header.base_index
                offset = chunk.find(BATCH_MAGIC, offset + 1)
            position += max(1, len(chunk) - len(BATCH_MAGIC) + 1)
        return None
