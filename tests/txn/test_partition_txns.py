"""The partition's transaction state machine (laminar.txn.partition): what a read_committed
reader may see, under random interleavings of producers, epochs, fences and markers."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laminar.txn.partition import AbortedRange, Outcome, PartitionTxns, Verdict
from laminar.txn.producer import MAX_EPOCH, MAX_PRODUCER_NUMBER, TxnProducer

P1 = TxnProducer(1, 0)
END1 = TxnProducer(1, 1)  # the markers that end P1's transaction carry the next epoch


def visible(state: PartitionTxns, index: int, number: int | None) -> bool:
    """What a read_committed reader decides for a batch at `index` (number None: plain)."""
    if index >= state.stable_end:
        return False
    return number is None or not state.aborted(number, index)


def test_a_transaction_is_invisible_until_committed_and_holds_back_what_follows() -> None:
    state = PartitionTxns()
    state.on_other(0, 1)  # a leader's no-op
    assert state.on_batch(1, 3, P1) is Verdict.OPEN
    state.on_other(4, 2)  # a plain batch after it
    assert state.stable_end == 1
    assert not visible(state, 4, None)  # held back behind the open transaction
    assert state.on_batch(6, 1, P1) is Verdict.OPEN
    assert state.open_transactions() == {P1: (1, 6)}
    assert state.on_marker(7, END1, commit=True) is Outcome.COMMITTED
    assert state.stable_end == 8
    assert all(visible(state, i, n) for i, n in ((1, 1), (4, None), (6, 1)))


def test_an_aborted_transaction_hides_only_its_own_batches() -> None:
    state = PartitionTxns()
    two = TxnProducer(2, 0)
    state.on_batch(0, 2, P1)
    state.on_batch(2, 2, two)
    state.on_batch(4, 1, P1)
    assert state.on_marker(5, END1, commit=False) is Outcome.ABORTED
    assert state.stable_end == 2  # producer 2's transaction is still open
    assert state.on_marker(6, TxnProducer(2, 1), commit=True) is Outcome.COMMITTED
    assert state.aborted_between(0, 7) == [AbortedRange(1, 0, 4)]
    assert [visible(state, i, n) for i, n in ((0, 1), (2, 2), (4, 1))] == [False, True, False]


def test_a_fenced_epoch_never_becomes_visible_and_its_markers_are_stale() -> None:
    state = PartitionTxns()
    zombie, successor = TxnProducer(1, 3), TxnProducer(1, 4)
    state.on_batch(0, 1, zombie)
    assert state.on_marker(1, successor, commit=False) is Outcome.ABORTED  # the fence
    assert state.on_batch(2, 1, zombie) is Verdict.FENCED
    assert state.on_marker(3, zombie, commit=True) is Outcome.STALE
    assert state.stable_end == 4
    assert not visible(state, 0, 1) and not visible(state, 2, 1)
    # the successor's own transaction commits
    state.on_batch(4, 1, successor)
    assert state.on_marker(5, successor, commit=True) is Outcome.STALE  # not above it
    assert state.on_marker(6, TxnProducer(1, 5), commit=True) is Outcome.COMMITTED
    assert visible(state, 4, 1)


def test_a_write_that_comes_after_its_transaction_ended_is_fenced() -> None:
    """A retried append of epoch 0 reaches the partition after the commit's markers."""
    state = PartitionTxns()
    state.on_batch(0, 1, P1)
    assert state.on_marker(1, END1, commit=True) is Outcome.COMMITTED
    assert state.on_batch(2, 1, P1) is Verdict.FENCED
    assert state.stable_end == 3 and visible(state, 0, 1) and not visible(state, 2, 1)
    # and an old marker, sent again, does not end the next transaction
    state.on_batch(3, 1, END1)
    assert state.on_marker(4, END1, commit=False) is Outcome.STALE
    assert state.open_transactions() == {END1: (3, 3)}


def test_a_newer_epoch_aborts_an_open_older_one_and_markers_repeat_harmlessly() -> None:
    state = PartitionTxns()
    state.on_batch(0, 1, TxnProducer(1, 0))
    state.on_batch(1, 1, TxnProducer(1, 1))
    assert state.on_marker(2, TxnProducer(1, 2), commit=True) is Outcome.COMMITTED
    assert state.on_marker(3, TxnProducer(1, 2), commit=True) is Outcome.NOTHING
    assert not visible(state, 0, 1) and visible(state, 1, 1)


def test_applying_is_idempotent_by_index() -> None:
    state = PartitionTxns()
    state.on_batch(0, 2, P1)
    assert state.on_batch(0, 2, P1) is None
    assert state.on_marker(1, END1, commit=True) is None
    assert state.open_transactions() == {P1: (0, 1)}


def test_trim_forgets_what_retention_removed_but_not_what_is_open() -> None:
    state = PartitionTxns()
    state.on_batch(0, 1, TxnProducer(1, 0))
    state.on_marker(1, TxnProducer(1, 1), commit=False)
    state.on_batch(2, 1, TxnProducer(2, 0))  # open across the trim
    state.on_batch(3, 1, TxnProducer(3, 0))
    state.on_marker(4, TxnProducer(3, 1), commit=False)
    state.trim(3)
    assert state.aborted_between(0, 10) == [AbortedRange(3, 3, 3)]
    assert state.open_transactions() == {TxnProducer(2, 0): (2, 2)}
    # producer 1 is forgotten: its epoch no longer fences (the coordinator does, upstream)
    assert state.on_batch(5, 1, TxnProducer(1, 0)) is Verdict.OPEN
    assert "[2,0,2]" in state.snapshot().decode()  # producer 2 kept


