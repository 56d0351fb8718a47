"""A log written through the node's journal (`laminar.log.journal`): rounds as the node's
core plans them (`write_later`, `flush_journaled`, the journal's record), power cuts of the
log's and the journal's directories, and the replay on reopening (`LogStorage._replay`)."""

from __future__ import annotations

from laminar.log import LogConfig, MemoryDirectory, Record, SegmentedLog, encode_batch
from laminar.log.batch import decode_batch
from laminar.log.journal import MIN_JOURNAL_BYTES, Journal
from laminar.raft import ConfState, Entry, Snapshot
from laminar.raft.log_storage import LogStorage
from laminar.raft.repair import found_on_open

CONF = ConfState(("a", "b", "c"))
CONFIG = LogConfig(segment_bytes=4096, max_batch_bytes=2048)
KEY = "t/0"


def entries_from(first: int, terms: list[int], tag: str = "") -> list[Entry]:
    """One-record entries from index `first`, of these terms."""
    return [
        Entry(first + n, 1, term, encode_batch([Record(f"{tag}{first + n}".encode())], now_ms=0))
        for n, term in enumerate(terms)
    ]


class Node:
    """One log and the journal, each in a directory of its own that a power cut hits."""

    def __init__(self) -> None:
        self.log_dir = MemoryDirectory()
        self.journal_dir = MemoryDirectory()
        self.journal = Journal.open(self.journal_dir, MIN_JOURNAL_BYTES)
        self.storage = LogStorage(self.log_dir, SegmentedLog.open(self.log_dir, CONFIG), conf=CONF)

    def round(self, entries: list[Entry], *, synced: bool = True) -> None:
        """A round that writes `entries` through the journal; `synced` False: cut short by
        a crash after its writes, before the journal's fdatasync."""
        storage = self.storage
        storage.write_later(entries)
        assert storage.journals
        flush, planned = storage.flush_journaled()
        assert not flush.syncs  # the log is not synced: the journal's record holds them
        section = (KEY, storage.journal_epoch, [(e.index, e.term, e.data) for e in planned])
        record = self.journal.write_round([section])
        flush.write()
        record.write()
        if synced:
            record.sync()
        flush.publish()

    def power_cut(self) -> None:
        self.log_dir.crash()
        self.journal_dir.crash()
        self.journal = Journal.open(self.journal_dir, MIN_JOURNAL_BYTES)
        self.storage = LogStorage(
            self.log_dir,
            SegmentedLog.open(self.log_dir, CONFIG),
            conf=CONF,
            replay=self.journal.take(KEY),
        )
        self.journal.restart()

    def log(self) -> list[tuple[int, int, list[bytes]]]:
        storage, entries = self.storage, []
        while (at := storage.first_index() + sum(e.count for e in entries)) <= storage.last_index():
            entries += storage.entries(at, 1 << 20)  # (a read ends at a segment's end)
        return expected(entries)


def expected(entries: list[Entry]) -> list[tuple[int, int, list[bytes]]]:
    """(index, term, values) of each entry (a stored batch carries its index and term)."""
    return [(e.index, e.term, [r.value for r in decode_batch(e.data)]) for e in entries]


def test_entries_only_the_journal_made_durable_come_back_into_the_log() -> None:
    node = Node()
    first, second = entries_from(0, [1, 1, 1]), entries_from(3, [1, 2])
    node.round(first)
    node.round(second)
    node.power_cut()
    assert node.log() == expected(first + second)
    node.power_cut()  # the replay synced the log, and the journal started anew
    assert node.log() == expected(first + second)
    assert node.journal.untaken() == []


def test_a_round_whose_record_was_not_synced_is_not_redone() -> None:
    node = Node()
    node.round(entries_from(0, [1, 1]))
    node.round(entries_from(2, [1]), synced=False)
    node.power_cut()
    assert [i for i, _, _ in node.log()] == [0, 1]


