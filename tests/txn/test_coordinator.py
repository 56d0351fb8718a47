"""The transaction coordinator's state machine (laminar.txn.coordinator): epochs that fence,
two-phase ends, repeated commands answered as before, and bounds."""

from __future__ import annotations

import pytest

from laminar.metadata import (
    ClusterState,
    CreateTopic,
    MetadataError,
    decode_command,
    encode_command,
)
from laminar.txn.coordinator import (
    MAX_TXN_PARTITIONS,
    AddTxnPartitions,
    CompleteTxn,
    Coordinator,
    EndTxn,
    ForgetIdleTxns,
    InitTxn,
    Phase,
    TxnError,
)
from laminar.txn.producer import MAX_EPOCH, TxnProducer

TOPICS = {"orders": 6, "audit": 1}


class Log:
    """A coordinator fed commands at increasing metadata indexes."""

    def __init__(self) -> None:
        self.coordinator = Coordinator()
        self.index = 0

    def apply(self, command: object) -> None:
        self.index += 1
        self.coordinator.apply(self.index, command, TOPICS)  # type: ignore[arg-type]

    def init(self, txn_id: str = "t") -> TxnProducer:
        self.apply(InitTxn(txn_id, 30_000))
        record = self.coordinator.records[txn_id]
        assert record.init_index == self.index
        return record.producer

    def add(self, producer: TxnProducer, *parts: tuple[str, int], txn_id: str = "t") -> None:
        self.apply(AddTxnPartitions(txn_id, *producer, tuple(parts), now_ms=1_000))

    def end(self, producer: TxnProducer, *, commit: bool, txn_id: str = "t") -> None:
        self.apply(EndTxn(txn_id, *producer, commit))

    def complete(self, producer: TxnProducer, txn_id: str = "t") -> None:
        self.apply(CompleteTxn(txn_id, *producer))

    def error(self, command: object) -> str:
        with pytest.raises(TxnError) as raised:
            self.apply(command)
        return raised.value.code


def test_a_transaction_runs_empty_ongoing_prepare_empty_with_the_epoch_moving_on() -> None:
    log = Log()
    producer = log.init()
    assert producer == TxnProducer(1, 0)
    log.add(producer, ("orders", 0), ("orders", 5))
    log.add(producer, ("audit", 0), ("orders", 0))
    record = log.coordinator.records["t"]
    assert record.phase is Phase.ONGOING and record.started_ms == 1_000
    assert record.partitions == (("audit", 0), ("orders", 0), ("orders", 5))
    assert log.coordinator.may_write(producer, "orders", 5) == record
    assert log.coordinator.may_write(producer, "orders", 4) is None
    log.end(producer, commit=True)
    record = log.coordinator.records["t"]
    assert record.phase is Phase.PREPARE_COMMIT and record.marker_producer == TxnProducer(1, 1)
    assert log.coordinator.ending() == [record]
    assert log.coordinator.may_write(producer, "orders", 5) is None  # no more writes
    assert log.error(AddTxnPartitions("t", *producer, (("audit", 0),), 2_000)) == "busy"
    log.end(producer, commit=True)  # the same end again: answered as applied
    assert log.error(EndTxn("t", *producer, commit=False)) == "busy"
    log.complete(producer)
    record = log.coordinator.records["t"]
    assert (record.phase, record.producer, record.partitions) == (
        Phase.EMPTY, TxnProducer(1, 1), ()
    )  # fmt: skip
    log.end(producer, commit=True)  # and again, once complete
    assert log.error(EndTxn("t", *producer, commit=False)) == "fenced"  # not how it ended
    assert log.error(CompleteTxn("t", *producer)) == "invalid"


def test_init_fences_the_old_instance_and_aborts_its_transaction() -> None:
    log = Log()
    old = log.init()
    log.add(old, ("orders", 1))
    log.apply(InitTxn("t", 30_000))  # a new instance: the old transaction is aborted first
    record = log.coordinator.records["t"]
    assert record.phase is Phase.PREPARE_ABORT and record.init_index != log.index  # "busy"
    assert log.error(InitTxn("t", 30_000)) == "busy"  # until its markers are written
    assert log.error(AddTxnPartitions("t", *old, (("orders", 2),), 2_000)) == "busy"
    log.complete(old)
    new = log.init()
    assert new == TxnProducer(1, 2)  # 1 ended the old transaction; 2 is the new instance's
    for command in (
        AddTxnPartitions("t", *old, (("orders", 2),), 2_000),
        EndTxn("t", *old, commit=True),
    ):
        assert log.error(command) == "fenced"
    assert log.coordinator.may_write(old, "orders", 1) is None


