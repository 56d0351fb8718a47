"""Appends written off the event loop (`SegmentedLog.begin_write`, `LogWrite`): planned on
the loop, written (rolls included) and synced in an I/O thread, published back on the loop.
Until published, the log's end, its segments and every read are as before; nothing reads a
batch that is not whole in its store."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from laminar.log import (
    BATCH_HEADER_BYTES,
    AppendInProgressError,
    BatchChecksumError,
    CorruptBatchError,
    Directory,
    FileDirectory,
    IndexOutOfRangeError,
    LogConfig,
    MemoryDirectory,
    SegmentedLog,
    decode_batches,
)
from laminar.log.segment import STORE_SUFFIX

from .helpers import make_batch, read_records

SMALL = LogConfig(segment_bytes=4096, max_batch_bytes=2048)
#: a reader's passes over the log while a write is in flight (bounded: count and time)
READER_PASSES = 20_000
READER_DEADLINE_S = 20.0


def fill(log: SegmentedLog, batches: int, first_tag: int = 0) -> None:
    for tag in range(first_tag, first_tag + batches):
        log.append(make_batch(tag), term=1)


def test_a_write_is_invisible_until_published(
    directory_factory: Callable[[], Directory],
) -> None:
    log = SegmentedLog.open(directory_factory(), SMALL)
    fill(log, 5)
    before = (log.next_index, log.size_bytes, log.segment_base_indexes, read_records(log))
    # enough to roll the 4 KiB segments twice
    write = log.begin_write([(make_batch(tag), 2) for tag in range(5, 45)])
    assert [r.base_index for r in write.results] == list(range(15, 135, 3))
    write.write()
    write.sync()
    assert (log.next_index, log.size_bytes, log.segment_base_indexes) == before[:3]
    assert read_records(log) == before[3]  # the last published batch reads whole
    assert log.read_range(log.next_index, 1 << 20).batch_count == 0
    assert write.publish() == write.results
    assert log.next_index == 135 and len(log.segment_base_indexes) >= 3
    assert [value for _, value in read_records(log)][-1] == b"44.2".ljust(20, b".")
    assert log.term_at(134) == 2 and log.term_at(14) == 1
    records = read_records(log)
    log.close()
    reopened = SegmentedLog.open(directory_factory(), SMALL)
    assert reopened.recovery.cuts == ()
    # the segments the write sealed have index files that describe them exactly
    bases = log.segment_base_indexes[:-1]
    sealed = [s for s in reopened.recovery.segments if s.base_index in bases]
    assert len(sealed) >= 2 and not any(s.index_rebuilt for s in sealed)
    assert read_records(reopened) == records
    reopened.close()


def test_a_write_in_flight_refuses_other_changes(
    directory_factory: Callable[[], Directory],
) -> None:
    log = SegmentedLog.open(directory_factory(), SMALL)
    fill(log, 3)
    write = log.begin_write([(make_batch(9), 1)])
    for change in (
        lambda: log.append(make_batch(10), term=1),
        lambda: log.truncate(3),
        lambda: log.remove_through(2),
        lambda: log.begin_write([(make_batch(11), 1)]),
        lambda: log.reset(100),
    ):
        with pytest.raises(AppendInProgressError, match="in flight"):
            change()
    write.write()
    write.publish()
    log.append(make_batch(10), term=1)  # writable again once published
    assert log.next_index == 15
    log.close()


def test_a_bad_batch_is_refused_before_anything_is_planned(
    directory_factory: Callable[[], Directory],
) -> None:
    log = SegmentedLog.open(directory_factory(), SMALL)
    bad = bytearray(make_batch(1))
    bad[-1] ^= 1
    with pytest.raises(BatchChecksumError):
        log.begin_write([(make_batch(0), 1), (bytes(bad), 1)])
    log.append(make_batch(2), term=1)  # nothing was left in flight
    assert log.next_index == 3
    log.close()


def test_a_crash_after_the_write_and_before_its_sync_loses_only_that_write() -> None:
    directory = MemoryDirectory()
    log = SegmentedLog.open(directory, SMALL)
    fill(log, 4)
    log.sync()
    synced = read_records(log)
    write = log.begin_write([(make_batch(tag), 1) for tag in range(4, 30)])
    write.write()  # rolls sealed and synced segments, the last one is not synced
    directory.crash(random.Random(7))  # a torn tail of what was not synced
    reopened = SegmentedLog.open(directory, SMALL)
    records = read_records(reopened)
    assert records[: len(synced)] == synced  # what was synced before survives
    assert len(records) % 3 == 0 and len(records) <= 90  # whole batches only
    reopened.close()


def test_a_synced_write_survives_a_crash_before_it_is_published() -> None:
    directory = MemoryDirectory()
    log = SegmentedLog.open(directory, SMALL)
    fill(log, 4)
    write = log.begin_write([(make_batch(tag), 1) for tag in range(4, 30)])
    write.run(sync=True)
    directory.crash(random.Random(7))
    reopened = SegmentedLog.open(directory, SMALL)
    assert reopened.next_index == 90 and reopened.recovery.cuts == ()
    reopened.close()


def test_closing_with_an_unpublished_write_keeps_the_log_consistent(
    directory_factory: Callable[[], Directory],
) -> None:
    """A round stopped between its write and its publish (the broker stopping): the files
    hold what was written past the published end, which the next open finds whole."""
    log = SegmentedLog.open(directory_factory(), SMALL)
    fill(log, 4)
    write = log.begin_write([(make_batch(tag), 1) for tag in range(4, 30)])
    write.write()
    log.close()
    reopened = SegmentedLog.open(directory_factory(), SMALL)
    assert reopened.next_index == 90 and reopened.recovery.cuts == ()
    reopened.append(make_batch(30), term=1)
    assert read_records(reopened)[-1][0] == 92
    reopened.close()


def test_reading_the_last_batch_while_bytes_are_written_past_it(
    directory_factory: Callable[[], Directory],
) -> None:
    """A batch's end is the next batch's position, or the segment's published size: bytes
    past it (a write or a streaming append in flight) are not part of the last batch."""
    log = SegmentedLog.open(directory_factory(), LogConfig(segment_bytes=1 << 20))
    fill(log, 3)
    last = log.read(6)
    stream = log.begin_stream(
        make_batch(3)[:BATCH_HEADER_BYTES]
    )  # writes a placeholder past the end
    assert log.read(6) == last
    assert log.read_range(0, 1 << 20).batch_count == 3
    stream.abort()
    write = log.begin_write([(make_batch(4), 1)])
    write.write()
    assert log.read(6) == last
    write.publish()
    log.close()


def test_a_committed_index_not_stored_yet_reads_as_nothing_yet(
    directory_factory: Callable[[], Directory],
) -> None:
    """A follower may learn that entries are committed while its write of them is in
    flight: a read up to the commit finds nothing there yet (not an out-of-range error)."""
    log = SegmentedLog.open(directory_factory(), SMALL)
    fill(log, 2)
    write = log.begin_write([(make_batch(2), 1)])
    write.write()
    result = log.read_range(7, 1 << 20, end_index=9)
    assert (result.data, result.first_index, result.next_index) == (b"", 7, 7)
    with pytest.raises(IndexOutOfRangeError):
        log.read_range(7, 1 << 20)  # no commit said it exists
    with pytest.raises(IndexOutOfRangeError):
        log.read_range(9, 1 << 20, end_index=9)
    write.publish()
    assert log.read_range(6, 1 << 20, end_index=9).batch_count == 1
    log.close()


def test_a_reader_racing_a_write_in_a_thread_never_meets_unwritten_bytes(
    tmp_path: Path,
) -> None:
    """Real files: a thread writes (and rolls) while this thread reads the log over and over,
    as the event loop serves reads while the broker's I/O thread writes. Every read is whole,
    checksum-verified batches of the published log: no CorruptBatchError, nothing past its
    end."""
    log = SegmentedLog.open(FileDirectory(str(tmp_path / "log")), SMALL)
    corrupt: list[CorruptBatchError] = []
    log.on_corrupt = corrupt.append
    fill(log, 3)
    for round_number in range(20):
        first_tag = 3 + round_number * 30
        write = log.begin_write([(make_batch(t), 1) for t in range(first_tag, first_tag + 30)])
        published_end = log.next_index
        expected = read_records(log)
        done = threading.Event()
        errors: list[BaseException] = []

        def run(write=write, done=done, errors=errors) -> None:  # type: ignore[no-untyped-def]
            try:
                write.run(sync=True)
            except BaseException as e:  # reported below
                errors.append(e)
            finally:
                done.set()

        thread = threading.Thread(target=run)
        thread.start()
        passes = 0
        deadline = time.monotonic() + READER_DEADLINE_S
        while passes < READER_PASSES and time.monotonic() < deadline:
            if done.is_set() and passes > 0:
                break
            index = random.randrange(published_end)
            result = log.read_range(index, 4096)
            assert result.next_index <= published_end
            records = list(decode_batches(result.data))
            assert records and records[-1].index == result.next_index - 1
            assert log.next_index == published_end
            passes += 1
        thread.join(READER_DEADLINE_S)
        assert not thread.is_alive() and errors == []
        assert read_records(log) == expected  # still the published log
        write.publish()
        assert log.next_index == published_end + 90
    assert corrupt == []
    stores = [p for p in (tmp_path / "log").iterdir() if p.name.endswith(STORE_SUFFIX)]
    assert len(stores) == len(log.segment_base_indexes) > 20
    log.close()
