"""Raft storage over the segmented log: entries are batches, hard state survives crashes."""

from __future__ import annotations

import pytest

from laminar.log import (
    LogConfig,
    MemoryDirectory,
    Record,
    SegmentedLog,
    encode_batch,
    segmented_log,
)
from laminar.log.batch import BATCH_HEADER_BYTES, verify_batch
from laminar.log.errors import BatchChecksumError
from laminar.raft import (
    ConfChange,
    ConfChangeKind,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    Snapshot,
    StorageUnavailable,
    scan_pending_confs,
)
from laminar.raft.log_storage import LogStorage, entry_kind
from laminar.raft.raft import encode_control

CONF = ConfState(("a", "b", "c"))
CONFIG = LogConfig(segment_bytes=4096, max_batch_bytes=2048)


def batch(tag: int, count: int) -> Entry:
    data = encode_batch([Record(value=f"{tag}.{i}".encode()) for i in range(count)], now_ms=0)
    return Entry(0, count, 0, data)


def entries_from(first: int, specs: list[tuple[int, int]]) -> list[Entry]:
    """Entries (count, term) laid out from index `first`."""
    out, index = [], first
    for tag, (count, term) in enumerate(specs):
        template = batch(tag, count)
        out.append(Entry(index, count, term, template.data))
        index += count
    return out


def open_storage(directory: MemoryDirectory) -> LogStorage:
    return LogStorage(directory, SegmentedLog.open(directory, CONFIG), conf=CONF)


def test_fresh_storage_bootstraps_the_group() -> None:
    storage = open_storage(MemoryDirectory())
    hard_state, snapshot = storage.initial_state()
    assert hard_state == HardState(conf=CONF)
    assert (snapshot.index, snapshot.term) == (-1, 0)
    assert (storage.first_index(), storage.last_index(), storage.term(-1)) == (0, -1, 0)
    with pytest.raises(StorageUnavailable):
        storage.term(0)


def test_the_bootstrap_configuration_survives_a_power_cut_at_once() -> None:
    """Regression (the fault suite, kill -9 of every broker as a dead-letter topic was
    created): its replicas came back with no voters, and the partition never had a leader."""
    directory = MemoryDirectory()
    open_storage(directory)  # created, then nothing else happens before the crash
    directory.crash()
    reopened = LogStorage(directory, SegmentedLog.open(directory, CONFIG), conf=ConfState(()))
    assert reopened.initial_state()[0].conf == CONF


def test_entries_are_batches_with_their_terms_and_kinds() -> None:
    storage = open_storage(MemoryDirectory())
    storage.append(entries_from(0, [(3, 1), (1, 1), (2, 2)]))
    assert storage.last_index() == 5
    assert [storage.term(i) for i in range(6)] == [1, 1, 1, 1, 2, 2]
    assert storage.batch_start(2) == 0 and storage.batch_start(5) == 4
    read = storage.entries(3, 1 << 20)
    assert [(e.index, e.count, e.term, e.kind) for e in read] == [
        (3, 1, 1, EntryKind.NORMAL),
        (4, 2, 2, EntryKind.NORMAL),
    ]
    # a conflicting append from a new leader replaces the suffix
    storage.append(entries_from(3, [(2, 3)]))
    assert (storage.last_index(), storage.term(4)) == (4, 3)
    noop = encode_control(EntryKind.NOOP)
    conf = encode_control(EntryKind.CONF, ConfChange(ConfChangeKind.ADD_LEARNER, "d"))
    assert (entry_kind(noop), entry_kind(conf), entry_kind(batch(1, 1).data)) == (
        EntryKind.NOOP,
        EntryKind.CONF,
        EntryKind.NORMAL,
    )


def test_hard_state_and_synced_entries_survive_a_power_cut() -> None:
    directory = MemoryDirectory()
    storage = open_storage(directory)
    storage.append(entries_from(0, [(2, 1), (2, 1)]))
    storage.sync()
    storage.set_hard_state(HardState(2, "b", 1, CONF))
    storage.append(entries_from(4, [(1, 2)]))  # written, never synced
    directory.crash()
    reopened = open_storage(directory)
    assert reopened.initial_state()[0] == HardState(2, "b", 1, CONF)
    assert reopened.last_index() == 3