def test_ending_an_empty_transaction_needs_no_markers() -> None:
    log = Log()
    producer = log.init()
    log.end(producer, commit=True)
    record = log.coordinator.records["t"]
    assert record.phase is Phase.EMPTY and record.producer == TxnProducer(1, 1)
    assert log.coordinator.ending() == []


def test_the_last_epoch_is_never_written_with_a_new_number_follows() -> None:
    log = Log()
    producer = log.init()
    log.coordinator._put(log.coordinator.records["t"].__class__("t", 1, MAX_EPOCH - 1))
    producer = TxnProducer(1, MAX_EPOCH - 1)
    log.add(producer, ("orders", 0))
    log.end(producer, commit=False)
    assert log.coordinator.records["t"].marker_producer == TxnProducer(1, MAX_EPOCH)
    log.complete(producer)
    assert log.coordinator.records["t"].producer == TxnProducer(2, 0)
    assert log.coordinator.may_write(TxnProducer(2, 0), "orders", 0) is None


def test_timeouts_are_judged_by_the_commands_clock() -> None:
    log = Log()
    producer = log.init()
    log.add(producer, ("orders", 0))  # at 1,000 ms, timeout 30,000
    assert log.coordinator.expired(31_000) == []
    assert [r.txn_id for r in log.coordinator.expired(31_001)] == ["t"]


def test_bad_commands_change_nothing() -> None:
    log = Log()
    producer = log.init()
    before = log.coordinator.document()
    for command in (
        InitTxn("", 1000),
        InitTxn("bad id", 1000),
        InitTxn("t", 0),
        AddTxnPartitions("t", *producer, (), 1),
        AddTxnPartitions("t", *producer, (("nope", 0),), 1),
        AddTxnPartitions("t", *producer, (("orders", 6),), 1),
        AddTxnPartitions("t", *producer, (("orders", -1),), 1),
        AddTxnPartitions(
            "t", *producer, tuple(("orders", 0) for _ in range(MAX_TXN_PARTITIONS + 1)), 1
        ),
        EndTxn("t", 0, 0, commit=True),
        EndTxn("t", *producer, commit="yes"),  # type: ignore[arg-type]
        EndTxn("other", *producer, commit=True),
        EndTxn("t", *producer, True, tag=""),
        EndTxn("t", *producer, True, tag="x" * 201),
        EndTxn("t", *producer, True, tag="line\nbreak"),
        EndTxn("t", *producer, True, also=(("u", 0, 0),)),
        EndTxn("t", *producer, True, also=(("bad id", 1, 0),)),
        EndTxn("t", *producer, True, also=(("u",),)),  # type: ignore[arg-type]
        EndTxn("t", *producer, True, also=tuple((f"u{i}", 1, 0) for i in range(1_001))),
        InitTxn("t", 1000, expiry_ms=59_999),
        ForgetIdleTxns((), now_ms=1),
        ForgetIdleTxns(("bad id",), now_ms=1),
    ):
        assert log.error(command) in ("invalid", "not_found"), command
    assert log.coordinator.document() == before


def test_the_document_restores_the_same_state() -> None:
    log = Log()
    producer = log.init()
    log.add(producer, ("orders", 3))
    log.init("u")
    restored = Coordinator.from_document(log.coordinator.document())
    assert restored.document() == log.coordinator.document()
    assert restored.may_write(producer, "orders", 3) == log.coordinator.records["t"]


def test_the_cluster_metadata_carries_the_commands_and_the_records() -> None:
    """Encoded as metadata entries, applied by ClusterState (errors as MetadataError, nothing
    changed), and kept in its snapshot."""
    state = ClusterState()
    state.apply(1, CreateTopic("orders", 2, 1, assignment=(("n1",), ("n1",))))
    commands = [
        InitTxn("t", 5_000),
        AddTxnPartitions("t", 1, 0, (("orders", 1),), now_ms=7),
        InitTxn("u", 5_000, now_ms=9, expiry_ms=60_000),
        AddTxnPartitions("u", 2, 0, (("orders", 0),), now_ms=9),
        EndTxn("t", 1, 0, commit=True, also=(("u", 2, 0),), tag="batch 3", now_ms=10),
        ForgetIdleTxns(("t", "u"), now_ms=11),
    ]
    for index, command in enumerate(commands, start=2):
        decoded = decode_command(encode_command(command))
        assert decoded == command
        assert state.apply(index, decoded) is None
    error = state.apply(8, AddTxnPartitions("t", 1, 0, (("orders", 0),), now_ms=8))
    assert error is not None and error.code == "busy"
    restored = ClusterState.restore(state.snapshot())
    assert restored.snapshot() == state.snapshot()
    assert [r.txn_id for r in restored.txns.ending()] == ["t", "u"]
    with pytest.raises(MetadataError, match="transactional id"):
        decode_command(encode_command(InitTxn("no spaces", 5_000)))