def test_a_conflicting_suffix_replaces_the_old_one_in_the_order_written() -> None:
    """A follower's log cut by a new leader's entries: replaying the older record first
    brings the old suffix back, the newer record cuts it again."""
    node = Node()
    old = entries_from(0, [1, 1, 1], "old")
    node.round(old)
    new = entries_from(1, [2, 2], "new")
    node.round(new)
    node.power_cut()
    assert node.log() == expected(old[:1] + new)
    # and without the newer record's sync: the state before that round, whole
    node = Node()
    node.round(old)
    node.round(new, synced=False)
    node.power_cut()
    assert node.log() == expected(old)


def test_records_of_an_epoch_before_a_snapshot_install_are_not_replayed() -> None:
    node = Node()
    node.round(entries_from(0, [1] * 8, "replaced"))
    node.storage.apply_snapshot(Snapshot(4, 2, CONF, b"state"))
    node.power_cut()  # (the old records would write 5 to 7 again after the snapshot)
    assert (node.storage.first_index(), node.storage.last_index()) == (5, 4)
    after = entries_from(5, [2, 2], "kept")
    node.round(after)
    node.power_cut()
    assert node.log() == expected(after)


def test_damage_the_journal_makes_whole_is_no_damage() -> None:
    """Pages of the log lost from inside what was written (the kernel wrote a later round's
    page, not an earlier one's): the log's recovery cuts there and reports records lost,
    and the journal's replay writes them again, so the replica opens without a repair."""
    node = Node()
    rounds = [entries_from(0, [1, 1]), entries_from(2, [1, 1]), entries_from(4, [1])]
    for entries in rounds:
        node.round(entries)
    node.storage.sync()  # every page reached the disk...
    segment = next(n for n in node.log_dir.names() if n.endswith(".log"))
    store = node.log_dir.files[segment]
    at = store.data.find(rounds[1][0].data[-8:])
    store.data[at] ^= 0xFF  # ...but one of the second round's did not
    store.sync()
    node.journal_dir.crash()
    node.journal = Journal.open(node.journal_dir, MIN_JOURNAL_BYTES)
    log = SegmentedLog.open(node.log_dir, CONFIG)
    assert log.recovery.lost is not None and log.next_index == 2
    storage = LogStorage(node.log_dir, log, conf=CONF, replay=node.journal.take(KEY))
    node.storage = storage
    assert node.log() == expected([e for entries in rounds for e in entries])
    assert found_on_open(storage) is None


def test_a_log_cut_since_the_checkpoint_journals_even_a_large_write() -> None:
    """After a cut, the records from before it would cut the log again on replay, and only
    the newer records redo what follows: a write that synced the log itself instead of going
    through the journal would be cut away (and it may have been acknowledged)."""
    node = Node()
    node.round(entries_from(0, [1, 1, 1]))
    assert not node.storage.must_journal
    new = entries_from(1, [2])
    node.round(new)  # a new leader's entry replaces the suffix from 1
    assert node.storage.must_journal
    large = entries_from(2, [2] * 3, "x" * 1900)
    node.round(large)  # (the core journals it, however large)
    node.power_cut()
    assert [(i, t) for i, t, _ in node.log()] == [(0, 1), (1, 2), (2, 2), (3, 2), (4, 2)]
    # a checkpoint syncs it: then it may bypass
    assert node.storage.sync_job(writeback=True) is not None
    assert not node.storage.must_journal


def test_what_only_the_journal_held_past_damage_is_the_repairs_floor() -> None:
    """Damage in synced data cuts the log there; the journal holds only what was written
    since its checkpoint, past the cut, so its replay stops. Those entries were durable here
    (and may have been acknowledged): the repair's floor is the last of them, not the last
    the log's own file still told."""
    node = Node()
    node.round(entries_from(0, [1] * 4, "early"))
    job = node.storage.sync_job(writeback=True)  # a checkpoint: the log synced, the journal emptied
    assert callable(job)
    job()
    node.journal.begin_checkpoint()()
    store = node.log_dir.files["00000000000000000000.log"]
    store.write(store.data.find(b"early1"), [b"EARLY1"])  # damage in what was synced
    store.sync()
    node.round(entries_from(4, [2] * 3, "late"))  # in the journal only
    node.power_cut()
    damage = found_on_open(node.storage)
    assert damage is not None and damage.first_index == 1
    assert damage.floor == (6, 2)
