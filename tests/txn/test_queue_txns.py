"""A partition's consumer groups and its transactions, on real files (laminar.queue.entries):
an open transaction's records, and all after them, are not handed out; committed ones are;
aborted and fenced ones never are. The state survives a restart (replayed from the log's
headers) and a snapshot."""

from __future__ import annotations

from pathlib import Path

from laminar.log import Record, encode_batch
from laminar.queue import Accept, Acquire, QueueState, Reject, Release
from laminar.queue.applier import QueueApplier
from laminar.queue.state import Expire
from laminar.txn.markers import encode_marker
from laminar.txn.producer import TxnProducer

from ..queue.test_applier import G, Writer, open_storage

NOW_MS = 1_000


def txn_records(writer: Writer, producer: TxnProducer, count: int) -> list[int]:
    values = [Record(value=f"t{i}".encode()) for i in range(count)]
    data = encode_batch(values, producer_id=producer.producer_id, transactional=True, now_ms=0)
    base = writer.append(data, count)
    return list(range(base, base + count))


def test_groups_get_a_transactions_records_once_it_commits_and_never_if_it_aborts(
    tmp_path: Path,
) -> None:
    storage = open_storage(tmp_path)
    writer = Writer(storage)
    applier = QueueApplier(storage)
    one, two = TxnProducer(1, 0), TxnProducer(2, 0)
    before = writer.records(2)
    committed = txn_records(writer, one, 2)
    aborted = txn_records(writer, two, 2)
    after = writer.records(1)
    writer.commit()
    applier.catch_up(storage.last_index())
    state = applier.state
    assert state.available(G, 100, NOW_MS) == before  # held back from the first open one
    writer.append(encode_marker(TxnProducer(2, 1), commit=False), 1)
    writer.commit()
    applier.catch_up(storage.last_index())
    assert state.available(G, 100, NOW_MS) == before  # producer 1's is still open
    writer.append(encode_marker(TxnProducer(1, 1), commit=True), 1)
    fenced = txn_records(writer, one, 1)  # epoch 0 again, after its transaction ended
    writer.commit()
    applier.catch_up(storage.last_index())
    assert state.available(G, 100, NOW_MS) == before + committed + after
    assert not set(aborted + fenced) & set(state.records_from(0))
    # an acquire of an aborted index is refused, even when a leader proposes one
    writer.command(Acquire(G, "c", (aborted[0], after[0]), 60_000, NOW_MS))
    writer.commit()
    (applied,) = applier.catch_up(storage.last_index())
    assert [g.index for g in applied.result.granted] == [after[0]]
    assert applied.result.refused == [aborted[0]]
    snapshot = applier.snapshot_data()
    storage.close()
    storage.log.close()
    # a restart replays the log from its headers; the state is the same
    again = QueueApplier(open_storage(tmp_path))
    assert again.snapshot_data() == snapshot
    assert again.state.txns.stable_end == again.state.end_index


def test_an_open_transaction_survives_a_snapshot_and_ends_after_it(tmp_path: Path) -> None:
    storage = open_storage(tmp_path)
    writer = Writer(storage)
    applier = QueueApplier(storage)
    producer = TxnProducer(7, 3)
    records = txn_records(writer, producer, 3)
    writer.commit()
    applier.catch_up(storage.last_index())
    restored = type(applier.state).restore(applier.snapshot_data())
    assert restored.txns.open_transactions() == {producer: (records[0], records[-1])}
    assert restored.available(G, 10, NOW_MS) == []
    writer.append(encode_marker(TxnProducer(7, 4), commit=False), 1)
    writer.commit()
    applier.catch_up(storage.last_index())
    assert applier.state.available(G, 10, NOW_MS) == []
    assert applier.state.txns.stable_end == applier.state.end_index


# ---- accepting in a transaction (consume -> produce exactly once) ---------------------------


def held_state(count: int) -> tuple[QueueState, list[int]]:
    """A partition of `count` records, all acquired by consumer c of group G."""
    state = QueueState()
    state.on_records(0, count)
    indexes = state.available(G, count, NOW_MS)
    granted = state.apply(Acquire(G, "c", tuple(indexes), 1_000, NOW_MS)).granted
    assert [g.index for g in granted] == list(range(count))
    return state, indexes


def test_messages_accepted_in_a_transaction_wait_for_its_commit_past_their_leases() -> None:
    state, _ = held_state(4)
    producer = TxnProducer(5, 0)
    result = state.apply(Accept(G, "c", (0, 1), txn_producer_id=producer.producer_id))
    assert result.done == [0, 1]
    # leases run out, other settlements come: the transaction's two stay held
    state.apply(Expire(G, NOW_MS + 10**9))
    assert set(state.groups[G].acquired) == {0, 1}
    for command in (Release(G, "c", (0,)), Accept(G, "c", (1,)), Reject(G, "c", (0,))):
        assert state.apply(command).refused == list(command.indexes)
    again = state.apply(Accept(G, "c", (0, 1), txn_producer_id=producer.producer_id))
    assert again.done == [0, 1]  # the same accept, sent again
    state.on_other(4, 1)
    state.on_txn_marker(5, TxnProducer(5, 1), commit=True)
    assert state.describe(G)["accepted"] == 2 and not state.groups[G].txn_pending
    assert state.available(G, 10, NOW_MS + 10**9) == [2, 3]  # expired back; 0 and 1 done


def test_an_abort_gives_the_messages_back_and_a_fenced_epoch_accepts_nothing() -> None:
    state, _ = held_state(3)
    old, new = TxnProducer(5, 2), TxnProducer(5, 3)
    state.apply(Accept(G, "c", (0, 1), txn_producer_id=old.producer_id))
    state.on_other(3, 1)
    state.on_txn_marker(3, new, commit=False)  # the fence: epoch 3 ends epoch 2's
    group = state.groups[G]
    assert not group.txn_pending and 0 not in group.acquired and group.deliveries[0] == 1
    assert state.describe(G)["accepted"] == 0
    # the zombie's accept, and a commit marker of its epoch, change nothing
    assert state.apply(Accept(G, "c", (2,), txn_producer_id=old.producer_id)).refused == [2]
    state.on_other(4, 1)
    state.on_txn_marker(4, TxnProducer(5, 3), commit=True)  # nothing of epoch 2 is left
    assert state.describe(G)["accepted"] == 0
    # given back: acquired again, a second delivery
    granted = state.apply(Acquire(G, "d", (0, 1), 1_000, NOW_MS)).granted
    assert [(g.index, g.deliveries) for g in granted] == [(0, 2), (1, 2)]


def test_what_a_transaction_accepted_survives_a_snapshot() -> None:
    state, _ = held_state(2)
    producer = TxnProducer(9, 0)
    state.apply(Accept(G, "c", (1,), txn_producer_id=producer.producer_id))
    restored = QueueState.restore(state.snapshot())
    assert restored.snapshot() == state.snapshot()
    assert restored.groups[G].txn_pending == {1: (9, 0)}
    restored.on_other(2, 1)
    restored.on_txn_marker(2, TxnProducer(9, 1), commit=True)
    assert restored.describe(G)["accepted"] == 1