def test_one_end_ends_several_ids_transactions_all_or_none() -> None:
    """The Spark sink's commit: each task's id, ended by one entry. A member that cannot end
    (fenced, busy, unknown) leaves every one as it was."""
    log = Log()
    producers = {txn_id: log.init(txn_id) for txn_id in ("a", "b", "c")}
    for txn_id, producer in producers.items():
        log.add(producer, ("orders", ord(txn_id) % 6), txn_id=txn_id)
    stale = TxnProducer(producers["c"].number, producers["c"].epoch + 1)
    before = log.coordinator.document()
    for also in (
        (("b", *producers["b"]), ("c", *stale)),  # fenced
        (("b", *producers["b"]), ("nope", 9, 0)),  # unknown
    ):
        assert log.error(EndTxn("a", *producers["a"], True, also)) in ("fenced", "not_found")
        assert log.coordinator.document() == before
    with pytest.raises(TxnError, match="named twice"):
        log.apply(EndTxn("a", *producers["a"], True, (("a", *producers["a"]),)))
    together = EndTxn(
        "a", *producers["a"], True, (("b", *producers["b"]), ("c", *producers["c"])), "17"
    )
    log.apply(together)
    records = log.coordinator.records
    assert [records[t].phase for t in "abc"] == [Phase.PREPARE_COMMIT] * 3
    assert {(records[t].last_commit, records[t].last_tag) for t in "abc"} == {(True, "17")}
    log.apply(together)  # sent again while completing: the same answer, nothing changes
    for txn_id, producer in producers.items():
        log.complete(producer, txn_id=txn_id)
    log.apply(together)  # and after
    assert {(records[t].phase, records[t].last_tag) for t in "abc"} == {(Phase.EMPTY, "17")}
    assert log.error(EndTxn(*together.ends()[0], False, together.also)) == "fenced"


def test_an_init_that_aborts_forgets_the_last_tag() -> None:
    """A tag says the id's LAST transaction ended so; a later abort (here: a restart's
    init) replaces it, so work run again is not taken for committed."""
    log = Log()
    producer = log.init()
    log.add(producer, ("orders", 1))
    log.apply(EndTxn("t", *producer, True, tag="5"))
    log.complete(producer)
    producer = log.init()
    log.add(producer, ("orders", 1))
    log.apply(InitTxn("t", 30_000))
    record = log.coordinator.records["t"]
    assert (record.phase, record.last_commit, record.last_tag) == (
        Phase.PREPARE_ABORT,
        False,
        None,
    )


def test_ids_unused_past_their_expiry_are_forgotten_and_their_numbers_never_reused() -> None:
    log = Log()
    log.apply(InitTxn("old", 30_000, now_ms=1_000, expiry_ms=60_000))
    old = log.coordinator.records["old"].producer
    log.apply(InitTxn("busy", 30_000, now_ms=1_000, expiry_ms=60_000))
    busy = log.coordinator.records["busy"].producer
    log.apply(AddTxnPartitions("busy", *busy, (("orders", 0),), now_ms=2_000))
    assert log.coordinator.idle(61_000) == ()
    assert log.coordinator.idle(61_001) == ("old",)  # "busy" is ONGOING: never idle
    log.apply(ForgetIdleTxns(("old", "busy", "never"), now_ms=70_000))
    assert set(log.coordinator.records) == {"busy"}
    assert log.coordinator.may_write(old, "orders", 0) is None
    assert log.init("old").number > busy.number  # a new number: the old one's writes stay out
    # the clock a ForgetIdleTxns carries decides, not the one its proposer looked at
    log.apply(ForgetIdleTxns(("old",), now_ms=1_000))
    assert "old" in log.coordinator.records


def test_a_document_of_the_records_before_tags_and_expiry_still_restores() -> None:
    document = {
        "next_number": 3,
        "records": [["t", 2, 5, "ongoing", [["orders", 1]], 7, 30_000, 4, True]],
    }
    record = Coordinator.from_document(document).records["t"]
    assert (record.producer, record.phase, record.last_tag) == (
        TxnProducer(2, 5),
        Phase.ONGOING,
        None,
    )
