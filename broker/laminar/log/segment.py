"""A segment: one store file plus its sparse index, holding indexes [base_index, next_index)."""

from __future__ import annotations

import contextlib
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import xxhash

from .batch import (
    BATCH_HEADER,
    BATCH_HEADER_BYTES,
    BATCH_MAGIC,
    BATCH_VERSION,
    CHECKSUM_OFFSET,
    KNOWN_ATTRIBUTES,
    Buffer,
)
from .errors import (
    CorruptBatchError,
    SegmentError,
    SegmentIndexError,
    StorageError,
    StoreError,
)
from .index import SegmentIndex
from .storage import Directory, DirectWrite, FileStorage, Storage
from .store import Store

STORE_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
BASE_INDEX_DIGITS = 20


def store_name(base_index: int) -> str:
    return f"{base_index:0{BASE_INDEX_DIGITS}d}{STORE_SUFFIX}"


def index_name(base_index: int) -> str:
    return f"{base_index:0{BASE_INDEX_DIGITS}d}{INDEX_SUFFIX}"


def parse_segment_name(name: str) -> tuple[int, str] | None:
    """(base_index, suffix) for a segment file name, else None."""
    for suffix in (STORE_SUFFIX, INDEX_SUFFIX):
        stem = name[: -len(suffix)]
        if name.endswith(suffix) and len(stem) == BASE_INDEX_DIGITS and stem.isdigit():
            return int(stem), suffix
    return None


@dataclass(frozen=True, slots=True)
class SegmentRecovery:
    """What opening a segment had to do."""

    base_index: int
    index_rebuilt: bool
    header_repaired: bool  # the store header was damaged and rewritten from the file name
    cut_bytes: int  # bytes cut from the end of the store (torn or damaged)
    cut_reason: str | None
    corrupt_indexes: tuple[int, ...]  # first indexes of damaged batches or spans, never served
    #: (index, term) of the last valid record beyond damage that the cut removed (see
    #: `ScanResult.lost_last`)
    lost_last: tuple[int, int] | None = None
    #: the cut removed damaged bytes that were all written, not a torn write at the end
    damaged: bool = False