def test_producer_ids_carry_number_and_epoch() -> None:
    producer = TxnProducer(MAX_PRODUCER_NUMBER, MAX_EPOCH).check()
    assert producer.producer_id == 2**64 - 1
    assert TxnProducer.of(producer.producer_id) == producer
    assert TxnProducer.of(TxnProducer(5, 7).producer_id) == (5, 7)
    for bad in (TxnProducer(0, 0), TxnProducer(1, MAX_EPOCH + 1), TxnProducer(2**48, 0)):
        with pytest.raises(ValueError):
            bad.check()


def test_a_snapshot_of_another_version_is_refused() -> None:
    with pytest.raises(ValueError, match="version"):
        PartitionTxns.restore(b'{"version": 99}')


# ---- random interleavings -------------------------------------------------------------------


@dataclass
class Txn:
    """A transaction as the test meant it: its batches, how it was ended."""

    producer: TxnProducer
    batches: list[int] = field(default_factory=list)  # their base indexes
    ended: str = "open"  # open, committed, aborted (by its own marker or a fence)


@dataclass
class World:
    state: PartitionTxns = field(default_factory=PartitionTxns)
    index: int = 0
    epochs: dict[int, int] = field(default_factory=dict)  # the coordinator's, per number
    current: dict[int, Txn] = field(default_factory=dict)
    txns: list[Txn] = field(default_factory=list)
    zombies: list[tuple[int, int]] = field(default_factory=list)  # fenced epochs' batches
    plain: list[int] = field(default_factory=list)
    dropped: list[tuple[int, int]] = field(default_factory=list)  # take_aborted's batches
    sizes: dict[int, int] = field(default_factory=dict)  # base index -> record count

    def take(self, count: int) -> int:
        at, self.index = self.index, self.index + count
        self.sizes[at] = count
        return at


OPS = st.lists(
    st.tuples(
        st.sampled_from(["write", "plain", "commit", "abort", "fence", "zombie", "restore"]),
        st.integers(1, 3),  # producer number
        st.integers(1, 4),  # records in a batch
    ),
    max_size=80,
)


def run(ops: list[tuple[str, int, int]]) -> World:
    world = World()
    for op, number, count in ops:
        epoch = world.epochs.setdefault(number, 0)
        producer = TxnProducer(number, epoch)
        txn = world.current.get(number)
        if op == "write":
            if txn is None:
                txn = world.current[number] = Txn(producer)
                world.txns.append(txn)
            at = world.take(count)
            assert world.state.on_batch(at, count, producer) is Verdict.OPEN
            txn.batches.append(at)
        elif op == "plain":
            world.state.on_other(world.take(count), count)
            world.plain.append(world.index - count)
        elif op in ("commit", "abort"):  # the producer ends its transaction (or has none)
            world.epochs[number] = epoch + 1
            end = TxnProducer(number, epoch + 1)
            outcome = world.state.on_marker(world.take(1), end, commit=op == "commit")
            if txn is not None:
                txn.ended = "committed" if op == "commit" else "aborted"
                del world.current[number]
                assert outcome is (Outcome.COMMITTED if op == "commit" else Outcome.ABORTED)
            else:
                assert outcome is Outcome.NOTHING
        elif op == "fence":  # a restart of the transactional id: the coordinator aborts
            world.epochs[number] = epoch + 1
            world.state.on_marker(world.take(1), TxnProducer(number, epoch + 1), commit=False)
            if txn is not None:
                txn.ended = "aborted"
                del world.current[number]
        elif op == "zombie" and epoch > 0:  # an ended epoch writes (late), and tries to commit
            old = TxnProducer(number, epoch - 1)
            at = world.take(count)
            assert world.state.on_batch(at, count, old) is Verdict.FENCED
            world.zombies.append((at, number))
            assert world.state.on_marker(world.take(1), old, commit=True) is Outcome.STALE
        elif op == "restore":
            world.state = PartitionTxns.restore(world.state.snapshot())
        world.dropped += world.state.take_aborted()
    return world


def check(world: World) -> None:
    """What a read_committed reader sees: a batch of a committed transaction once below the
    stable end (the first open transaction's first index), nothing aborted, nothing fenced,
    and plain batches below the stable end."""
    state = world.state
    opens = [min(t.batches) for t in world.txns if t.ended == "open" and t.batches]
    assert state.stable_end == min([world.index, *opens])
    for txn in world.txns:
        for at in txn.batches:
            expected = txn.ended == "committed" and at < state.stable_end
            assert visible(state, at, txn.producer.number) == expected, (at, txn)
    for at, number in world.zombies:
        assert not visible(state, at, number)
    for at in world.plain:
        assert visible(state, at, None) == (at < state.stable_end)
    # the batches a consumer group drops: those of aborted transactions, and fenced ones
    aborted = [at for t in world.txns if t.ended == "aborted" for at in t.batches]
    expected = sorted((at, at + world.sizes[at]) for at in aborted + [a for a, _ in world.zombies])
    assert sorted(world.dropped) == expected
    assert PartitionTxns.restore(state.snapshot()).snapshot() == state.snapshot()


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_read_committed_sees_whole_committed_transactions_and_nothing_else(
    ops: list[tuple[str, int, int]],
) -> None:
    world = run(ops)
    check(world)
    # once every transaction has ended, each is all there or not at all (atomicity)
    world = run(ops + [("abort", number, 1) for number in sorted(world.current)])
    check(world)
    assert world.state.stable_end == world.index
    for txn in world.txns:
        seen = {visible(world.state, at, txn.producer.number) for at in txn.batches}
        assert seen <= {txn.ended == "committed"}, txn