def test_snapshot_install_and_compaction_persist_the_snapshot_point() -> None:
    directory = MemoryDirectory()
    storage = open_storage(directory)
    storage.append(entries_from(0, [(2, 1)] * 40))
    storage.sync()
    storage.set_hard_state(HardState(1, None, 59, CONF))
    storage.compact(59)
    storage.log.remove_through(59)
    assert storage.first_index() == 60 and storage.term(59) == 1
    assert storage.snapshot().index == 59
    with pytest.raises(StorageUnavailable):
        storage.compact(60)  # not the end of a batch
    storage.apply_snapshot(Snapshot(99, 4, ConfState(("a", "b"))))
    assert (storage.first_index(), storage.last_index(), storage.term(99)) == (100, 99, 4)
    directory.crash()
    reopened = open_storage(directory)
    assert reopened.snapshot() == Snapshot(99, 4, ConfState(("a", "b")))
    assert (reopened.first_index(), reopened.last_index()) == (100, 99)


def test_pending_configuration_changes_are_found_after_the_commit() -> None:
    storage = open_storage(MemoryDirectory())
    add = ConfChange(ConfChangeKind.ADD_LEARNER, "d")
    promote = ConfChange(ConfChangeKind.PROMOTE, "d")
    data = [
        batch(0, 2).data,
        encode_control(EntryKind.CONF, add),
        batch(1, 1).data,
        encode_control(EntryKind.CONF, promote),
    ]
    index, entries = 0, []
    for item, count in zip(data, (2, 1, 1, 1), strict=True):
        entries.append(Entry(index, count, 1, item))
        index += count
    storage.append(entries)
    assert scan_pending_confs(storage, -1) == {2: add, 4: promote}
    assert scan_pending_confs(storage, 2) == {4: promote}


def test_snapshot_data_survives_restarts_and_installs() -> None:
    directory = MemoryDirectory()
    storage = open_storage(directory)
    storage.append(entries_from(0, [(1, 1)] * 10))
    storage.sync()
    storage.compact(5, b"state machine as of 5")
    directory.crash()
    assert open_storage(directory).snapshot().data == b"state machine as of 5"
    follower_directory = MemoryDirectory()
    follower = open_storage(follower_directory)
    follower.apply_snapshot(Snapshot(5, 1, CONF, b"state machine as of 5"))
    follower_directory.crash()
    reopened = open_storage(follower_directory)
    assert reopened.snapshot() == Snapshot(5, 1, CONF, b"state machine as of 5")


def test_a_repair_records_its_floor_before_it_cuts_and_both_survive_a_crash() -> None:
    directory = MemoryDirectory()
    storage = open_storage(directory)
    storage.append(entries_from(0, [(2, 1), (2, 1), (2, 2)]))
    storage.sync()
    storage.set_hard_state(HardState(2, "a", 5, CONF))
    storage.begin_repair(2, (5, 2))
    assert (storage.last_index(), storage.hard_state.commit) == (1, 1)
    directory.crash()
    reopened = open_storage(directory)
    assert reopened.last_index() == 1
    assert reopened.hard_state == HardState(2, "a", 1, CONF, (5, 2))


def test_a_repair_below_the_snapshot_point_restarts_the_log_after_it() -> None:
    """Records at or below the snapshot point are kept only because retention removes whole
    segments: damage there drops the log, which starts again right after the point."""
    storage = open_storage(MemoryDirectory())
    storage.append(entries_from(0, [(2, 1), (2, 1), (2, 1)]))
    storage.set_hard_state(HardState(1, None, 5, CONF))
    storage.compact(3)
    storage.begin_repair(1, (5, 1))
    assert (storage.first_index(), storage.last_index(), storage.log.start_index) == (4, 3, 4)
    assert storage.hard_state.commit == 3


