"""The time index: `SegmentedLog.index_at_time`, Kafka's offsets-for-times, over segments whose
record timestamps go back and forth, control batches, restarts and lost index files. Run
against the in-memory and the file backend; every answer is checked against a brute-force
walk of every record."""

from __future__ import annotations

import random
from collections.abc import Callable

from laminar.log import Directory, LogConfig, Record, SegmentedLog, decode_batches, encode_batch
from laminar.log.batch import StoredRecord
from laminar.log.index import INDEX_HEADER, INDEX_VERSION, NO_TIMESTAMP_MS, SegmentIndex
from laminar.log.segment import index_name

SMALL = LogConfig(segment_bytes=4096, max_batch_bytes=2048)
BASE_MS = 1_700_000_000_000


def batch(timestamps: list[int], *, control: bool = False) -> bytes:
    records = [Record(value=b"v%d" % t, timestamp_ms=t) for t in timestamps]
    return encode_batch(records, control=control)


def brute_force(log: SegmentedLog, timestamp_ms: int, end: int) -> tuple[int, int] | None:
    """The first record below `end`, in log order, whose timestamp is at or after
    `timestamp_ms`: every record of every record batch walked."""
    index = log.start_index
    while index < min(end, log.next_index):
        result = log.read_range(index, 1 << 20)
        for record in decode_batches(result.data):
            if record.index < end and record.timestamp_ms >= timestamp_ms:
                return record.index, record.timestamp_ms
        index = result.next_index
    return None


def control_indexes(log: SegmentedLog) -> set[int]:
    return {
        i
        for h in log.batch_headers(log.start_index)
        if h.is_control
        for i in range(h.base_index, h.next_index)
    }


def fill_out_of_order(log: SegmentedLog, rng: random.Random, batches: int) -> None:
    """Batches of 1-5 records whose timestamps wander (a producer's clock is its own), with a
    control batch (timestamp 0, as queue commands carry) now and then."""
    now = BASE_MS
    for _ in range(batches):
        if rng.random() < 0.25:
            log.append(batch([0], control=True), term=1)
            continue
        stamps = []
        for _ in range(rng.randint(1, 5)):
            now += rng.randint(-40, 60)
            stamps.append(now)
        log.append(batch(stamps), term=1)


