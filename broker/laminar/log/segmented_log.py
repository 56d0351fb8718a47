"""The segmented log: a partition replica's ordered segments, synchronous and single-threaded.

Appends go to the last (active) segment, which rolls at `segment_bytes`. Reads return whole,
checksum-verified batches as one byte range. `truncate` cuts at a batch boundary (Raft log
repair); retention removes whole sealed segments from the front. An append does not
fdatasync what it writes (only a roll syncs the segment it seals): `sync` does, once for
everything appended before it, so a caller that writes a round of batches and then syncs once
shares one fdatasync among them (the broker's group commit, node/core.py). The fsync policy
decides only whether the log's own structural changes (recovery, rolls, truncation, retention,
reset) are synced as they happen.

Off the event loop: `begin_write` plans appends (checked and stamped) that a `LogWrite` writes
in an I/O thread (rolls included) and publishes back on the loop. Until then the log, its
end and its reads are as before, so a reader on the loop never meets a batch that is not
whole in its store; the log takes no other change while the write is in flight.

Invariants (checked on open): segments[i + 1].base_index == segments[i].next_index; only the
last segment takes appends; start_index == segments[0].base_index.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import xxhash

from .batch import (
    BATCH_HEADER_BYTES,
    CHECKSUM_OFFSET,
    BatchHeader,
    Buffer,
    header_checksum,
    iter_records,
    parse_header,
    stamp_header,
    verify_batch,
    verify_records,
)
from .config import FsyncPolicy, LogConfig
from .errors import (
    AppendInProgressError,
    AppendThresholdError,
    BatchChecksumError,
    BatchError,
    BatchFramingError,
    BatchTooLargeError,
    CorruptBatchError,
    IndexOutOfRangeError,
    LogClosedError,
    LogError,
    MalformedRecordsError,
    NotBatchBoundaryError,
    SegmentError,
    StorageError,
    StoreError,
)
from .index import NO_TIMESTAMP_MS
from .segment import (
    PendingBatches,
    ReadResult,
    Segment,
    SegmentRecovery,
    index_name,
    parse_segment_name,
    store_name,
)
from .storage import Directory, DirectWrite
from .store import Store

logger = logging.getLogger(__name__)


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_index: int
    record_count: int

    @property
    def next_index(self) -> int:
        return self.base_index + self.record_count


@dataclass(frozen=True, slots=True)
class LostRecords:
    """Records that recovery cut although they were not a torn write at the end of the log:
    damage inside data written before other data, which may have been synced (and, in a
    replicated log, acknowledged)."""

    first_index: int
    #: (index, term) of the last record cut, when the damaged files still told it
    last: tuple[int, int] | None


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What opening the log found and cut. Empty `cuts` means nothing was lost."""

    segments: tuple[SegmentRecovery, ...]
    #: human-readable descriptions of everything cut: torn tails, damaged segments
    cuts: tuple[str, ...]
    #: damage repaired without losing records (a rewritten store header)
    repairs: tuple[str, ...]
    cut_bytes: int
    #: set when the cuts removed more than a torn tail
    lost: LostRecords | None = None

    @property
    def corrupt_indexes(self) -> tuple[int, ...]:
        return tuple(i for s in self.segments for i in s.corrupt_indexes)


@dataclass(frozen=True, slots=True)
class RetentionReport:
    removed_base_indexes: tuple[int, ...]
    removed_bytes: int
    start_index: int


