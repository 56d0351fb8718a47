"""The generic segmented-log suite, run against the in-memory and the file backend."""

from __future__ import annotations

import errno
import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from laminar.log import (
    BATCH_HEADER_BYTES,
    AppendInProgressError,
    AppendThresholdError,
    BatchChecksumError,
    BatchFramingError,
    BatchTooLargeError,
    Directory,
    FileDirectory,
    FsyncPolicy,
    IndexOutOfRangeError,
    LogClosedError,
    LogConfig,
    LogConfigError,
    MemoryDirectory,
    NotBatchBoundaryError,
    SegmentedLog,
    SegmentError,
    decode_batch,
    parse_header,
    split_batches,
    verify_batch,
)
from laminar.log.batch import stamp_header
from laminar.log.segment import index_name, store_name
from laminar.log.storage import FileStorage, MemoryStorage

from .helpers import make_batch, read_records

SMALL = LogConfig(segment_bytes=4096, max_batch_bytes=2048)


class Clock:
    def __init__(self, now_ms: int = 1_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def snapshot(log: SegmentedLog) -> tuple[int, int, tuple[int, ...], list[tuple[int, bytes | None]]]:
    return log.start_index, log.next_index, log.segment_base_indexes, read_records(log)


def fill(log: SegmentedLog, batches: int, records: int = 3, term: int = 1) -> list[int]:
    return [log.append(make_batch(t, records), term=term).base_index for t in range(batches)]


def test_append_assigns_consecutive_indexes_and_reads_back(directory_factory):
    log = SegmentedLog.open(directory_factory(), SMALL)
    bases = fill(log, 10, records=3)
    assert bases == list(range(0, 30, 3))
    assert (log.start_index, log.next_index) == (0, 30)
    values = [v for _, v in read_records(log)]
    assert values[:4] == [
        b"0.0".ljust(20, b"."),
        b"0.1".ljust(20, b"."),
        b"0.2".ljust(20, b"."),
        b"1.0".ljust(20, b"."),
    ]
    record = decode_batch(log.read(4).data)[1]
    assert (record.index, record.key, record.headers) == (4, b"k1", (("h", b"1"),))
    assert record.timestamp_ms == 1_700_000_000_001


def test_segments_roll_at_segment_bytes_and_stay_within_overflow(directory_factory):
    directory = directory_factory()
    log = SegmentedLog.open(directory, SMALL)
    fill(log, 120)
    bases = log.segment_base_indexes
    assert len(bases) > 3
    for segment in log._segments[:-1]:
        assert SMALL.segment_bytes <= segment.size < SMALL.segment_bytes + SMALL.overflow_bytes
        assert segment.sealed
    names = directory.names()
    for base in bases:
        assert store_name(base) in names
    for base in bases[:-1]:
        assert index_name(base) in names  # sealed segments have their index file


def test_reopen_keeps_everything(directory_factory):
    log = SegmentedLog.open(directory_factory(), SMALL)
    fill(log, 60)
    before = snapshot(log)
    log.close()
    reopened = SegmentedLog.open(directory_factory(), SMALL)
    assert snapshot(reopened) == before
    assert reopened.recovery.cuts == ()
    assert not any(s.index_rebuilt for s in reopened.recovery.segments)  # clean close
    assert reopened.append(make_batch(99)).base_index == before[1]


def test_reopen_without_close_rescans_only_the_active_segment(directory_factory):
    directory = directory_factory()
    log = SegmentedLog.open(directory, SMALL)
    fill(log, 60)
    log.sync()
    before = snapshot(log)
    reopened = SegmentedLog.open(directory_factory(), SMALL)  # no close: like a process crash
    assert snapshot(reopened) == before
    rebuilt = [s.index_rebuilt for s in reopened.recovery.segments]
    assert rebuilt == [False] * (len(rebuilt) - 1) + [True]


def test_read_range_limits(directory_factory):
    log = SegmentedLog.open(directory_factory(), LogConfig(segment_bytes=1 << 20))
    fill(log, 10, records=4)
    one = len(make_batch(0, 4))
    result = log.read_range(0, max_bytes=one * 3)
    assert (result.first_index, result.next_index, result.batch_count) == (0, 12, 3)
    assert len(result.data) == one * 3
    # at least one batch, however small max_bytes is
    assert log.read_range(0, max_bytes=1).batch_count == 1
    # from the middle of a batch: the whole batch holding it
    result = log.read_range(6, max_bytes=one)
    assert (result.first_index, result.next_index) == (4, 8)
    # end_index stops before batches that end beyond it
    result = log.read_range(0, max_bytes=1 << 20, end_index=10)
    assert (result.next_index, result.batch_count) == (8, 2)
    assert log.read_range(0, max_bytes=1 << 20, end_index=2).batch_count == 0
    # at the end: empty; past it or before start: errors
    assert log.read_range(40, 100).batch_count == 0
    with pytest.raises(IndexOutOfRangeError) as info:
        log.read_range(41, 100)
    assert (info.value.start_index, info.value.next_index) == (0, 40)
    with pytest.raises(IndexOutOfRangeError):
        log.read(40)
    with pytest.raises(IndexOutOfRangeError):
        log.read(-1)


def test_read_range_returns_one_segment_at_a_time(directory_factory):
    log = SegmentedLog.open(directory_factory(), SMALL)
    fill(log, 60)
    second_base = log.segment_base_indexes[1]
    result = log.read_range(0, max_bytes=1 << 30)
    assert result.next_index == second_base
    assert log.read_range(second_base, 1 << 30).first_index == second_base


def test_terms_are_stored_per_batch(directory_factory):
    log = SegmentedLog.open(directory_factory(), SMALL)
    for term in (1, 1, 2, 5):
        log.append(make_batch(term, records=2), term=term)
    assert [log.term_at(i) for i in range(8)] == [1, 1, 1, 1, 2, 2, 5, 5]
    assert log.last_term == 5
    assert log.batch_range(5) == (4, 6)
    log.close()
    reopened = SegmentedLog.open(directory_factory(), SMALL)
    assert [reopened.term_at(i) for i in range(0, 8, 2)] == [1, 1, 2, 5]
    data = reopened.read_range(0, 1 << 20).data
    headers = [parse_header(batch) for batch in split_batches(data)]
    assert [(h.base_index, h.term) for h in headers] == [(0, 1), (2, 1), (4, 2), (6, 5)]


def test_term_none_keeps_the_batch_term(directory_factory):
    leader = SegmentedLog.open(directory_factory(), SMALL)
    leader.append(make_batch(1), term=4)
    replicated = leader.read(0).data  # a follower appends the leader's batch as it is
    follower = SegmentedLog.open(MemoryDirectory(), SMALL)
    follower.append(replicated)
    assert follower.term_at(0) == 4


def test_bad_batches_change_nothing(directory_factory):
    log = SegmentedLog.open(directory_factory(), SMALL)
    fill(log, 5)
    before = snapshot(log)
    good = make_batch(1)
    damaged = bytearray(good)
    damaged[-1] ^= 1
    with pytest.raises(BatchChecksumError):
        log.append(bytes(damaged))
    with pytest.raises(BatchFramingError):
        log.append(good[:-3])
    with pytest.raises(BatchFramingError):
        log.append(b"")
    with pytest.raises(BatchFramingError):
        log.append(b"nonsense" * 20)
    with pytest.raises(BatchTooLargeError):
        log.append(make_batch(1, records=1, value_bytes=SMALL.max_batch_bytes))
    assert snapshot(log) == before


def test_config_is_validated():
    with pytest.raises(LogConfigError, match="overflow"):
        LogConfig(segment_bytes=8192, max_batch_bytes=8192)
    with pytest.raises(LogConfigError):
        LogConfig(retention_bytes=0)
    with pytest.raises(ValueError):
        LogConfig(fsync="sometimes")  # type: ignore[arg-type]


def test_truncate_at_batch_boundaries(directory_factory):
    log = SegmentedLog.open(directory_factory(), SMALL)
    fill(log, 60)
    bases = log.segment_base_indexes
    before = read_records(log)
    with pytest.raises(NotBatchBoundaryError) as info:
        log.truncate(4)
    assert (info.value.batch_base_index, info.value.batch_next_index) == (3, 6)
    with pytest.raises(IndexOutOfRangeError):
        log.truncate(181)
    assert read_records(log) == before
    # into an older segment: later segments go, the holding segment is cut and appendable
    cut = bases[1] + 3
    log.truncate(cut)
    assert log.next_index == cut
    assert log.segment_base_indexes == bases[:2]
    assert read_records(log) == before[:cut]
    assert log.append(make_batch(500)).base_index == cut
    log.close()
    reopened = SegmentedLog.open(directory_factory(), SMALL)
    assert read_records(reopened)[:cut] == before[:cut]
    assert reopened.next_index == cut + 3
    # truncating at the exact base of a segment leaves that segment empty
    reopened.truncate(bases[1])
    assert reopened.segment_base_indexes == bases[:2]
    assert reopened.next_index == bases[1]
    reopened.truncate(0)
    assert (reopened.start_index, reopened.next_index) == (0, 0)
    assert reopened.append(make_batch(1)).base_index == 0


def test_log_can_start_at_any_index(directory_factory):
    log = SegmentedLog.open(directory_factory(), SMALL, start_index=1000)
    assert (log.start_index, log.next_index) == (1000, 1000)
    assert log.append(make_batch(1)).base_index == 1000
    with pytest.raises(IndexOutOfRangeError) as info:
        log.read(999)
    assert info.value.start_index == 1000


def test_retention_by_bytes(directory_factory):
    log = SegmentedLog.open(
        directory_factory(),
        LogConfig(segment_bytes=4096, max_batch_bytes=2048, retention_bytes=3 * 4096),
    )
    fill(log, 200)
    before = read_records(log)
    report = log.apply_retention()
    assert report.removed_base_indexes
    assert log.size_bytes <= 3 * 4096 or len(log.segment_base_indexes) == 1
    assert report.start_index == log.start_index == log.segment_base_indexes[0]
    assert read_records(log) == before[log.start_index :]
    with pytest.raises(IndexOutOfRangeError) as info:
        log.read(0)
    assert info.value.start_index == log.start_index
    assert log.apply_retention().removed_base_indexes == ()


def test_retention_by_age_survives_restart(directory_factory):
    clock = Clock()
    config = LogConfig(segment_bytes=4096, max_batch_bytes=2048, retention_ms=60_000)
    log = SegmentedLog.open(directory_factory(), config, clock_ms=clock)
    fill(log, 30)  # sealed at t0
    first_sealed = len(log.segment_base_indexes) - 1
    clock.now_ms += 30_000
    fill(log, 30)  # more sealed at t0+30s
    log.close()
    clock.now_ms += 40_000  # the first ones are now 70 s old, the rest 40 s
    reopened = SegmentedLog.open(directory_factory(), config, clock_ms=clock)
    report = reopened.apply_retention()
    assert len(report.removed_base_indexes) == first_sealed
    clock.now_ms += 30_000
    report = reopened.apply_retention()
    assert len(reopened.segment_base_indexes) == 1  # only the active segment is left
    assert reopened.start_index == reopened.segment_base_indexes[0]


def test_segment_ms_rolls_an_idle_segment_so_age_retention_reaches_it(directory_factory):
    clock = Clock()
    config = LogConfig(segment_bytes=1 << 20, retention_ms=1000, segment_ms=500)
    log = SegmentedLog.open(directory_factory(), config, clock_ms=clock)
    fill(log, 3)
    clock.now_ms += 600
    assert log.apply_retention().removed_base_indexes == ()  # rolled, sealed just now
    assert log.segment_base_indexes == (0, 9)
    clock.now_ms += 1000
    assert log.apply_retention().removed_base_indexes == (0,)
    assert (log.start_index, log.next_index) == (9, 9)


def test_missing_or_damaged_index_is_rebuilt(directory_factory):
    directory = directory_factory()
    log = SegmentedLog.open(directory, SMALL)
    fill(log, 60)
    before = snapshot(log)
    log.close()
    bases = before[2]
    directory.remove(index_name(bases[0]))
    storage = directory.open(index_name(bases[1]), create=False)
    storage.write(50, (b"\xff\xff",))
    storage.close()
    reopened = SegmentedLog.open(directory_factory(), SMALL)
    assert snapshot(reopened) == before
    assert [s.index_rebuilt for s in reopened.recovery.segments][:2] == [True, True]
    assert index_name(bases[0]) in directory.names()  # rebuilt index was saved again
    reopened.close()
    again = SegmentedLog.open(directory_factory(), SMALL)
    assert not any(s.index_rebuilt for s in again.recovery.segments)


def test_stale_index_of_active_segment_is_never_trusted(directory_factory):
    """After a clean close the active index is current; once the segment changes it is voided
    before the change, so a crash afterwards cannot make recovery trust it."""
    directory = directory_factory()
    log = SegmentedLog.open(directory, SMALL)
    fill(log, 4)
    log.close()
    log = SegmentedLog.open(directory_factory(), SMALL)
    log.truncate(3)
    log.append(make_batch(77))  # same size as the cut batch: the store size matches again
    log.sync()
    expected = snapshot(log)
    reopened = SegmentedLog.open(directory_factory(), SMALL)  # crash: no close
    assert snapshot(reopened) == expected


def test_torn_tail_is_cut_and_reported(directory_factory):
    directory = directory_factory()
    log = SegmentedLog.open(directory, SMALL)
    fill(log, 5)
    log.sync()
    expected = read_records(log)
    active = store_name(log.segment_base_indexes[-1])
    storage = directory.open(active, create=False)
    batch = make_batch(9)
    _, digest = verify_batch(batch, len(batch))
    batch = stamp_header(batch, 15, 1, digest) + batch[BATCH_HEADER_BYTES:]
    storage.write(storage.size, (batch[: len(batch) // 2],))  # half a batch: a torn write
    reopened = SegmentedLog.open(directory_factory(), SMALL)
    assert read_records(reopened) == expected
    assert reopened.recovery.cut_bytes == len(batch) // 2
    assert "torn" in reopened.recovery.cuts[0]
    assert reopened.append(make_batch(10)).base_index == 15


def test_corrupt_batch_in_active_segment_is_cut_on_recovery(directory_factory):
    directory = directory_factory()
    log = SegmentedLog.open(directory, LogConfig(segment_bytes=1 << 20))
    fill(log, 6)
    log.sync()
    positions = list(log._segments[-1].index.positions)
    expected = read_records(log)[:12]
    storage = directory.open(store_name(0), create=False)
    storage.write(positions[4] + BATCH_HEADER_BYTES + 5, (b"\x00\x01",))
    reopened = SegmentedLog.open(directory_factory(), LogConfig(segment_bytes=1 << 20))
    assert read_records(reopened) == expected
    assert "checksum" in reopened.recovery.cuts[0]


def test_closed_log_refuses_everything(directory_factory):
    log = SegmentedLog.open(directory_factory(), SMALL)
    fill(log, 2)
    log.close()
    log.close()  # idempotent
    for call in (
        lambda: log.append(make_batch(1)),
        lambda: log.read(0),
        lambda: log.read_range(0, 10),
        lambda: log.truncate(0),
        log.sync,
    ):
        with pytest.raises(LogClosedError):
            call()


# ---- durability: what the broker's group commit relies on ----------------------------------


class CountingFileDirectory(FileDirectory):
    """A real directory that counts fdatasync calls on its files."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.syncs = 0

    def open(self, name: str, *, create: bool) -> FileStorage:
        storage = super().open(name, create=create)
        real_sync = storage.sync

        def counted() -> None:
            self.syncs += 1
            real_sync()

        storage.sync = counted  # type: ignore[method-assign]
        return storage


class CountingMemoryDirectory(MemoryDirectory):
    """An in-memory directory that counts syncs of its files (each file object once)."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs = 0

    def open(self, name: str, *, create: bool) -> MemoryStorage:
        storage = super().open(name, create=create)
        if not hasattr(storage, "counted"):
            real_sync = storage.sync

            def counted() -> None:
                self.syncs += 1
                real_sync()

            storage.sync = counted  # type: ignore[method-assign]
            storage.counted = True  # type: ignore[attr-defined]
        return storage


@pytest.mark.parametrize("backend", ["memory", "file"])
def test_appends_do_not_fdatasync_and_one_sync_covers_them_all(backend: str, tmp_path: Path):
    """A broker round writes many batches and then syncs the log once: under fsync=always the
    appends must not fdatasync themselves, and that one sync must be one fdatasync."""
    directory: CountingFileDirectory | CountingMemoryDirectory
    if backend == "memory":
        directory = CountingMemoryDirectory()
    else:
        directory = CountingFileDirectory(str(tmp_path / "log"))
    config = LogConfig(segment_bytes=1 << 20, fsync=FsyncPolicy.ALWAYS)
    log = SegmentedLog.open(directory, config)
    directory.syncs = 0
    fill(log, 100)
    assert directory.syncs == 0
    assert log.sync() == 300
    assert directory.syncs == 1
    log.close()


@pytest.mark.parametrize("seed", range(40))
def test_power_cut_keeps_every_synced_round(seed: int):
    """Rounds of appends, each acknowledged after one sync (as the broker's driver does),
    across segment rolls; the power goes part way through a round (unsynced bytes lost, a
    torn prefix may remain). Every acknowledged batch survives, at its index."""
    rng = random.Random(seed)
    directory = MemoryDirectory()
    log = SegmentedLog.open(directory, SMALL)
    acknowledged: dict[int, int] = {}  # base index -> tag
    tag = 0
    for round_ in range(rng.randint(1, 60)):
        written = {}
        for _ in range(rng.randint(1, 6)):
            written[log.append(make_batch(tag, records=rng.randint(1, 4))).base_index] = tag
            tag += 1
        if round_ > 0 and rng.random() < 0.2:
            break  # the power goes before this round's sync
        log.sync()
        acknowledged.update(written)
    directory.crash(rng)  # no close: the process is gone

    recovered = SegmentedLog.open(directory, SMALL)
    values = dict(read_records(recovered))
    assert acknowledged
    for base, acked in acknowledged.items():
        assert values[base] == f"{acked}.0".encode().ljust(20, b".")
    assert recovered.next_index >= max(acknowledged) + 1


def test_a_failed_fdatasync_raises_from_sync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An fdatasync error reaches the caller of `sync` (the broker's round, which then sends
    no acknowledgement): it is never reported as durable."""
    directory = FileDirectory(str(tmp_path / "log"))
    log = SegmentedLog.open(directory, SMALL)
    fill(log, 2)

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    with monkeypatch.context() as patch:
        patch.setattr(os, "fdatasync", failing)
        with pytest.raises(SegmentError, match="Input/output error"):
            log.sync()
    assert log.sync() == 6
    log.close()


# ---- streaming appends (begin_stream: a batch whose payload arrives in chunks) -------------


def stream_in_chunks(log: SegmentedLog, batch: bytes, chunk_bytes: int, **kwargs) -> int:
    stream = log.begin_stream(batch[:BATCH_HEADER_BYTES], **kwargs)
    for offset in range(BATCH_HEADER_BYTES, len(batch), chunk_bytes):
        stream.write(batch[offset : offset + chunk_bytes])
    return stream.commit().base_index


def test_stream_append_writes_a_whole_batch(directory_factory):
    log = SegmentedLog.open(directory_factory(), SMALL)
    fill(log, 2)
    batch = make_batch(5, records=10)
    assert stream_in_chunks(log, batch, 7, term=3) == 6
    assert [r.value for r in decode_batch(log.read(6).data)] == [
        r.value for r in decode_batch(batch)
    ]
    assert log.term_at(15) == 3
    assert log.append(make_batch(6)).base_index == 16


@pytest.mark.parametrize("fault", ["overrun", "short", "checksum", "threshold", "abort"])
def test_failed_stream_leaves_nothing_behind(directory_factory: Callable[[], Directory], fault):
    directory = directory_factory()
    log = SegmentedLog.open(directory, SMALL)
    fill(log, 3)
    log.sync()
    before = snapshot(log)
    size_before = log.size_bytes
    batch = make_batch(5, records=10)
    header, payload = batch[:BATCH_HEADER_BYTES], batch[BATCH_HEADER_BYTES:]
    if fault == "threshold":
        with pytest.raises(AppendThresholdError):
            log.begin_stream(header, append_threshold=len(batch) - 1)
    else:
        stream = log.begin_stream(header, append_threshold=len(batch))
        with pytest.raises(AppendInProgressError):
            log.append(make_batch(1))
        if fault == "overrun":
            stream.write(payload)
            with pytest.raises(AppendThresholdError):
                stream.write(b"more")
        elif fault == "short":
            stream.write(payload[:-1])
            with pytest.raises(BatchFramingError):
                stream.commit()
        elif fault == "checksum":
            stream.write(payload[:-1] + bytes([payload[-1] ^ 1]))
            with pytest.raises(BatchChecksumError):
                stream.commit()
        else:
            stream.write(payload[:10])
            stream.abort()
    assert snapshot(log) == before
    assert log.size_bytes == size_before
    assert log.append(make_batch(6)).base_index == before[1]
    log.sync()
    assert read_records(SegmentedLog.open(directory_factory(), SMALL))[-1][0] == before[1] + 2


def test_stream_cut_by_a_crash_is_removed_on_recovery(directory_factory):
    directory = directory_factory()
    log = SegmentedLog.open(directory, SMALL)
    fill(log, 3)
    expected = read_records(log)
    batch = make_batch(5, records=10)
    stream = log.begin_stream(batch[:BATCH_HEADER_BYTES])
    stream.write(batch[BATCH_HEADER_BYTES:])  # every byte is there, but no commit
    log.sync()
    reopened = SegmentedLog.open(directory_factory(), SMALL)
    assert read_records(reopened) == expected
    assert reopened.recovery.cut_bytes == len(batch)


def test_reset_starts_an_empty_log_at_any_index(directory_factory):
    log = SegmentedLog.open(directory_factory(), SMALL)
    fill(log, 40)
    log.reset(5000)
    assert (log.start_index, log.next_index, log.segment_base_indexes) == (5000, 5000, (5000,))
    assert log.append(make_batch(1)).base_index == 5000
    log.close()
    reopened = SegmentedLog.open(directory_factory(), SMALL)
    assert (reopened.start_index, reopened.next_index) == (5000, 5003)
    assert [name for name in directory_factory().names() if name.endswith(".log")] == [
        store_name(5000)
    ]


def test_remove_through_drops_only_segments_wholly_at_or_below_the_index(directory_factory):
    log = SegmentedLog.open(directory_factory(), SMALL)
    fill(log, 60)
    bases = log.segment_base_indexes
    before = read_records(log)
    report = log.remove_through(bases[2] - 1)  # the end of the second segment
    assert report.removed_base_indexes == bases[:2]
    assert log.start_index == bases[2] and read_records(log) == before[bases[2] :]
    assert log.remove_through(bases[2]).removed_base_indexes == ()  # inside segment 3
    assert log.remove_through(10**9).removed_base_indexes == bases[2:-1]  # never the active
    assert log.segment_base_indexes == bases[-1:]


def test_batch_headers_walk_every_segment_from_the_batch_holding_an_index(directory_factory):
    log = SegmentedLog.open(directory_factory(), SMALL)
    fill(log, 60, records=3, term=4)
    assert len(log.segment_base_indexes) > 2
    headers = list(log.batch_headers(7))  # inside the batch [6, 9)
    assert [h.base_index for h in headers] == list(range(6, log.next_index, 3))
    assert all(h.record_count == 3 and h.term == 4 for h in headers)
    assert list(log.batch_headers(log.next_index)) == []
    with pytest.raises(IndexOutOfRangeError):
        list(log.batch_headers(-1))
