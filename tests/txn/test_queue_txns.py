"""A partition's consumer groups and its transactions, on real files (laminar.queue.entries):
an open transaction's records, and all after them, are not handed out; committed ones are;
aborted and fenced ones never are. The state survives a restart (replayed from the log's
headers) and a snapshot."""

from __future__ import annotations

from pathlib import Path

from laminar.log import Record, encode_batch
from laminar.queue import Acquire
from laminar.queue.applier import QueueApplier
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