class SegmentedLog:
    """The ordered segments of one log directory. Not thread-safe."""

    def __init__(
        self,
        directory: Directory,
        config: LogConfig,
        clock_ms: Callable[[], int],
        segments: list[Segment],
        recovery: RecoveryReport,
    ) -> None:
        self.directory = directory
        self.config = config
        self.clock_ms = clock_ms
        self._segments = segments
        self._bases = [s.base_index for s in segments]
        self.recovery = recovery
        self._sync_writes = config.fsync is not FsyncPolicy.NEVER
        self._stream: StreamAppend | None = None
        self._write: LogWrite | None = None  # planned or in flight, until published
        self._closed = False
        #: told of every damaged batch a read finds, before the read raises
        self.on_corrupt: Callable[[CorruptBatchError], None] | None = None

    # ---- open / close ----------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: Directory,
        config: LogConfig | None = None,
        *,
        clock_ms: Callable[[], int] = wall_clock_ms,
        start_index: int = 0,
    ) -> SegmentedLog:
        """Open (or create, starting at `start_index`) the log in `directory`, recovering it."""
        config = config or LogConfig()
        sync = config.fsync is not FsyncPolicy.NEVER
        try:
            names = directory.names()
        except StorageError as e:
            raise LogError(f"cannot list the log directory: {e}") from e
        parsed = [p for p in map(parse_segment_name, names) if p is not None]
        store_bases = sorted(base for base, suffix in parsed if suffix == ".log")
        orphans = [base for base, suffix in parsed if suffix == ".index"]
        for base in set(orphans) - set(store_bases):
            directory.remove(index_name(base))

        segments: list[Segment] = []
        recoveries: list[SegmentRecovery] = []
        cuts: list[str] = []
        repairs: list[str] = []
        cut_bytes = 0
        lost: LostRecords | None = None
        limit = config.batch_limit_bytes
        for position, base in enumerate(store_bases):
            is_last = position == len(store_bases) - 1
            if segments and base != segments[-1].next_index:
                cuts.append(
                    f"segment {base} does not follow segment {segments[-1].base_index} "
                    f"(which ends at {segments[-1].next_index})"
                )
                removed = store_bases[position:]
                lost = LostRecords(segments[-1].next_index, _last_record(directory, removed, limit))
                cut_bytes += _remove_stores(directory, removed)
                break
            try:
                segment, recovery = Segment.open(
                    directory,
                    base,
                    config.batch_limit_bytes,
                    sealed_next_index=None if is_last else store_bases[position + 1],
                    now_ms=clock_ms(),
                )
            except SegmentError as e:
                cuts.append(f"segment {base} could not be opened: {e}")
                removed = store_bases[position:]
                lost = LostRecords(base, _last_record(directory, removed, limit))
                cut_bytes += _remove_stores(directory, removed)
                break
            segments.append(segment)
            recoveries.append(recovery)
            if recovery.header_repaired:
                repairs.append(f"segment {base}: damaged store header rewritten (age reset)")
            if recovery.cut_bytes:
                cuts.append(
                    f"segment {base}: cut {recovery.cut_bytes} bytes after index "
                    f"{segment.next_index}: {recovery.cut_reason}"
                )
                cut_bytes += recovery.cut_bytes
                if not is_last:
                    removed = store_bases[position + 1 :]
                    beyond = _last_record(directory, removed, limit)
                    lost = LostRecords(segment.next_index, beyond or recovery.lost_last)
                    cut_bytes += _remove_stores(directory, removed)
                    break
                if recovery.damaged:
                    lost = LostRecords(segment.next_index, recovery.lost_last)
        for segment, recovery in zip(segments, recoveries, strict=True):
            if recovery.index_rebuilt and segment.sealed:
                segment.save_index(sync=sync)
        if not segments:
            first = store_bases[0] if store_bases else start_index
            segments.append(Segment.create(directory, first, clock_ms(), sync=sync))
        elif segments[-1].sealed:
            last = segments[-1]
            if last.next_index == last.base_index:
                # sealed before a crash, then cut to nothing (damage at its first batch):
                # a new active segment takes its name
                segments.pop()
                last.remove_files()
            segments.append(Segment.create(directory, last.next_index, clock_ms(), sync=sync))
        if sync:
            # What recovery kept may sit only in the page cache after a process crash.
            segments[-1].sync()
            _sync_directory(directory)
        report = RecoveryReport(tuple(recoveries), tuple(cuts), tuple(repairs), cut_bytes, lost)
        for problem in cuts + repairs:
            logger.warning("log recovery: %s", problem)
        for segment_recovery in recoveries:
            if segment_recovery.corrupt_indexes:
                logger.warning(
                    "log recovery: segment %d has corrupt batches at %s (never served)",
                    segment_recovery.base_index,
                    list(segment_recovery.corrupt_indexes),
                )
        return cls(directory, config, clock_ms, segments, report)

    def close(self) -> None:
        """Make everything durable (unless fsync is `never`), write the active segment's
        index so the next open need not scan it, and release the files."""
        if self._closed:
            return
        if self._stream is not None:
            self._stream.abort()
        if self._write is not None:
            # never published: what it wrote past the end is cut or rescanned at the next
            # open (the index saved below describes the published end only)
            self._write.discard()
        active = self._active
        sync = self._sync_writes
        if sync:
            active.sync()
        if active.save_index(sync=sync) and sync:
            _sync_directory(self.directory)
        for segment in self._segments:
            segment.close()
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    # ---- state -----------------------------------------------------------------------------

    @property
    def _active(self) -> Segment:
        return self._segments[-1]

    @property
    def start_index(self) -> int:
        return self._segments[0].base_index

    @property
    def next_index(self) -> int:
        return self._segments[-1].next_index

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def segment_base_indexes(self) -> tuple[int, ...]:
        return tuple(self._bases)

    def _check_writable(self) -> None:
        if self._closed:
            raise LogClosedError("the log is closed")
        if self._stream is not None:
            raise AppendInProgressError("a streaming append is in progress")
        if self._write is not None:
            raise AppendInProgressError("a write is in flight (not published yet)")

    def _segment_of(self, index: int) -> Segment:
        return self._segments[bisect_right(self._bases, index) - 1]

    def _check_index(self, index: int) -> None:
        if self._closed:
            raise LogClosedError("the log is closed")
        if not self.start_index <= index < self.next_index:
            raise IndexOutOfRangeError(index, self.start_index, self.next_index)

    def term_at(self, index: int) -> int:
        """Raft term of the batch holding `index`."""
        self._check_index(index)
        segment = self._segment_of(index)
        return segment.term_of_slot(segment.slot_of(index))

    def batch_range(self, index: int) -> tuple[int, int]:
        """[base, next) of the batch holding `index`."""
        self._check_index(index)
        segment = self._segment_of(index)
        return segment.batch_range(segment.slot_of(index))

    @property
    def last_term(self) -> int:
        """Term of the last batch, 0 if the log holds none."""
        if self.next_index == self.start_index:
            return 0
        return self.term_at(self.next_index - 1)

    # ---- appends ---------------------------------------------------------------------------

    def append(
        self, batch: Buffer, *, term: int | None = None, check_records: bool = True
    ) -> AppendResult:
        """Verify one encoded batch and append it at next_index, stamping `term` if given.

        Raises BatchFramingError (MalformedRecordsError for malformed records),
        BatchChecksumError or BatchTooLargeError (log unchanged). The bytes are written but
        durable only after `sync()`. `check_records=False`: header and checksum only (Raft
        replication, see `verify_batch`).
        """
        self._check_writable()
        header, digest = verify_batch(
            batch, self.config.batch_limit_bytes, check_records=check_records
        )
        self._maybe_roll()
        active = self._active
        base_index = active.next_index
        stamp_term = header.term if term is None else term
        stamped = stamp_header(batch, base_index, stamp_term, digest)
        active.append(
            (stamped, memoryview(batch)[BATCH_HEADER_BYTES:]),
            header.record_count,
            stamp_term,
            batch_timestamp(header),
        )
        return AppendResult(base_index, header.record_count)

    def begin_stream(
        self, header_bytes: Buffer, *, append_threshold: int | None = None, term: int | None = None
    ) -> StreamAppend:
        """Start appending one batch whose payload arrives in chunks, given its 72-byte header.

        The declared size is checked against `max_batch_bytes` and `append_threshold` before
        anything is written. Feed the payload with `write`, then `commit` or `abort`.
        """
        self._check_writable()
        header = parse_header(header_bytes)
        if header.batch_bytes > self.config.batch_limit_bytes:
            raise BatchTooLargeError(
                f"batch of {header.batch_bytes} bytes exceeds "
                f"max_batch_bytes={self.config.batch_limit_bytes}"
            )
        if append_threshold is not None and header.batch_bytes > append_threshold:
            raise AppendThresholdError(
                f"batch of {header.batch_bytes} bytes exceeds append_threshold={append_threshold}"
            )
        self._maybe_roll()
        self._stream = StreamAppend(self, header, bytes(header_bytes[:BATCH_HEADER_BYTES]), term)
        return self._stream

    def begin_write(
        self,
        batches: Sequence[tuple[Buffer, int]],
        *,
        check_records: bool = True,
        checked: Sequence[tuple[BatchHeader, int] | None] = (),
    ) -> LogWrite:
        """Plan appending `batches` ((batch, term) each) at next_index, for a `LogWrite` to
        write off the event loop and publish back on it (see `LogWrite`). Each batch is
        verified as `append` does, before anything is planned (a bad one raises, the log
        unchanged), but for those whose `checked[i]` gives the header and payload digest that
        `verify_batch` gave for them already."""
        self._check_writable()
        limit = self.config.batch_limit_bytes
        planned: list[tuple[tuple[Buffer, Buffer], int, int, int]] = []
        results: list[AppendResult] = []
        next_index = self.next_index
        for i, (batch, term) in enumerate(batches):
            known = checked[i] if i < len(checked) else None
            if known is not None and known[0].batch_bytes <= limit:
                header, digest = known
            else:
                header, digest = verify_batch(batch, limit, check_records=check_records)
            stamped = stamp_header(batch, next_index, term, digest)
            parts = (stamped, memoryview(batch)[BATCH_HEADER_BYTES:])
            planned.append((parts, header.record_count, term, batch_timestamp(header)))
            results.append(AppendResult(next_index, header.record_count))
            next_index += header.record_count
        self._write = LogWrite(self, planned, results, self.clock_ms())
        return self._write

    def _maybe_roll(self) -> None:
        active = self._active
        if self._roll_due(active, active.size, active.is_empty, self.clock_ms()):
            self._roll()

    def _roll_due(self, segment: Segment, size: int, empty: bool, now_ms: int) -> bool:
        """Whether the active `segment`, holding `size` bytes (no batch if `empty`), rolls
        before its next batch."""
        if empty:
            return False
        if size >= self.config.segment_bytes:
            return True
        segment_ms = self.config.segment_ms
        return segment_ms is not None and now_ms - segment.store.created_ms >= segment_ms

    def _roll(self) -> None:
        old = self._active
        now_ms = self.clock_ms()
        old.seal(now_ms, sync=self._sync_writes)
        new = Segment.create(self.directory, old.next_index, now_ms, sync=self._sync_writes)
        self._segments.append(new)
        self._bases.append(new.base_index)
        if self._sync_writes:
            _sync_directory(self.directory)

    def sync(self) -> int:
        """fdatasync the active segment; returns the next_index that is now durable.

        Segments before the active one were synced when they rolled.
        """
        if self._closed:
            raise LogClosedError("the log is closed")
        next_index = self.next_index
        self._active.sync()
        return next_index

    def direct_sync(self, *, writeback: bool = False) -> DirectWrite | None:
        """`sync` as a DirectWrite (see `Segment.direct`, and `FileStorage.direct` for
        `writeback`), or None."""
        if self._closed:
            return None
        return self._active.direct((), sync=True, writeback=writeback)

    # ---- reads -----------------------------------------------------------------------------

    def read_range(
        self, from_index: int, max_bytes: int, end_index: int | None = None
    ) -> ReadResult:
        """Whole verified batches from the one holding `from_index`, up to `max_bytes` (at
        least one batch) and only batches ending at or before `end_index`, from one segment.

        `from_index == next_index` returns an empty result, and so does one past it but below
        `end_index` (an index its caller knows committed that is not stored here yet: a write
        in flight); beyond, or below start_index, raises IndexOutOfRangeError. A corrupt first
        batch raises CorruptBatchError.
        """
        if self._closed:
            raise LogClosedError("the log is closed")
        next_index = self.next_index
        if from_index == next_index or (
            end_index is not None and next_index < from_index < end_index
        ):
            return ReadResult(b"", from_index, from_index, 0)
        self._check_index(from_index)
        limit = self.next_index if end_index is None else min(end_index, self.next_index)
        try:
            return self._segment_of(from_index).read(from_index, max_bytes, limit)
        except CorruptBatchError as e:
            self._report(e)
            raise

    def _report(self, error: CorruptBatchError) -> None:
        if self.on_corrupt is not None:
            self.on_corrupt(error)

    def batch_headers(self, from_index: int) -> Iterator[BatchHeader]:
        """The headers of the stored batches from the one holding `from_index`, reading 72
        bytes each: payloads are neither read nor verified (bookkeeping, never serving). A
        header that does not parse raises CorruptBatchError."""
        if from_index >= self.next_index:
            return
        self._check_index(from_index)
        first = bisect_right(self._bases, from_index) - 1
        for number, segment in enumerate(self._segments[first:]):
            start = segment.slot_of(from_index) if number == 0 else 0
            positions = segment.index.positions
            for slot in range(start, len(positions)):
                try:
                    yield parse_header(segment.store.read(positions[slot], BATCH_HEADER_BYTES))
                except BatchError as e:
                    base = segment.batch_range(slot)[0]
                    error = CorruptBatchError(
                        f"batch {base} in segment {segment.base_index}: {e}",
                        index=base,
                        segment_base_index=segment.base_index,
                    )
                    self._report(error)
                    raise error from e

    def batch_base_back(self, index: int, batches: int) -> int:
        """The base index of the batch `batches` batches before the one holding `index` (or
        before the log's end, when `index` is past it); the log start when there are fewer:
        how far back a bounded walk of batch headers may start (segment indexes only)."""
        if self._closed:
            raise LogClosedError("the log is closed")
        if index <= self.start_index:
            return self.start_index
        number = bisect_right(self._bases, index) - 1
        segment = self._segments[number]
        slot = segment.slot_of(index) if index < segment.next_index else len(segment.index)
        while slot < batches:
            batches -= slot
            number -= 1
            if number < 0:
                return self.start_index
            segment = self._segments[number]
            slot = len(segment.index)
        return segment.batch_range(slot - batches)[0]

    def batch_location(self, index: int) -> tuple[str, int, int]:
        """(store file name, first byte, end byte) of the batch holding `index`, as stored
        (for tools that inspect or damage a log on purpose)."""
        self._check_index(index)
        segment = self._segment_of(index)
        slot = segment.slot_of(index)
        start = segment.index.positions[slot]
        return store_name(segment.base_index), start, segment.batch_end(slot)

    def read(self, index: int) -> ReadResult:
        """The one batch holding `index`."""
        self._check_index(index)
        try:
            return self._segment_of(index).read(index, 0, self.next_index)
        except CorruptBatchError as e:
            self._report(e)
            raise

    def index_at_time(
        self, timestamp_ms: int, end_index: int | None = None
    ) -> tuple[int, int] | None:
        """(index, timestamp) of the first record, in log order, whose timestamp is at or after
        `timestamp_ms`, among the records below `end_index` (default: the log's end); None
        when there is none (Kafka's offsets-for-times).

        Record timestamps are the producers' and may go back and forth. Each segment's time
        index keeps their running maximum (`SegmentIndex.max_timestamps`), so the first batch
        whose maximum reaches `timestamp_ms` holds the answer (every record before it is
        earlier) and its records say which one. The work is bounded: a look at each segment's
        maximum, one bisect, one batch read (verified: CorruptBatchError if it is damaged).
        A batch whose records cannot be walked (stored before appends checked records)
        answers its first index."""
        if self._closed:
            raise LogClosedError("the log is closed")
        limit = self.next_index if end_index is None else min(end_index, self.next_index)
        for segment in self._segments:
            if segment.base_index >= limit:
                return None
            slot = segment.index.slot_at_time(timestamp_ms)
            if slot is None:
                continue
            base = segment.batch_range(slot)[0]
            if base >= limit:
                return None
            batch = self.read(base).data
            try:
                found = next((r[:2] for r in iter_records(batch) if r[1] >= timestamp_ms), None)
            except MalformedRecordsError:
                found = (base, parse_header(batch).max_timestamp_ms)
            if found is None or found[0] >= limit:
                return None
            return found[0], found[1]
        return None

    # ---- truncation and retention ----------------------------------------------------------

    def truncate(self, index: int) -> None:
        """Remove every record at or after `index`, which must start a batch (or be next_index).

        Durable on return unless the fsync policy is `never`.
        """
        self._check_writable()
        if index == self.next_index:
            return
        if not self.start_index <= index < self.next_index:
            raise IndexOutOfRangeError(index, self.start_index, self.next_index)
        base, end = self.batch_range(index)
        if base != index:
            raise NotBatchBoundaryError(index, base, end)
        keep = bisect_right(self._bases, index) - 1
        for segment in reversed(self._segments[keep + 1 :]):
            segment.remove_files()
        del self._segments[keep + 1 :]
        del self._bases[keep + 1 :]
        if self._sync_writes:
            _sync_directory(self.directory)
        target = self._segments[keep]
        target.truncate(index)
        if self._sync_writes:
            target.sync()

    def remove_through(self, index: int) -> RetentionReport:
        """Remove whole sealed segments whose records all lie at or below `index` (Raft log
        compaction after a snapshot point); the active segment stays."""
        self._check_writable()
        return self._remove_front(lambda oldest, _: oldest.next_index - 1 <= index)

    def _remove_front(self, should_remove: Callable[[Segment, int], bool]) -> RetentionReport:
        """Remove sealed segments from the front while `should_remove(oldest, log_bytes)`;
        never the active segment."""
        removed: list[int] = []
        removed_bytes = 0
        total = self.size_bytes
        while (
            len(self._segments) > 1
            and self._segments[0].sealed
            and should_remove(self._segments[0], total)
        ):
            oldest = self._segments.pop(0)
            del self._bases[0]
            total -= oldest.size
            removed_bytes += oldest.size
            removed.append(oldest.base_index)
            oldest.remove_files()
        if removed and self._sync_writes:
            _sync_directory(self.directory)
        return RetentionReport(tuple(removed), removed_bytes, self.start_index)

    def reset(self, start_index: int) -> None:
        """Drop every segment and start empty at `start_index` (a replica installing a
        snapshot: "your log starts at X"). Durable on return unless fsync is `never`."""
        self._check_writable()
        if start_index < 0:
            raise IndexOutOfRangeError(start_index, self.start_index, self.next_index)
        for segment in reversed(self._segments):
            segment.remove_files()
        if self._sync_writes:
            _sync_directory(self.directory)
        fresh = Segment.create(self.directory, start_index, self.clock_ms(), sync=self._sync_writes)
        self._segments = [fresh]
        self._bases = [start_index]
        if self._sync_writes:
            _sync_directory(self.directory)

    def apply_retention(self, now_ms: int | None = None) -> RetentionReport:
        """Remove whole sealed segments from the front: while the log is larger than
        `retention_bytes`, and while the oldest was sealed more than `retention_ms` ago.

        An idle active segment older than `segment_ms` is rolled first so age can reach it.
        The active segment is never removed, so the log keeps at most
        max(retention_bytes, active segment size) bytes.
        """
        self._check_writable()
        now_ms = self.clock_ms() if now_ms is None else now_ms
        config = self.config
        active = self._active
        if (
            config.segment_ms is not None
            and not active.is_empty
            and now_ms - active.store.created_ms >= config.segment_ms
        ):
            self._roll()

        return self._remove_front(lambda oldest, total: self._expired(oldest, total, now_ms))

    def _expired(self, oldest: Segment, total_bytes: int, now_ms: int) -> bool:
        config = self.config
        too_big = config.retention_bytes is not None and total_bytes > config.retention_bytes
        too_old = (
            config.retention_ms is not None
            and oldest.store.sealed_ms + config.retention_ms <= now_ms
        )
        return too_big or too_old

    def retention_point(self, now_ms: int | None = None, *, limit_index: int) -> int | None:
        """The last index that retention would remove now (the end of the sealed front
        segments it would drop, none of them ending after `limit_index`), or None. A
        replicated log records a snapshot point there before `remove_through` it."""
        now_ms = self.clock_ms() if now_ms is None else now_ms
        total = self.size_bytes
        point = None
        for segment in self._segments[:-1]:
            last = segment.next_index - 1
            expired = self._expired(segment, total, now_ms)
            if not segment.sealed or last > limit_index or not expired:
                break
            total -= segment.size
            point = last
        return point