@dataclass(slots=True)
class PendingBatches:
    """What a `LogWrite` adds to one segment until it publishes it: the batches (relative
    index, position, term, largest record timestamp) and the segment's end after them."""

    next_index: int
    size: int
    added: list[tuple[int, int, int, int]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ReadResult:
    data: bytes
    first_index: int  # base index of the first batch in data
    next_index: int  # index after the last record in data
    batch_count: int


class Segment:
    """Store + index of one segment. Not thread-safe; the segmented log serialises calls."""

    def __init__(
        self, directory: Directory, store: Store, index: SegmentIndex, next_index: int
    ) -> None:
        self.directory = directory
        self.store = store
        self.index = index
        self.base_index = store.base_index
        self.next_index = next_index
        #: the store's bytes as the log knows them: whole batches only (bytes a `LogWrite`
        #: is writing past it are not part of the segment until it publishes them)
        self._size = store.size
        # True while the .index file on disk matches this segment; cleared before any change.
        self._index_file_current = False
        self._index_storage: Storage | None = None

    # ---- lifecycle -------------------------------------------------------------------------

    @classmethod
    def create(cls, directory: Directory, base_index: int, now_ms: int, *, sync: bool) -> Segment:
        try:
            storage = directory.open(store_name(base_index), create=True)
            store = Store.create(storage, base_index, now_ms)
            if sync:
                store.sync()
        except (StorageError, StoreError) as e:
            raise SegmentError(f"cannot create segment {base_index}: {e}") from e
        return cls(directory, store, SegmentIndex(), base_index)

    @classmethod
    def open(
        cls,
        directory: Directory,
        base_index: int,
        max_batch_bytes: int,
        *,
        sealed_next_index: int | None,
        now_ms: int,
    ) -> tuple[Segment, SegmentRecovery]:
        """Open a segment, trusting its index file only if it matches the store exactly.

        Without a current index the store is scanned (see `Store.scan`): the last segment
        (`sealed_next_index` None) is cut at its first torn or corrupt batch; a segment
        followed by another, which must end at `sealed_next_index`, keeps damaged batches
        and spans as entries that reads refuse.
        """
        try:
            storage = directory.open(store_name(base_index), create=False)
            store, header_repaired = Store.open(storage, base_index, repair_ms=now_ms)
        except (StorageError, StoreError) as e:
            raise SegmentError(f"cannot open segment {base_index}: {e}") from e
        segment = cls(directory, store, SegmentIndex(), base_index)
        if index_name(base_index) in directory.names():
            try:
                segment._index_storage = directory.open(index_name(base_index), create=False)
                index, next_index = SegmentIndex.load(
                    segment._index_storage, base_index, store.size
                )
            except (StorageError, SegmentIndexError):
                # Not this store's index: empty it so that it can never match again.
                if segment._index_storage is not None:
                    with contextlib.suppress(StorageError):
                        segment._index_storage.truncate(0)
            else:
                segment.index = index
                segment._index_file_current = True
                segment.next_index = next_index
                return segment, SegmentRecovery(base_index, False, header_repaired, 0, None, ())
        scan = store.scan(base_index, max_batch_bytes, sealed_next_index=sealed_next_index)
        cut_bytes = store.size - scan.end_position
        if cut_bytes:
            store.truncate(scan.end_position)
            segment._size = store.size
        segment.index = SegmentIndex.from_scan(
            base_index, scan.positions, scan.base_indexes, scan.terms, scan.timestamps
        )
        segment.next_index = scan.next_index
        recovery = SegmentRecovery(
            base_index,
            True,
            header_repaired,
            cut_bytes,
            scan.stop_reason,
            tuple(scan.corrupt_indexes),
            scan.lost_last,
            scan.damaged,
        )
        return segment, recovery

    def close(self) -> None:
        self.store.close()
        if self._index_storage is not None:
            self._index_storage.close()

    def remove_files(self) -> None:
        """Close and delete this segment's files (the caller syncs the directory)."""
        self.close()
        try:
            self.directory.remove(index_name(self.base_index))
            self.directory.remove(store_name(self.base_index))
        except StorageError as e:
            raise SegmentError(f"cannot remove segment {self.base_index}: {e}") from e

    # ---- state -----------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Bytes of the store, header included, as far as they hold published batches."""
        return self._size

    @property
    def is_empty(self) -> bool:
        return self.next_index == self.base_index

    @property
    def sealed(self) -> bool:
        return self.store.sealed_ms != 0

    def slot_of(self, index: int) -> int:
        return self.index.slot_of(index - self.base_index)

    def batch_range(self, slot: int) -> tuple[int, int]:
        """[base, next) indexes of the batch in `slot`."""
        starts = self.index.starts
        base = self.base_index + starts[slot]
        end = self.base_index + starts[slot + 1] if slot + 1 < len(starts) else self.next_index
        return base, end

    def term_of_slot(self, slot: int) -> int:
        return self.index.terms[slot]

    def batch_end(self, slot: int) -> int:
        """The store position just after the batch in `slot`."""
        positions = self.index.positions
        return positions[slot + 1] if slot + 1 < len(positions) else self._size

    # ---- writes ----------------------------------------------------------------------------

    def _before_change(self) -> None:
        """The on-disk index stops describing the segment once it changes: void it first."""
        if self._index_file_current and self._index_storage is not None:
            try:
                self._index_storage.truncate(0)
                self._index_storage.sync()
            except StorageError as e:
                raise SegmentError(f"cannot invalidate index of {self.base_index}: {e}") from e
        self._index_file_current = False

    def append(
        self, parts: Sequence[Buffer], record_count: int, term: int, timestamp_ms: int
    ) -> int:
        """Append one stamped batch (header + payload parts) whose base index is next_index;
        `timestamp_ms`: its largest record timestamp (NO_TIMESTAMP_MS for a control batch)."""
        position = self._size
        self.write_at(position, parts)
        self.index.add(self.next_index - self.base_index, position, term, timestamp_ms)
        self.next_index += record_count
        self._size = position + sum(len(part) for part in parts)
        return position

    def write_at(self, position: int, parts: Sequence[Buffer]) -> None:
        """Raw write for streaming appends; `commit_streamed` makes it a batch."""
        self._before_change()
        try:
            self.store.write_at(position, parts)
        except StoreError as e:
            raise SegmentError(f"write to segment {self.base_index} failed: {e}") from e

    def commit_streamed(
        self, position: int, record_count: int, term: int, timestamp_ms: int
    ) -> None:
        self.index.add(self.next_index - self.base_index, position, term, timestamp_ms)
        self.next_index += record_count
        self._size = self.store.size

    def publish(
        self, added: Sequence[tuple[int, int, int, int]], next_index: int, size: int
    ) -> None:
        """Make batches a `LogWrite` wrote (off the event loop) part of the segment: `added`
        (relative index, position, term, largest record timestamp) each, ending at
        `next_index` and `size` bytes."""
        index = self.index
        for relative_index, position, term, timestamp_ms in added:
            index.add(relative_index, position, term, timestamp_ms)
        self.next_index = next_index
        self._size = size

    def cut_store(self, position: int) -> None:
        """Drop store bytes from `position` on (abort of a streaming append)."""
        try:
            self.store.truncate(position)
        except StoreError as e:
            raise SegmentError(f"rollback of segment {self.base_index} failed: {e}") from e

    def truncate(self, index: int) -> None:
        """Remove indexes >= `index`, which must be a batch base in this segment or next_index."""
        if index == self.next_index:
            return
        slot = self.slot_of(index)
        assert self.batch_range(slot)[0] == index
        self._before_change()
        try:
            self.store.truncate(self.index.positions[slot])
            if self.sealed:
                self.store.set_sealed(0)
        except StoreError as e:
            raise SegmentError(f"truncate of segment {self.base_index} failed: {e}") from e
        self.index.truncate(slot)
        self.next_index = index
        self._size = self.store.size

    def direct(
        self,
        writes: Sequence[tuple[int, Sequence[Buffer]]],
        *,
        sync: bool,
        then: Callable[[], None] | None = None,
        writeback: bool = False,
    ) -> DirectWrite | None:
        """`write_at` each of `writes`, then `sync` if asked (`writeback`: see
        `FileStorage.direct`), as a DirectWrite for threads to run; None where only the Python
        path can: a store that is not a real file, or writes to a segment whose index file
        must first be voided."""
        storage = self.store.storage
        if not isinstance(storage, FileStorage) or (writes and self._index_file_current):
            return None
        return storage.direct(writes, sync=sync, then=then, writeback=writeback)

    def sync(self) -> None:
        try:
            self.store.sync()
        except StoreError as e:
            raise SegmentError(f"sync of segment {self.base_index} failed: {e}") from e

    def save_index(self, *, sync: bool, pending: PendingBatches | None = None) -> bool:
        """Write the index file for the segment as it is now, or as it will be once `pending`
        batches are published. True if a new file was created."""
        if self._index_file_current:
            return False
        index, next_index, size = self.index, self.next_index, self._size
        if pending is not None:
            index = index.copy()
            for relative_index, position, term, timestamp_ms in pending.added:
                index.add(relative_index, position, term, timestamp_ms)
            next_index, size = pending.next_index, pending.size
        created = False
        try:
            if self._index_storage is None:
                name = index_name(self.base_index)
                created = name not in self.directory.names()
                self._index_storage = self.directory.open(name, create=created)
            index.save(self._index_storage, self.base_index, next_index, size, sync=sync)
        except (StorageError, SegmentIndexError) as e:
            raise SegmentError(f"cannot save index of segment {self.base_index}: {e}") from e
        self._index_file_current = True
        return created

    def seal(self, now_ms: int, *, sync: bool, pending: PendingBatches | None = None) -> bool:
        """Record the seal time, make the store durable and write the index file (describing
        the `pending` batches too: a `LogWrite` rolling off the event loop)."""
        try:
            self.store.set_sealed(now_ms)
            if sync:
                self.store.sync()
        except StoreError as e:
            raise SegmentError(f"cannot seal segment {self.base_index}: {e}") from e
        self._index_file_current = False
        return self.save_index(sync=sync, pending=pending)

    # ---- reads -----------------------------------------------------------------------------

    def read(self, index: int, max_bytes: int, end_index: int) -> ReadResult:
        """Whole batches from the one holding `index`: at most `max_bytes` (but at least one
        batch), only batches that end at or before `end_index`, each checksum-verified.

        Raises CorruptBatchError if the first batch is damaged; a damaged later batch ends the
        read before it.
        """
        index_columns = self.index
        positions, starts = index_columns.positions, index_columns.starts
        count = len(positions)
        first = self.slot_of(index)
        start_position = positions[first]
        # Batches first..last_slot-1 fit both limits; the first batch is served regardless of
        # max_bytes so that a reader always makes progress.
        byte_limit = start_position + max(max_bytes, 0)
        by_bytes = bisect_right(positions, byte_limit, lo=first + 1) - 1
        if by_bytes == count - 1 and self._size <= byte_limit:
            by_bytes = count
        by_bytes = max(by_bytes, first + 1)
        end_relative = end_index - self.base_index
        by_index = bisect_right(starts, end_relative, lo=first + 1) - 1
        if by_index == count - 1 and self.next_index <= end_index:
            by_index = count
        last_slot = min(by_bytes, by_index)
        if last_slot <= first:
            return ReadResult(b"", self.base_index + starts[first], index, 0)
        end_position = self.batch_end(last_slot - 1)
        try:
            data = self.store.read(start_position, end_position - start_position)
        except StoreError as e:
            raise SegmentError(f"read of segment {self.base_index} failed: {e}") from e
        good = self._verified_prefix(data, first, last_slot)
        if good == first:
            raise CorruptBatchError(
                f"batch {self.base_index + starts[first]} in segment {self.base_index} is "
                "corrupt (checksum or framing)",
                index=self.base_index + starts[first],
                segment_base_index=self.base_index,
            )
        if good < last_slot:
            data = data[: positions[good] - start_position]
        next_index = self.base_index + starts[good] if good < count else self.next_index
        return ReadResult(data, self.base_index + starts[first], next_index, good - first)

    def _verified_prefix(self, data: bytes, first: int, last_slot: int) -> int:
        """The first slot in [first, last_slot) whose batch fails to verify, else last_slot.

        Per batch: one header unpack and the two hashes of the checksum; this loop bounds read
        throughput for small batches, so it stays lean.
        """
        positions, starts = self.index.positions, self.index.starts
        view = memoryview(data)
        origin = positions[first]
        base_index = self.base_index
        unpack = BATCH_HEADER.unpack_from
        digest = xxhash.xxh3_64_intdigest
        for slot in range(first, last_slot):
            offset = positions[slot] - origin
            end = self.batch_end(slot) - origin
            if end - offset < BATCH_HEADER_BYTES:
                return slot
            magic, version, attributes, base, _, payload_bytes, *_, checksum = unpack(view, offset)
            if (
                magic != BATCH_MAGIC
                or version != BATCH_VERSION
                or attributes & ~KNOWN_ATTRIBUTES
                or base != base_index + starts[slot]
                or BATCH_HEADER_BYTES + payload_bytes != end - offset
                or digest(
                    view[offset : offset + CHECKSUM_OFFSET],
                    seed=digest(view[offset + BATCH_HEADER_BYTES : end]),
                )
                != checksum
            ):
                return slot
        return last_slot