def test_a_later_floor_keeps_the_more_up_to_date_one() -> None:
    storage = open_storage(MemoryDirectory())
    storage.append(entries_from(0, [(1, 1)] * 4))
    storage.begin_repair(2, (3, 2))
    storage.begin_repair(1, (9, 1))  # a longer log, but of an older term
    assert storage.hard_state.repair_floor == (3, 2)
    storage.begin_repair(0, (1, 3))
    assert storage.hard_state.repair_floor == (1, 3)
    assert storage.last_index() == -1


def test_the_commit_index_hint_is_written_every_commit_save_indexes() -> None:
    """Without fsync: a process crash keeps it (the page cache), a power cut may not."""
    directory = MemoryDirectory()
    storage = LogStorage(directory, SegmentedLog.open(directory, CONFIG), conf=CONF,
                         commit_save_indexes=4)  # fmt: skip
    storage.append(entries_from(0, [(1, 1)] * 10))
    storage.sync()
    storage.set_hard_state(HardState(1, "a", 2, CONF))  # a term change: the state is saved
    storage.set_hard_state(HardState(1, "a", 5, CONF))  # 3 past the saved commit: remembered
    assert open_storage(directory).hard_state.commit == 2
    storage.set_hard_state(HardState(1, "a", 6, CONF))  # 4 past it: the hint
    reopened = open_storage(directory)
    assert reopened.hard_state.commit == 6 and reopened.commit_term == 1
    assert reopened.lost_floor() is None
    directory.crash()  # the hint was never synced
    assert open_storage(directory).hard_state.commit == 2
    storage = open_storage(directory)
    storage.set_hard_state(HardState(1, "a", 9, CONF))
    storage.close()  # a clean close saves it durably
    directory.crash()
    assert open_storage(directory).hard_state.commit == 9


def test_a_torn_commit_hint_is_ignored() -> None:
    directory = MemoryDirectory()
    storage = LogStorage(directory, SegmentedLog.open(directory, CONFIG), conf=CONF,
                         commit_save_indexes=1)  # fmt: skip
    storage.append(entries_from(0, [(1, 1)] * 3))
    storage.set_hard_state(HardState(1, None, 0, CONF))
    storage.set_hard_state(HardState(1, None, 2, CONF))
    assert open_storage(directory).hard_state.commit == 2
    directory.open("raft.commit", create=False).write(3, (b"\xff",))
    assert open_storage(directory).hard_state.commit == 0


def test_a_snapshot_install_cut_short_by_a_crash_completes_on_reopening() -> None:
    """The state file names the snapshot before the log is emptied: a crash in between (here
    the log's reset fails) leaves a log that does not hold the snapshot's last entry, and
    opening empties it as the install would have. A log that does hold it is kept."""
    directory = MemoryDirectory()
    storage = open_storage(directory)
    storage.append(entries_from(0, [(10, 1), (10, 1)]))  # 0..19, term 1
    storage.sync()

    def crash(start_index: int) -> None:
        raise OSError("killed mid-install")

    storage.log.reset = crash  # type: ignore[method-assign]
    with pytest.raises(OSError):
        storage.apply_snapshot(Snapshot(29, 3, ConfState(("a", "b"))))  # beyond the log
    directory.crash()
    reopened = open_storage(directory)
    assert reopened.snapshot().index == 29
    assert (reopened.first_index(), reopened.last_index()) == (30, 29)

    kept = MemoryDirectory()
    storage = open_storage(kept)
    storage.append(entries_from(0, [(10, 1), (10, 1)]))
    storage.sync()
    storage.log.reset = crash  # type: ignore[method-assign]
    with pytest.raises(OSError):
        storage.apply_snapshot(Snapshot(9, 1, CONF))  # the log holds 9 with term 1
    kept.crash()
    assert open_storage(kept).last_index() == 19


