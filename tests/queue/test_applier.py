"""A replica's consumer groups follow its committed log on real files: they survive a restart
(snapshot data plus the log after it), retention, and the install of a snapshot taken later
than the new log start; entries already in the state are never applied twice."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from laminar.log import FileDirectory, LogConfig, Record, SegmentedLog, encode_batch
from laminar.queue import Accept, Acquire, QueueCommand, QueueState, Reject
from laminar.queue.applier import CHECKPOINT_FILE, QueueApplier
from laminar.queue.entries import QUEUE_KEY, apply_entry, decode_entry, encode_entry
from laminar.raft import ConfState, Entry, HardState, Snapshot
from laminar.raft.log_storage import LogStorage

CONFIG = LogConfig(segment_bytes=4096, max_batch_bytes=2048, retention_bytes=8192)
G = "workers"


def open_storage(path: Path) -> LogStorage:
    directory = FileDirectory(str(path))
    return LogStorage(directory, SegmentedLog.open(directory, CONFIG), conf=ConfState(("a",)))


class Writer:
    def __init__(self, storage: LogStorage) -> None:
        self.storage = storage

    def append(self, data: bytes, count: int) -> int:
        index = self.storage.last_index() + 1
        self.storage.append([Entry(index, count, 1, data)])
        return index

    def records(self, count: int) -> list[int]:
        data = encode_batch([Record(value=f"m{i}".encode()) for i in range(count)], now_ms=0)
        base = self.append(data, count)
        return list(range(base, base + count))

    def command(self, command: QueueCommand) -> int:
        return self.append(encode_entry(command), 1)

    def commit(self) -> None:
        storage = self.storage
        storage.sync()
        storage.set_hard_state(replace(storage.hard_state, term=1, commit=storage.last_index()))


def test_queue_entries_are_control_batches_that_decode_back() -> None:
    command = Reject(G, "c", (3, 4), "bad")
    assert decode_entry(encode_entry(command)) == command


def test_groups_survive_a_restart_and_commands_apply_once(tmp_path: Path) -> None:
    storage = open_storage(tmp_path)
    writer = Writer(storage)
    applier = QueueApplier(storage)
    indexes = writer.records(5)
    writer.command(Acquire(G, "c", tuple(indexes), 60_000, 0))
    writer.command(Accept(G, "c", tuple(indexes[:2])))
    writer.commit()
    applied = applier.catch_up(storage.last_index())
    assert [type(a.command) for a in applied] == [Acquire, Accept]
    assert applier.catch_up(storage.last_index()) == []  # nothing twice
    before = applier.snapshot_data()
    storage.close()
    storage.log.close()

    reopened = open_storage(tmp_path)
    again = QueueApplier(reopened)  # replays the committed log
    assert again.snapshot_data() == before
    assert again.state.describe(G)["accepted"] == 2


def test_retention_snapshot_carries_the_groups_and_an_installed_one_restarts_them(
    tmp_path: Path,
) -> None:
    storage = open_storage(tmp_path / "leader")
    writer = Writer(storage)
    applier = QueueApplier(storage)
    for _ in range(40):  # enough batches for several 4 KiB segments
        indexes = writer.records(3)
        writer.command(Acquire(G, "c", tuple(indexes), 60_000, 0))
        writer.command(Accept(G, "c", tuple(indexes)))
    held = writer.records(2)
    writer.command(Acquire(G, "c", tuple(held), 60_000, 0))
    writer.commit()
    applier.catch_up(storage.last_index())
    point = storage.log.retention_point(limit_index=applier.applied_index) or -1
    assert point > 0
    storage.compact(point, applier.snapshot_data())
    storage.log.remove_through(point)
    applier.trim()
    expected = applier.state.describe(G)
    assert expected["accepted"] == 120 and expected["acquired"] == 2
    storage.close()
    storage.log.close()

    restarted = QueueApplier(open_storage(tmp_path / "leader"))
    assert restarted.state.describe(G) == expected

    # a follower installs the leader's snapshot: its log restarts at the point, its groups at
    # the (later) index the data was taken at, and the entries in between are skipped
    follower = open_storage(tmp_path / "follower")
    follower_groups = QueueApplier(follower)
    snap = storage.snapshot()
    follower.apply_snapshot(Snapshot(snap.index, snap.term, snap.conf, snap.data))
    follower_groups.reset()
    source = open_storage(tmp_path / "leader")
    for entry in source.entries(point + 1, 1 << 20):
        follower.append([entry])
    follower.set_hard_state(HardState(1, None, follower.last_index(), follower.hard_state.conf))
    follower_groups.catch_up(follower.last_index())
    assert follower_groups.state.describe(G) == expected
    assert follower_groups.snapshot_data() == restarted.snapshot_data()


def test_a_checkpoint_spares_the_replay_after_a_restart(tmp_path: Path) -> None:
    storage = open_storage(tmp_path)
    writer = Writer(storage)
    storage.set_hard_state(replace(storage.hard_state, term=1))  # saved: the term changed
    applier = QueueApplier(storage, checkpoint_indexes=10)
    for _ in range(5):
        indexes = writer.records(3)
        writer.command(Acquire(G, "c", tuple(indexes), 60_000, 0))
        writer.command(Accept(G, "c", tuple(indexes)))
    writer.commit()
    applier.catch_up(storage.last_index())
    # staged: it replaces the old checkpoint at the round's sync, off the event loop
    assert storage.needs_sync and storage.load_file(CHECKPOINT_FILE) is None
    storage.sync()
    assert storage.load_file(CHECKPOINT_FILE) == applier.snapshot_data()
    storage.log.close()  # a crash: the commit index was never saved (it is saved lazily)

    reopened = open_storage(tmp_path)
    assert reopened.hard_state.commit == -1
    restarted = QueueApplier(reopened)
    assert restarted.state.describe(G)["accepted"] == 15
    assert restarted.catch_up(reopened.last_index()) == []  # nothing applied twice


def test_entries_handed_over_when_written_apply_like_the_log_after_a_truncation(
    tmp_path: Path,
) -> None:
    storage = open_storage(tmp_path)
    storage.set_hard_state(replace(storage.hard_state, term=1))
    applier = QueueApplier(storage)

    def write(entries: list[Entry]) -> None:
        storage.append(entries)
        applier.written(entries)

    records = encode_batch([Record(value=b"m")] * 4, now_ms=0)
    write([Entry(0, 4, 1, records)])
    write([Entry(4, 1, 1, encode_entry(Acquire(G, "a", (0, 1), 60_000, 0)))])
    write([Entry(5, 1, 1, encode_entry(Accept(G, "a", (0,))))])  # never committed
    applier.catch_up(4)
    # a new leader overwrites index 5 on: its entries replace ours
    write(
        [
            Entry(5, 1, 2, encode_entry(Reject(G, "a", (1,), "no"))),
            Entry(6, 4, 2, records),
        ]
    )
    storage.set_hard_state(replace(storage.hard_state, term=2, commit=9))
    applied = applier.catch_up(9)
    assert [type(a.command) for a in applied] == [Reject]
    from_log = QueueApplier(storage)  # reads everything from the log
    assert applier.snapshot_data() == from_log.snapshot_data()
    assert applier.state.describe(G)["dead_letter_pending"] == 1


def test_a_malformed_queue_entry_is_skipped_alike_everywhere() -> None:
    state = QueueState()
    bad = encode_batch([Record(key=QUEUE_KEY, value=b'{"kind": "accept"}')], control=True)
    assert apply_entry(state, 0, 1, bad) is None
    invalid = encode_entry(Accept(G, "no spaces allowed", (1,)))  # well formed, not valid
    assert apply_entry(state, 1, 1, invalid) is None
    assert state.end_index == 2 and not state.groups