@dataclass(slots=True)
class _Placed:
    """Batches placed in one segment (`LogWrite._place`): each one's write (position, parts)
    and index row, and the segment's size and next index after them."""

    writes: list[tuple[int, Sequence[Buffer]]]
    added: list[tuple[int, int, int, int]]
    size: int
    next_index: int

    @property
    def count(self) -> int:
        return len(self.writes)

    def apply(self, pending: PendingBatches) -> None:
        """Count the placed batches, written, in `pending`."""
        pending.added.extend(self.added)
        pending.size, pending.next_index = self.size, self.next_index


class LogWrite:
    """Batches appended off the event loop, in three steps: `SegmentedLog.begin_write` plans
    them on the loop (verified, stamped, their indexes fixed); `write` writes them in an I/O
    thread, rolling segments as needed (a roll seals and syncs as `append`'s does), and `sync`
    fdatasyncs them; `publish`, back on the loop, makes them part of the log. Until then the
    log is as it was: its end, its segments and every read, so nothing on the loop reads a
    batch that is not whole in its store. The log takes no other change until the write is
    published (or the log closes): `write` and `sync` touch nothing the loop reads, except
    files past the published end and the seal of the segment it rolls."""

    def __init__(
        self,
        log: SegmentedLog,
        batches: list[tuple[tuple[Buffer, Buffer], int, int, int]],
        results: list[AppendResult],
        now_ms: int,
    ) -> None:
        self._log = log
        #: ((stamped header, payload), record count, term, largest record timestamp)
        self._batches = batches
        #: where each batch lands (known when planned)
        self.results = results
        self._now_ms = now_ms  # the clock of its rolls, read when planned
        active = log._active
        self._extents: list[tuple[Segment, PendingBatches]] = [
            (active, PendingBatches(active.next_index, active.size))
        ]
        self._written = False
        self._published = False

    def write(self) -> None:
        """Write every batch (an I/O thread). Raises the log's storage errors; then the log
        must not be written again (the caller stops, as after a failed `append`)."""
        assert not self._written, "written twice"
        self._written = True
        batches = self._batches
        while batches:
            segment, pending = self._extents[-1]
            placed = self._place(segment, pending, batches)
            if placed.count == 0:  # the segment is due to roll before the next batch
                self._roll(segment, pending)
                continue
            for position, parts in placed.writes:
                segment.write_at(position, parts)
            placed.apply(pending)
            batches = batches[placed.count :]

    def _place(
        self,
        segment: Segment,
        pending: PendingBatches,
        batches: Sequence[tuple[tuple[Buffer, Buffer], int, int, int]],
    ) -> _Placed:
        """Where the first of `batches` go in `segment`, after what `pending` holds: as many
        as it takes before it is due to roll (none: it is due now)."""
        size, next_index = pending.size, pending.next_index
        writes: list[tuple[int, Sequence[Buffer]]] = []
        added: list[tuple[int, int, int, int]] = []
        for parts, record_count, term, timestamp_ms in batches:
            empty = next_index == segment.base_index
            if self._log._roll_due(segment, size, empty, self._now_ms):
                break
            writes.append((size, parts))
            added.append((next_index - segment.base_index, size, term, timestamp_ms))
            size += sum(len(part) for part in parts)
            next_index += record_count
        return _Placed(writes, added, size, next_index)

    def _roll(self, old: Segment, pending: PendingBatches) -> tuple[Segment, PendingBatches]:
        log = self._log
        sync = log._sync_writes
        old.seal(self._now_ms, sync=sync, pending=pending)
        new = Segment.create(log.directory, pending.next_index, self._now_ms, sync=sync)
        if sync:
            _sync_directory(log.directory)
        extent = (new, PendingBatches(new.next_index, new.size))
        self._extents.append(extent)
        return extent

    def sync(self) -> None:
        """fdatasync what `write` wrote (an I/O thread); the segments it sealed were synced
        as they rolled."""
        assert self._written, "synced before it was written"
        if self._log.closed:
            raise LogClosedError("the log is closed")
        self._extents[-1][0].sync()

    def direct(self, *, sync: bool) -> DirectWrite | None:
        """`write`, then `sync` if asked, as a DirectWrite (see `Segment.direct`) when no
        segment rolls on the way; else None (`run` then, in a Python thread). Once it
        succeeded, the log is as after `write`: ready to `publish`."""
        assert not self._written, "written twice"
        if self._log.closed:
            return None
        segment, pending = self._extents[-1]
        placed = self._place(segment, pending, self._batches)
        if placed.count < len(self._batches):
            return None

        def written() -> None:
            self._written = True
            placed.apply(pending)

        return segment.direct(placed.writes, sync=sync, then=written)

    def run(self, *, sync: bool) -> None:
        """`write`, then `sync` if asked (one job of an I/O thread)."""
        self.write()
        if sync:
            self.sync()

    def publish(self) -> list[AppendResult]:
        """Make the written batches part of the log (on the event loop, once `write`
        returned); returns where each landed."""
        assert self._written and not self._published, "published before written, or twice"
        log = self._log
        assert log._write is self
        self._published = True
        log._write = None
        for number, (segment, pending) in enumerate(self._extents):
            segment.publish(pending.added, pending.next_index, pending.size)
            if number:
                log._segments.append(segment)
                log._bases.append(segment.base_index)
        return self.results

    def discard(self) -> None:
        """Drop a write that will never be published (its log closes): close the files of
        segments it created. Only once `write` returned, or never ran."""
        self._log._write = None
        for segment, _ in self._extents[1:]:
            segment.close()