def test_entries_written_later_are_part_of_the_log_only_once_published() -> None:
    """The broker's round: `write_later` plans (on the event loop), `Flush.run` writes and
    syncs (an I/O thread), `publish` (back on the loop) makes them part of the log."""
    directory = MemoryDirectory()
    storage = open_storage(directory)
    storage.append(entries_from(0, [(2, 1), (3, 1)]))
    storage.sync()
    storage.write_later(entries_from(5, [(1, 2), (4, 2)]))
    assert storage.planned
    flush = storage.flush(sync=True)
    assert not storage.planned and flush.writes and flush.syncs
    flush.run()
    # written and synced, not published: the storage is as before
    assert storage.last_index() == 4
    assert [e.index for e in storage.entries(0, 1 << 20)] == [0, 2]
    with pytest.raises(StorageUnavailable):
        storage.term(5)
    flush.publish()
    assert storage.last_index() == 9 and storage.term(9) == 2
    assert [e.index for e in storage.entries(0, 1 << 20)] == [0, 2, 5, 6]
    directory.crash()  # synced by the flush
    assert open_storage(directory).last_index() == 9


def test_a_batch_checked_as_it_was_proposed_is_written_without_checking_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A leader checks a batch as it enters the cluster (the API's `verify_batch`) and tells
    the storage (`checked`): its write takes that check's header and digest. Data at that
    index that is not the very object checked (another leader's entry, which replaced the
    proposal) is checked, and what `checked` said is forgotten by the write."""
    verified: list[int] = []

    def counting(data: bytes, limit: int, *, check_records: bool = True) -> object:
        verified.append(len(data))
        return verify_batch(data, limit, check_records=check_records)

    monkeypatch.setattr(segmented_log, "verify_batch", counting)
    storage = open_storage(MemoryDirectory())
    first, second = entries_from(0, [(2, 1), (1, 1)])
    storage.checked(0, first.data, *verify_batch(first.data, CONFIG.batch_limit_bytes))
    damaged = bytearray(second.data)
    damaged[-1] ^= 1
    # index 2 was checked as a proposal; the entry there now holds other (damaged) bytes
    storage.checked(2, second.data, *verify_batch(second.data, CONFIG.batch_limit_bytes))
    with pytest.raises(BatchChecksumError):
        storage.write_later([first, Entry(2, 1, 1, bytes(damaged))])
    assert verified == [len(damaged)]  # `first` was not checked again
    storage.write_later([first, second])  # forgotten by the last write: both checked
    assert verified == [len(damaged), len(first.data), len(second.data)]
    flush = storage.flush(sync=True)
    flush.run()
    flush.publish()
    stored = [(e.index, e.data[BATCH_HEADER_BYTES:]) for e in storage.entries(0, 1 << 20)]
    assert stored == [(0, first.data[BATCH_HEADER_BYTES:]), (2, second.data[BATCH_HEADER_BYTES:])]


def test_a_conflicting_suffix_is_cut_when_the_write_is_planned() -> None:
    directory = MemoryDirectory()
    storage = open_storage(directory)
    storage.append(entries_from(0, [(2, 1), (3, 1), (1, 1)]))
    storage.write_later(entries_from(2, [(2, 3)]))  # replaces 2..5
    assert storage.last_index() == 1  # cut now: nothing reads the old suffix any more
    flush = storage.flush(sync=False)
    flush.run()
    flush.publish()
    assert storage.last_index() == 3 and storage.term(2) == 3
    assert [(e.index, e.term) for e in storage.entries(0, 1 << 20)] == [(0, 1), (2, 3)]


def test_a_flush_syncs_the_files_staged_when_it_was_made() -> None:
    directory = MemoryDirectory()
    storage = open_storage(directory)
    storage.stage_file("queue.checkpoint", b"first")
    flush = storage.flush(sync=True)
    assert not storage.needs_sync and not flush.writes
    storage.stage_file("topic.json", b"later")  # staged after: the next flush's
    flush.run()
    flush.publish()
    assert storage.needs_sync
    directory.crash()
    reopened = open_storage(directory)
    assert reopened.load_file("queue.checkpoint") == b"first"
    assert reopened.load_file("topic.json") is None


def test_a_write_planned_by_a_round_that_failed_before_its_flush_is_planned_again() -> None:
    storage = open_storage(MemoryDirectory())
    storage.write_later(entries_from(0, [(2, 1)]))
    storage.write_later(entries_from(0, [(2, 1), (1, 1)]))  # the next round's Ready
    flush = storage.flush(sync=True)
    flush.run()
    flush.publish()
    assert storage.last_index() == 2