def test_every_time_finds_the_first_record_at_or_after_it(
    directory_factory: Callable[[], Directory],
) -> None:
    log = SegmentedLog.open(directory_factory(), SMALL)
    fill_out_of_order(log, random.Random(7), 400)
    assert len(log.segment_base_indexes) > 3  # the search crosses segments
    controls = control_indexes(log)
    stamps = sorted({r.timestamp_ms for r in _records(log)})
    probes = [BASE_MS - 1_000, stamps[0], stamps[-1], stamps[-1] + 1]
    probes += random.Random(8).sample(range(stamps[0] - 50, stamps[-1] + 50), 200)
    for end in (log.next_index, log.next_index // 2):
        for t in probes:
            found = log.index_at_time(t, end)
            assert found == brute_force(log, t, end), (t, end)
            assert found is None or found[0] not in controls
    log.close()


def test_the_time_index_survives_a_restart_and_a_lost_index_file(
    directory_factory: Callable[[], Directory],
) -> None:
    log = SegmentedLog.open(directory_factory(), SMALL)
    fill_out_of_order(log, random.Random(3), 300)
    probes = list(range(BASE_MS - 100, BASE_MS + 3_000, 37))
    before = [log.index_at_time(t) for t in probes]
    columns = [_column(log, b) for b in log.segment_base_indexes]
    log.close()

    reopened = SegmentedLog.open(directory_factory(), SMALL)  # index files of sealed segments
    assert [reopened.index_at_time(t) for t in probes] == before
    reopened.close()

    directory = directory_factory()
    for base in log.segment_base_indexes:  # every index file lost: rebuilt from the stores
        directory.remove(index_name(base))
    rebuilt = SegmentedLog.open(directory_factory(), SMALL)
    assert [_column(rebuilt, b) for b in rebuilt.segment_base_indexes] == columns
    assert [rebuilt.index_at_time(t) for t in probes] == before
    rebuilt.close()


def test_an_index_file_without_the_time_column_is_rebuilt(
    directory_factory: Callable[[], Directory],
) -> None:
    """An index file written before the time index (version 1) is not trusted: the store is
    scanned and the time column built from its batch headers."""
    log = SegmentedLog.open(directory_factory(), SMALL)
    fill_out_of_order(log, random.Random(5), 200)
    first = log.segment_base_indexes[0]
    expected = log.index_at_time(BASE_MS + 500)
    log.close()
    directory = directory_factory()
    storage = directory.open(index_name(first), create=False)
    data = bytearray(storage.read(0, storage.size))
    fields = list(INDEX_HEADER.unpack_from(data))
    assert fields[1] == INDEX_VERSION
    fields[1] = 1
    data[: INDEX_HEADER.size] = INDEX_HEADER.pack(*fields)
    storage.truncate(0)
    storage.write(0, (bytes(data),))
    storage.close()
    reopened = SegmentedLog.open(directory_factory(), SMALL)
    assert any(s.index_rebuilt for s in reopened.recovery.segments if s.base_index == first)
    assert reopened.index_at_time(BASE_MS + 500) == expected
    reopened.close()


def test_truncation_and_retention_keep_the_time_index_true(
    directory_factory: Callable[[], Directory],
) -> None:
    log = SegmentedLog.open(directory_factory(), SMALL)
    for i in range(60):
        log.append(batch([BASE_MS + 10 * i, BASE_MS + 10 * i + 5]), term=1)
    late = log.index_at_time(BASE_MS + 500)
    assert late == (100, BASE_MS + 500)
    log.truncate(90)  # a Raft repair cuts the tail, the time column with it
    assert log.index_at_time(BASE_MS + 500) is None
    assert log.index_at_time(BASE_MS + 445) == (89, BASE_MS + 445)
    log.append(batch([BASE_MS + 10_000]), term=2)
    assert log.index_at_time(BASE_MS + 500) == (90, BASE_MS + 10_000)
    log.remove_through(log.segment_base_indexes[1] - 1)  # retention: the oldest segment goes
    assert log.start_index > 0
    first = log.index_at_time(0)
    assert first == brute_force(log, 0, log.next_index)
    assert first is not None and first[0] == log.start_index
    log.close()


def test_a_log_of_control_batches_only_has_no_answer(
    directory_factory: Callable[[], Directory],
) -> None:
    log = SegmentedLog.open(directory_factory(), SMALL)
    assert log.index_at_time(0) is None
    for _ in range(5):
        log.append(batch([0], control=True), term=1)
    assert log.index_at_time(0) is None
    log.append(batch([5, 3]), term=1)
    assert log.index_at_time(0) == (5, 5)
    assert log.index_at_time(4) == (5, 5)
    assert log.index_at_time(6) is None
    log.close()


def test_written_off_the_loop_and_streamed_batches_are_in_the_time_index(
    directory_factory: Callable[[], Directory],
) -> None:
    log = SegmentedLog.open(directory_factory(), SMALL)
    write = log.begin_write([(batch([BASE_MS + i]), 1) for i in range(40)])
    write.run(sync=False)
    write.publish()
    data = batch([BASE_MS + 1_000, BASE_MS + 999])
    stream = log.begin_stream(data[:72])
    stream.write(data[72:])
    stream.commit()
    assert log.index_at_time(BASE_MS + 20) == (20, BASE_MS + 20)
    assert log.index_at_time(BASE_MS + 999) == (40, BASE_MS + 1_000)
    log.close()


def test_the_column_is_the_running_maximum() -> None:
    index = SegmentIndex()
    for slot, stamp in enumerate([NO_TIMESTAMP_MS, 50, 20, NO_TIMESTAMP_MS, 80, 10]):
        index.add(slot, 100 * slot, 1, stamp)
    assert list(index.max_timestamps) == [-1, 50, 50, 50, 80, 80]
    assert index.slot_at_time(0) == 1
    assert index.slot_at_time(51) == 4
    assert index.slot_at_time(81) is None
    decoded, _ = SegmentIndex.decode(index.encode(0, 6, 600), 0, 600)
    assert list(decoded.max_timestamps) == list(index.max_timestamps)


def _records(log: SegmentedLog) -> list[StoredRecord]:
    out: list[StoredRecord] = []
    index = log.start_index
    while index < log.next_index:
        result = log.read_range(index, 1 << 20)
        out += decode_batches(result.data)
        index = result.next_index
    return out


def _column(log: SegmentedLog, base: int) -> list[int]:
    """The time column of the segment starting at `base`."""
    segment = log._segments[log.segment_base_indexes.index(base)]
    return list(segment.index.max_timestamps)
