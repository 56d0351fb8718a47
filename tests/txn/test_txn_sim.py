"""Transactions under the node simulator's faults (laminar.sim.txn_workload), and the driver's
decisions (laminar.txn.driver) that the broker's server and the simulator both carry out."""

from __future__ import annotations

import logging

import pytest

from laminar.metadata import ClusterState, CreateTopic
from laminar.queue.state import QueueState
from laminar.sim import InvariantViolation
from laminar.sim.node_cluster import NodeSimulation
from laminar.txn.coordinator import AddTxnPartitions, EndTxn, InitTxn
from laminar.txn.driver import Abort, Forget, WriteMarkers, decide
from laminar.txn.markers import decode_marker
from laminar.txn.partition import PartitionTxns
from laminar.txn.producer import TxnProducer


@pytest.fixture(autouse=True)
def _quiet_repair_reports(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="laminar")


@pytest.mark.parametrize("seed", [1, 3, 4])
def test_the_node_simulation_runs_transactions_and_their_invariants_hold(seed: int) -> None:
    """The default scenario (the one `python -m laminar.sim --node --seeds` runs in CI)
    commits and aborts transactions, fences a zombie, and consumes → produces (seeds where
    all of it happens: in seed 2 no transaction aborts)."""
    stats = NodeSimulation(seed).run()
    assert stats["txn_committed"] > 0
    assert stats["txn_aborted"] + stats["txn_refused"] > 0
    assert stats["zombies_fenced"] >= 1
    assert stats["txn_markers"] > 0
    assert stats["cp_finished"] > 0 and stats["cp_inputs_accepted"] > 0
    assert stats["txn_checked"] > stats["txn_committed"]  # every one in the logs checked


def test_the_checks_catch_aborted_batches_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read path that forgets the aborted ranges returns aborted (and fenced) batches."""
    monkeypatch.setattr(PartitionTxns, "aborted_between", lambda self, low, high: [])
    with pytest.raises(InvariantViolation, match=r"not committed|read_committed returns"):
        NodeSimulation(2).run()


def test_the_checks_catch_a_partition_that_takes_every_marker_as_a_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Aborted transactions (the zombie's too) become visible, and the consumed messages of
    an aborted consume → produce are finished: the checks see it."""
    on_txn_marker = QueueState.on_txn_marker

    def commit_all(self: QueueState, index: int, producer: TxnProducer, *, commit: bool) -> None:
        on_txn_marker(self, index, producer, commit=True)

    monkeypatch.setattr(QueueState, "on_txn_marker", commit_all)
    with pytest.raises(InvariantViolation, match=r"read_committed returns|consume → produce"):
        NodeSimulation(3).run()


def test_the_exactly_once_check_catches_an_abort_that_finishes_what_it_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The partition's transactions right, but its consumer groups finish what an aborted
    transaction accepted: those messages have no output."""
    on_txn_marker = QueueState.on_txn_marker

    def finish_all(self: QueueState, index: int, producer: TxnProducer, *, commit: bool) -> None:
        outcome = self.txns.on_marker(index, producer, commit=commit)
        self.txns.on_marker = lambda *_, **__: outcome  # type: ignore[method-assign]
        try:
            on_txn_marker(self, index, producer, commit=True)
        finally:
            del self.txns.on_marker

    monkeypatch.setattr(QueueState, "on_txn_marker", finish_all)
    with pytest.raises(InvariantViolation, match=r"consume → produce"):
        NodeSimulation(3).run()  # (a seed that aborts a transaction that accepted some)


def test_the_driver_aborts_timed_out_transactions_and_marks_ending_ones() -> None:
    state = ClusterState()
    state.apply(1, CreateTopic("orders", 2, 1, assignment=(("n0",), ("n0",))))
    for index, txn_id in enumerate(("late", "ending"), start=2):
        state.apply(index, InitTxn(txn_id, timeout_ms=1_000))
    late = state.txns.records["late"].producer
    ending = state.txns.records["ending"].producer
    state.apply(4, AddTxnPartitions("late", *late, (("orders", 0),), now_ms=0))
    state.apply(5, AddTxnPartitions("ending", *ending, (("orders", 0), ("orders", 1)), now_ms=0))
    state.apply(6, EndTxn("ending", *ending, commit=True))
    assert decide(state.txns, now_ms=1_000) == [WriteMarkers(state.txns.records["ending"])]
    actions = decide(state.txns, now_ms=1_001)
    assert [type(a) for a in actions] == [Abort, WriteMarkers]
    abort, markers = actions
    assert isinstance(abort, Abort) and isinstance(markers, WriteMarkers)
    assert abort.command() == EndTxn("late", *late, commit=False, now_ms=1_001)
    assert markers.commit and markers.partitions == (("orders", 0), ("orders", 1))
    assert markers.producer == TxnProducer(ending.number, ending.epoch + 1)
    assert decode_marker(markers.marker(), markers.producer.producer_id) is True
    assert markers.complete().epoch == ending.epoch
    # under way already: not started again
    assert decide(state.txns, now_ms=1_001, running={abort.key, markers.key}) == []


def test_the_driver_forgets_idle_ids_when_asked_to_look() -> None:
    state = ClusterState()
    state.apply(1, InitTxn("idle", timeout_ms=1_000, now_ms=0, expiry_ms=60_000))
    state.apply(2, InitTxn("fresh", timeout_ms=1_000, now_ms=30_000, expiry_ms=60_000))
    assert decide(state.txns, now_ms=60_001) == []  # (not looking: the scan is costly)
    [forget] = decide(state.txns, now_ms=60_001, idle=True)
    assert forget == Forget(("idle",), 60_001)
    assert decide(state.txns, now_ms=60_001, running={forget.key}, idle=True) == []
    assert state.apply(3, forget.command()) is None
    assert set(state.txns.records) == {"fresh"}
