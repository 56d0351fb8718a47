"""read_committed against a replica on real files (laminar.partition.replica): it stops at an
open transaction's first index, leaves aborted batches out, and a long poll waits for the
transaction to end; read_uncommitted sees every committed batch."""

from __future__ import annotations

import asyncio
from pathlib import Path

from laminar.log.batch import Record, decode_batch, encode_batch, parse_header, split_batches
from laminar.partition.replica import Replica
from laminar.txn.markers import encode_marker
from laminar.txn.producer import TxnProducer
from tests import replicas
from tests.replicas import drive


async def append(replica: Replica, data: bytes) -> int:
    future, _ = replica.propose(data, parse_header(data))
    drive(replica)
    return await asyncio.wait_for(future, 1)


def txn_batch(producer: TxnProducer, value: bytes, sequence: int = 0) -> bytes:
    return encode_batch(
        [Record(value)], producer_id=producer.producer_id, producer_seq=sequence,
        transactional=True,
    )  # fmt: skip


def values(replica: Replica, *, committed: bool) -> list[bytes | None]:
    data = replica.read(0, 1 << 20, committed=committed).data
    return [
        record.value
        for batch in split_batches(data)
        if not parse_header(batch).is_control
        for record in decode_batch(batch)
    ]


async def test_read_committed_stops_at_an_open_transaction_and_skips_aborted_ones(
    tmp_path: Path,
) -> None:
    replica = replicas.open_replica(tmp_path / "p", ("n1",))
    replica.raft.campaign()
    drive(replica)
    one, two = TxnProducer(1, 0), TxnProducer(2, 0)
    await append(replica, encode_batch([Record(b"plain-1")]))
    first = await append(replica, txn_batch(one, b"one"))
    await append(replica, txn_batch(two, b"two"))
    await append(replica, encode_batch([Record(b"plain-2")]))
    assert values(replica, committed=True) == [b"plain-1"]
    assert replica.readable_end(committed=True) == first
    assert values(replica, committed=False) == [b"plain-1", b"one", b"two", b"plain-2"]
    # a long poll at the stable end waits for the transaction to end, not for a commit
    waiting = asyncio.ensure_future(replica.wait_for(first, 5, committed=True))
    await append(replica, encode_marker(TxnProducer(2, 1), commit=False))
    assert replica.readable_end(committed=True) == first  # producer 1's is still open
    assert values(replica, committed=True) == [b"plain-1"]
    await append(replica, encode_marker(TxnProducer(1, 1), commit=True))
    await asyncio.wait_for(waiting, 1)
    assert values(replica, committed=True) == [b"plain-1", b"one", b"plain-2"]
    assert replica.readable_end(committed=True) == replica.commit_index + 1
    replica.close()


async def test_a_marker_sent_again_late_is_written_not_judged_as_a_producers_batch(
    tmp_path: Path,
) -> None:
    """A marker names (number, epoch + 1), which the producer's next transaction writes with,
    sequence 0 onwards. A marker sent again after a failover may come after those batches,
    past the deduplication window: it is a control batch, written, and changes nothing."""
    replica = replicas.open_replica(tmp_path / "p", ("n1",))
    replica.raft.campaign()
    drive(replica)
    first, following = TxnProducer(1, 0), TxnProducer(1, 1)
    await append(replica, txn_batch(first, b"a"))
    await append(replica, encode_marker(following, commit=True))
    for sequence in range(6):  # the next transaction: more batches than the window holds
        data = encode_batch(
            [Record(b"b")], producer_id=following.producer_id, producer_seq=sequence,
            transactional=True,
        )  # fmt: skip
        await append(replica, data)
    await append(replica, encode_marker(following, commit=True))  # the first marker, again
    assert values(replica, committed=True) == [b"a"]  # the next transaction is still open
    await append(replica, encode_marker(TxnProducer(1, 2), commit=True))
    assert values(replica, committed=True) == [b"a"] + [b"b"] * 6
    replica.close()


async def test_a_read_committed_read_moves_past_what_it_leaves_out(tmp_path: Path) -> None:
    """A fenced batch at the log's end (no marker after it): the read serves nothing and says
    to read on past it (the API's next index), so a reader neither stops nor spins there."""
    replica = replicas.open_replica(tmp_path / "p", ("n1",))
    replica.raft.campaign()
    drive(replica)
    await append(replica, txn_batch(TxnProducer(1, 0), b"a"))
    await append(replica, encode_marker(TxnProducer(1, 1), commit=True))
    fenced = await append(replica, txn_batch(TxnProducer(1, 0), b"late", sequence=1))
    result = replica.read(fenced, 1 << 20, committed=True)
    assert (result.data, result.next_index) == (b"", fenced + 1)
    assert replica.readable_end(committed=True) == fenced + 1
    replica.close()