class StreamAppend:
    """One batch being appended from a byte stream, written to the store as chunks arrive.

    A zeroed placeholder stands where the header goes until `commit`, so a crash part way
    leaves bytes that recovery cuts; `abort` (or any failure) truncates them at once.
    """

    def __init__(
        self, log: SegmentedLog, header: BatchHeader, header_bytes: bytes, term: int | None
    ) -> None:
        self._log = log
        self._header = header
        self._header_bytes = header_bytes
        self._term = header.term if term is None else term
        self._segment = log._active
        self._position = self._segment.size
        self._received_bytes = 0
        self._hasher = xxhash.xxh3_64()
        self._done = False
        self._segment.write_at(self._position, (bytes(BATCH_HEADER_BYTES),))

    @property
    def declared_payload_bytes(self) -> int:
        return self._header.payload_bytes

    def write(self, chunk: Buffer) -> None:
        """Write the next payload chunk. More bytes than declared aborts the append."""
        assert not self._done
        if self._received_bytes + len(chunk) > self._header.payload_bytes:
            self.abort()
            raise AppendThresholdError(
                f"stream sent more than the {self._header.batch_bytes} bytes its batch "
                "header declares"
            )
        try:
            self._segment.write_at(
                self._position + BATCH_HEADER_BYTES + self._received_bytes, (chunk,)
            )
        except SegmentError:
            self.abort()
            raise
        self._hasher.update(chunk)
        self._received_bytes += len(chunk)

    def commit(self) -> AppendResult:
        """Check length, checksum and records, stamp the header, and make the batch part of the
        log. The records are checked on the payload read back from the store (the walker needs
        it whole, and the stream never held it)."""
        assert not self._done
        header = self._header
        if self._received_bytes != header.payload_bytes:
            self.abort()
            raise BatchFramingError(
                f"stream ended after {self._received_bytes} of {header.payload_bytes} payload bytes"
            )
        digest = self._hasher.intdigest()
        if header_checksum(self._header_bytes[:CHECKSUM_OFFSET], digest) != header.checksum:
            self.abort()
            raise BatchChecksumError("checksum mismatch in streamed batch")
        segment = self._segment
        try:
            payload = segment.store.read(self._position + BATCH_HEADER_BYTES, header.payload_bytes)
            limit = self._log.config.batch_limit_bytes - BATCH_HEADER_BYTES
            verify_records(header, payload, max_records_bytes=limit)  # (compressed: within it)
        except StoreError as e:
            self.abort()
            raise SegmentError(f"cannot read back the streamed batch: {e}") from e
        except BatchError:
            self.abort()
            raise
        base_index = segment.next_index
        stamped = stamp_header(self._header_bytes, base_index, self._term, digest)
        try:
            segment.write_at(self._position, (stamped,))
        except SegmentError:
            self.abort()
            raise
        segment.commit_streamed(
            self._position, header.record_count, self._term, batch_timestamp(header)
        )
        self._finish()
        return AppendResult(base_index, header.record_count)

    def abort(self) -> None:
        """Cut everything this append wrote; the log is as before `begin_stream`."""
        if self._done:
            return
        self._finish()
        self._segment.cut_store(self._position)

    def _finish(self) -> None:
        self._done = True
        self._log._stream = None


