"""The node's journal: records written, synced and scanned back; what a crash, a torn or
damaged record, a wrap and a checkpoint leave of them (in memory, whose `crash` loses what
was not synced, and in real files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from laminar.log import FileDirectory, MemoryDirectory
from laminar.log.errors import StorageError
from laminar.log.journal import (
    HEAD_BYTES,
    JOURNAL_FILE,
    MIN_JOURNAL_BYTES,
    RING_START,
    SLOT_BYTES,
    Journal,
    JournalEntry,
    Section,
)
from laminar.log.storage import Directory, DirectWrite
from laminar.server.disk_threads import DiskThreads

Entries = list[tuple[int, int, bytes]]


def write(journal: Journal, sections: list[tuple[str, int, Entries]]) -> None:
    """One round's record, written and synced (as a round's job runs it)."""
    body = sum(journal.body_bytes(key, [len(d) for _, _, d in es]) for key, _, es in sections)
    assert journal.fits(body)
    journal.write_round(sections).run()


def entries(key: str, journal: Journal) -> list[tuple[int, int, int, bytes]]:
    """(epoch, index, term, data) of every entry scanned for `key`, in order."""
    return [(s.epoch, e.index, e.term, e.data) for s in journal.take(key) for e in s.entries]


def reopened(directory: Directory, size: int = MIN_JOURNAL_BYTES) -> Journal:
    return Journal.open(directory, size)


def test_records_come_back_in_order_by_log_and_epoch() -> None:
    directory = MemoryDirectory()
    journal = Journal.open(directory, MIN_JOURNAL_BYTES)
    write(journal, [("t/0", 7, [(0, 1, b"a"), (1, 1, b"bb")]), ("__cluster", 3, [(5, 2, b"m")])])
    write(journal, [("t/0", 7, [(2, 1, b"c")])])
    write(journal, [("t/0", 8, [(0, 2, b"d")])])  # a new epoch (a snapshot installed)
    again = reopened(directory)
    found = again.take("t/0")
    assert [s.epoch for s in found] == [7, 8]
    assert found[0].entries == [
        JournalEntry(0, 1, b"a"),
        JournalEntry(1, 1, b"bb"),
        JournalEntry(2, 1, b"c"),
    ]
    assert found[1] == Section(8, [JournalEntry(0, 2, b"d")])
    assert again.untaken() == ["__cluster"]
    assert entries("__cluster", again) == [(3, 5, 2, b"m")]
    assert again.take("t/0") == []  # given out once


def test_a_record_not_synced_is_lost_by_a_crash_and_those_before_stay() -> None:
    directory = MemoryDirectory()
    journal = Journal.open(directory, MIN_JOURNAL_BYTES)
    write(journal, [("t/0", 1, [(0, 1, b"durable")])])
    journal.write_round([("t/0", 1, [(1, 1, b"written only")])]).write()
    directory.crash()
    assert entries("t/0", reopened(directory)) == [(1, 0, 1, b"durable")]


@pytest.mark.parametrize("where", ["head", "body"])
def test_a_damaged_record_ends_the_journal(where: str) -> None:
    directory = MemoryDirectory()
    journal = Journal.open(directory, MIN_JOURNAL_BYTES)
    write(journal, [("t/0", 1, [(0, 1, b"first")])])
    second = RING_START + HEAD_BYTES + journal.body_bytes("t/0", [5])
    write(journal, [("t/0", 1, [(1, 1, b"second")])])
    write(journal, [("t/0", 1, [(2, 1, b"third")])])
    storage = directory.files[JOURNAL_FILE]
    at = second + (3 if where == "head" else HEAD_BYTES + 20)
    storage.data[at] ^= 0x40
    storage.sync()
    again = reopened(directory)
    assert entries("t/0", again) == [(1, 0, 1, b"first")]
    # the scan's end is where the next record goes: the damaged ones are written over
    again.restart()
    write(again, [("t/0", 1, [(1, 1, b"again")])])
    assert entries("t/0", reopened(directory)) == [(1, 1, 1, b"again")]


def test_a_checkpoint_frees_the_ring_and_records_wrap_around_it() -> None:
    directory = MemoryDirectory()
    journal = Journal.open(directory, MIN_JOURNAL_BYTES)
    payload = bytes(range(256)) * 20  # 5 KiB a record: a lap is about 13 of them
    live: list[int] = []
    checkpoints = 0
    for index in range(60):
        body = journal.body_bytes("t/0", [len(payload)])
        if journal.wants_checkpoint or not journal.fits(body):
            journal.begin_checkpoint()()
            checkpoints += 1
            live = []
        write(journal, [("t/0", 1, [(index, 1, payload)])])
        live.append(index)
        assert [i for _, i, _, _ in entries("t/0", reopened(directory))] == live
    assert checkpoints >= 4  # (300 KiB went round a ring of 64 KiB, and were scanned)


def test_space_not_checkpointed_is_never_written_over() -> None:
    journal = Journal.open(MemoryDirectory(), MIN_JOURNAL_BYTES)
    payload = bytes(8 << 10)
    while journal.fits(journal.body_bytes("t/0", [len(payload)])):
        write(journal, [("t/0", 1, [(0, 1, payload)])])
    assert journal.wants_checkpoint
    with pytest.raises(StorageError, match="checkpoint first"):
        journal.write_round([("t/0", 1, [(0, 1, payload)])])
    journal.begin_checkpoint()()
    assert journal.used_bytes == 0
    assert journal.fits(journal.body_bytes("t/0", [len(payload)]))


def test_a_checkpoint_whose_header_was_not_synced_keeps_the_records() -> None:
    """The header slots are written in turn: a torn new one leaves the old start, and the
    records after it are scanned again (replay is idempotent)."""
    directory = MemoryDirectory()
    journal = Journal.open(directory, MIN_JOURNAL_BYTES)
    write(journal, [("t/0", 1, [(0, 1, b"a")])])
    journal.begin_checkpoint()()  # generation 1, in slot 1
    write(journal, [("t/0", 1, [(1, 1, b"b")])])
    journal.begin_checkpoint()  # generation 2 (slot 0): its header never written
    directory.crash()
    assert entries("t/0", reopened(directory)) == [(1, 1, 1, b"b")]
    storage = directory.files[JOURNAL_FILE]
    storage.data[SLOT_BYTES + 2] ^= 1  # slot 1 damaged: slot 0's generation 0 is taken
    storage.sync()
    assert [i for _, i, _, _ in entries("t/0", reopened(directory))] == [0, 1]
    storage.data[2] ^= 1
    storage.sync()
    with pytest.raises(StorageError, match="no valid header"):
        reopened(directory)


def test_a_journal_of_another_size_is_read_then_made_anew_at_the_new_one() -> None:
    directory = MemoryDirectory()
    journal = Journal.open(directory, MIN_JOURNAL_BYTES)
    write(journal, [("t/0", 1, [(0, 1, b"kept")])])
    bigger = Journal.open(directory, 2 * MIN_JOURNAL_BYTES)
    assert entries("t/0", bigger) == [(1, 0, 1, b"kept")]
    bigger.restart()
    assert directory.files[JOURNAL_FILE].size == 2 * MIN_JOURNAL_BYTES
    write(bigger, [("t/0", 1, [(1, 1, b"new")])])
    assert entries("t/0", reopened(directory, 2 * MIN_JOURNAL_BYTES)) == [(1, 1, 1, b"new")]
    with pytest.raises(ValueError, match="at least"):
        Journal.open(directory, MIN_JOURNAL_BYTES - 1)


async def test_real_files_through_the_rounds_threads(tmp_path: Path) -> None:
    """On disk: the record's write and fdatasync run by the threads that run a round's disk
    work (as a DirectWrite, without the GIL), scanned back by a new opening."""
    directory = FileDirectory(str(tmp_path))
    journal = Journal.open(directory, MIN_JOURNAL_BYTES)
    assert (tmp_path / JOURNAL_FILE).stat().st_size == MIN_JOURNAL_BYTES
    job = journal.write_round([("t/3", 9, [(10, 2, b"x" * 1000), (11, 2, b"y")])]).job()
    assert isinstance(job, DirectWrite)
    threads = DiskThreads(1, "test-journal")
    try:
        await threads.run([job])
    finally:
        threads.unwatch()
        threads.close()
    journal.close()
    again = Journal.open(FileDirectory(str(tmp_path)), MIN_JOURNAL_BYTES)
    assert entries("t/3", again) == [(9, 10, 2, b"x" * 1000), (9, 11, 2, b"y")]
    again.close()


def test_a_checkpoint_beside_the_rounds_moves_the_start_with_a_later_record() -> None:
    """The logs are synced beside the rounds; then a round's record carries the header that
    starts the journal where the next record was when they began (`mark`): that space is
    free only once that round is done (`moved`), and a later checkpoint's start wins."""
    directory = MemoryDirectory()
    journal = Journal.open(directory, MIN_JOURNAL_BYTES)
    write(journal, [("t/0", 1, [(0, 1, b"before")])])
    start = journal.mark()  # (the logs are synced from here on, beside the rounds)
    write(journal, [("t/0", 1, [(1, 1, b"beside")])])
    used = journal.used_bytes
    header = journal.header_to(start)
    assert header is not None
    journal.write_round([("t/0", 1, [(2, 1, b"with the header")])], header).run()
    assert journal.used_bytes > used  # not free before its round is done
    journal.moved(start)
    assert [i for _, i, _, _ in entries("t/0", reopened(directory))] == [1, 2]
    assert journal.header_to(start) is None  # (there already)
    journal.begin_checkpoint()()
    journal.moved(start)  # an older start changes nothing
    assert journal.used_bytes == 0
    assert entries("t/0", reopened(directory)) == []