def batch_timestamp(header: BatchHeader) -> int:
    """What a batch adds to its segment's time index: its largest record timestamp, or
    NO_TIMESTAMP_MS for a control batch (no records of users)."""
    return NO_TIMESTAMP_MS if header.is_control else header.max_timestamp_ms


def _sync_directory(directory: Directory) -> None:
    try:
        directory.sync()
    except StorageError as e:
        raise LogError(f"directory sync failed: {e}") from e


def _last_record(
    directory: Directory, bases: list[int], max_batch_bytes: int
) -> tuple[int, int] | None:
    """(index, term) of the last valid record in the stores of `bases` (about to be removed
    as damaged), from the newest store that still has one; None if none does."""
    for base in reversed(bases):
        try:
            storage = directory.open(store_name(base), create=False)
        except StorageError:
            continue
        try:
            store, _ = Store.open(storage, base, repair_ms=0)
            scan = store.scan(base, max_batch_bytes)
        except (StoreError, StorageError):
            storage.close()
            continue
        storage.close()
        found = [(scan.next_index - 1, scan.terms[-1])] if scan.terms else []
        if scan.lost_last is not None:
            found.append(scan.lost_last)
        if found:
            return max(found)
    return None


def _remove_stores(directory: Directory, bases: list[int]) -> int:
    """Remove the files of segments that recovery cut (newest first); return their bytes."""
    removed = 0
    for base in reversed(bases):
        try:
            storage = directory.open(store_name(base), create=False)
            removed += storage.size
            storage.close()
        except StorageError:
            pass
        directory.remove(index_name(base))
        directory.remove(store_name(base))
    return removed
