"""Consumer group admin in the queue state machine: `Reset` (to any index, refused while the
group is busy unless forced, rewinding below the forgotten record ranges with the ranges the
leader reads from its log) and `DeleteGroup`, on real logs where the log matters."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from laminar.log import FileDirectory, LogConfig, Record, SegmentedLog, encode_batch
from laminar.queue import (
    Accept,
    Acquire,
    DeadLettered,
    DeleteGroup,
    QueueCommand,
    QueueError,
    QueueState,
    Reject,
    Reset,
    decode_command,
    encode_command,
    rewind,
)
from laminar.queue.applier import QueueApplier
from laminar.queue.entries import encode_entry
from laminar.queue.rewind import plan_reset
from laminar.raft import ConfState, Entry
from laminar.raft.log_storage import LogStorage
from laminar.txn.markers import encode_marker
from laminar.txn.producer import TxnProducer

G = "workers"
LEASE_MS = 1_000


def state_with(records: int) -> QueueState:
    """Records 1..records, with a control entry at index 0 (a leader's no-op)."""
    state = QueueState()
    state.on_other(0, 1)
    state.on_records(1, records)
    return state


def take(state: QueueState, consumer: str, n: int, now: int, group: str = G) -> list[int]:
    indexes = state.available(group, n, now)
    result = state.apply(Acquire(group, consumer, tuple(indexes), LEASE_MS, now))
    return [g.index for g in result.granted]


def finish(state: QueueState, consumer: str, n: int, now: int, group: str = G) -> list[int]:
    taken = take(state, consumer, n, now, group)
    assert state.apply(Accept(group, consumer, tuple(taken), now)).done == taken
    return taken


def deliveries(state: QueueState, n: int, now: int) -> list[tuple[int, int]]:
    indexes = state.available(G, n, now)
    result = state.apply(Acquire(G, "probe", tuple(indexes), LEASE_MS, now))
    return [(g.index, g.deliveries) for g in result.granted]


# ---- reset ---------------------------------------------------------------------------------


def test_a_reset_back_delivers_again_from_the_cursor_as_new_messages() -> None:
    state = state_with(6)
    finish(state, "a", 6, now=0)
    assert state.groups[G].cursor == 7
    assert state.known_from == 7  # the group finished them all: their ranges are forgotten
    assert state.apply(Reset(G, 3, now_ms=10)).refusal == "moved"  # so a rewind brings them
    result = state.apply(Reset(G, 3, now_ms=10, ranges=((3, 7),), known_from=7))
    assert (result.refusal, result.previous_cursor, result.cursor) == (None, 7, 3)
    assert deliveries(state, 10, now=20) == [(i, 1) for i in range(3, 7)]
    assert state.groups[G].accepted_total == 6  # the totals are the group's history


def test_a_reset_forward_skips_what_lies_below_the_cursor() -> None:
    state = state_with(6)
    take(state, "a", 2, now=0)
    state.apply(Reject(G, "a", (1,), "poison", 0))
    state.apply(DeadLettered(G, (1,)))
    state.apply(Accept(G, "a", (2,), 0))
    assert state.apply(Reset(G, 5, now_ms=10)).cursor == 5
    assert deliveries(state, 10, now=20) == [(5, 1), (6, 1)]
    assert state.apply(Reset(G, 1_000, now_ms=30, force=True)).cursor == state.end_index == 7


def test_a_reset_of_a_group_that_does_not_exist_makes_it_there() -> None:
    state = state_with(6)
    result = state.apply(Reset("late", 4, now_ms=0))
    assert (result.previous_cursor, result.cursor) == (None, 4)
    assert take(state, "a", 10, now=0, group="late") == [4, 5, 6]
    assert take(state, "a", 10, now=0) == [1, 2, 3, 4, 5, 6]  # another group: untouched


def test_a_busy_group_is_reset_only_by_force_and_its_holders_lose_what_they_held() -> None:
    state = state_with(6)
    held = take(state, "a", 2, now=0)
    refused = state.apply(Reset(G, 1, now_ms=LEASE_MS - 1))
    assert refused.refusal == "busy: 2 messages held under leases"
    assert refused.cursor is None and state.groups[G].acquired.keys() == set(held)
    # leases that ended by the command's time hold nothing: not busy
    assert state.apply(Reset(G, 1, now_ms=LEASE_MS)).refusal is None
    held = take(state, "a", 2, now=2_000)
    forced = state.apply(Reset(G, 1, now_ms=2_001, force=True))
    assert forced.refusal is None and not state.groups[G].acquired
    assert state.apply(Accept(G, "a", tuple(held), 2_002)).refused == held
    assert deliveries(state, 10, now=2_003)[:2] == [(1, 1), (2, 1)]


def test_dead_letters_not_yet_moved_make_a_group_busy_and_a_forced_reset_drops_them() -> None:
    state = state_with(4)
    take(state, "a", 2, now=0)
    state.apply(Reject(G, "a", (1, 2), "poison", 0))
    assert state.groups[G].next_dead_sequence == 2
    assert state.apply(Reset(G, 1, now_ms=1)).refusal == "busy: 2 dead letters not yet moved"
    assert state.apply(Reset(G, 1, now_ms=1, force=True)).refusal is None
    assert not state.groups[G].dead_pending
    # a late confirmation of a dropped dead letter changes nothing
    assert state.apply(DeadLettered(G, (1,))).done == []
    take(state, "a", 1, now=2)
    state.apply(Reject(G, "a", (1,), "again", 2))
    # the dead-letter producer's sequences go on (its earlier ones were appended, or may be)
    assert state.groups[G].dead_pending[1].sequence == 2


def test_messages_accepted_in_an_open_transaction_make_a_group_busy() -> None:
    state = state_with(4)
    state.on_other(5, 1)  # (the txn's own marker index comes later)
    taken = take(state, "a", 1, now=0)
    producer = TxnProducer(7, 1)
    state.apply(Accept(G, "a", tuple(taken), 0, producer.producer_id))
    why = state.apply(Reset(G, 1, now_ms=10**12)).refusal
    assert why == "busy: 1 message held under a lease, 1 message accepted in an open transaction"
    assert state.apply(Reset(G, 1, now_ms=10**12, force=True)).refusal is None
    assert not state.groups[G].txn_pending
    state.on_txn_marker(6, TxnProducer(7, 2), commit=True)  # its end finds nothing held
    assert state.groups[G].accepted_total == 0


# ---- delete --------------------------------------------------------------------------------


def test_delete_forgets_the_group_and_a_group_made_again_is_a_new_incarnation() -> None:
    state = state_with(6)
    state.on_other(7, 1)  # the command making the group applies at 7
    finish(state, "a", 3, now=0)
    first = state.groups[G]
    assert first.incarnation == 7
    assert state.apply(DeleteGroup("nobody", now_ms=0)).refusal == "not_found"
    result = state.apply(DeleteGroup(G, now_ms=0))
    assert (result.refusal, result.previous_cursor) == (None, 4)
    assert G not in state.groups
    assert state.describe(G)["accepted"] == 0
    state.on_other(8, 3)
    again = take(state, "b", 10, now=0)
    assert again[0] <= 4 and again[-1] == 6  # nothing unfinished is skipped
    assert state.groups[G].incarnation == 10 != first.incarnation
    assert state.groups[G].accepted_total == 0


def test_a_busy_group_is_deleted_only_by_force() -> None:
    state = state_with(3)
    take(state, "a", 1, now=0)
    assert state.apply(DeleteGroup(G, now_ms=1)).refusal == "busy: 1 message held under a lease"
    assert G in state.groups
    assert state.apply(DeleteGroup(G, now_ms=1, force=True)).refusal is None
    assert G not in state.groups


# ---- commands on the wire, and bad ones ----------------------------------------------------


def test_admin_commands_survive_encoding_and_snapshots() -> None:
    commands: list[QueueCommand] = [
        Reset(G, 3, 10, True, ((3, 5), (7, 9)), 12),
        Reset(G, 0, 10),
        DeleteGroup(G, 5, force=True),
    ]
    for command in commands:
        assert decode_command(encode_command(command)) == command
    state = state_with(6)
    state.on_other(7, 1)
    finish(state, "a", 6, now=0)
    state.apply(Reset(G, 2, now_ms=1, ranges=((2, 7),), known_from=7))
    state.trim(2)
    restored = QueueState.restore(state.snapshot())
    assert restored.snapshot() == state.snapshot()
    assert (restored.log_start, restored.groups[G].incarnation) == (2, 7)


@pytest.mark.parametrize(
    "command",
    [
        Reset(G, -1, 0),
        Reset(G, 0, -5),
        Reset(G, 0, 0, force=1),  # type: ignore[arg-type]
        Reset(G, 3, 0, False, ((1, 2),), 5),  # a range below the cursor
        Reset(G, 0, 0, False, ((3, 2),), 5),  # empty
        Reset(G, 0, 0, False, ((1, 3), (2, 4)), 5),  # overlapping
        Reset(G, 0, 0, False, ((1, 9),), 5),  # past known_from
        Reset("bad name", 0, 0),
        DeleteGroup(G, 0, force="yes"),  # type: ignore[arg-type]
    ],
)
def test_a_malformed_admin_command_is_refused_and_changes_nothing(command: QueueCommand) -> None:
    state = state_with(3)
    finish(state, "a", 1, now=0)
    before = state.snapshot()
    with pytest.raises(QueueError):
        state.apply(command)
    assert state.snapshot() == before


# ---- rewinds below the forgotten ranges, planned from a real log ---------------------------

CONFIG = LogConfig(segment_bytes=4096, max_batch_bytes=2048)


class Partition:
    """One replica's log and consumer groups, as the broker keeps them (`QueueApplier`)."""

    def __init__(self, path: Path, config: LogConfig = CONFIG) -> None:
        directory = FileDirectory(str(path))
        log = SegmentedLog.open(directory, config)
        self.storage = LogStorage(directory, log, conf=ConfState(("a",)))
        self.applier = QueueApplier(self.storage)

    @property
    def state(self) -> QueueState:
        return self.applier.state

    @property
    def log(self) -> SegmentedLog:
        return self.storage.log

    def append(self, data: bytes, count: int) -> int:
        index = self.storage.last_index() + 1
        self.storage.append([Entry(index, count, 1, data)])
        self.storage.sync()
        hard = self.storage.hard_state
        self.storage.set_hard_state(replace(hard, term=1, commit=self.storage.last_index()))
        self.applier.catch_up(self.storage.last_index())
        return index

    def records(self, count: int, *, producer: TxnProducer | None = None) -> list[int]:
        data = encode_batch(
            [Record(value=b"m%d" % i) for i in range(count)],
            now_ms=0,
            producer_id=0 if producer is None else producer.producer_id,
            transactional=producer is not None,
        )
        base = self.append(data, count)
        return list(range(base, base + count))

    def command(self, command: QueueCommand) -> int:
        self.append(encode_entry(command), 1)
        return self.storage.last_index()

    def consume_all(self, group: str = G) -> list[int]:
        """Acquire and accept everything, one command each (a control entry between every
        two record batches, as a busy queue has)."""
        out: list[int] = []
        while indexes := self.state.available(group, 7, 0):
            self.command(Acquire(group, "c", tuple(indexes), LEASE_MS, 0))
            self.command(Accept(group, "c", tuple(indexes), 0))
            out += indexes
        return out


def test_a_rewind_below_the_forgotten_ranges_brings_back_exactly_the_records(
    tmp_path: Path,
) -> None:
    part = Partition(tmp_path)
    records = part.records(3)
    for _ in range(30):
        records += part.records(2)
        part.consume_all()
    aborted = part.records(4, producer=TxnProducer(9, 0))
    part.append(encode_marker(TxnProducer(9, 1), commit=False), 1)
    committed = part.records(2, producer=TxnProducer(9, 1))
    part.append(encode_marker(TxnProducer(9, 2), commit=True), 1)
    records += committed
    part.consume_all()
    assert part.state.known_from > records[-1]  # every range was forgotten

    reset = plan_reset(part.state, part.log, G, 0, now_ms=0)
    assert reset.cursor == part.log.start_index == 0
    assert not set(aborted) & {i for b, e in reset.ranges for i in range(b, e)}
    assert part.state.apply(Reset(G, 0, 0)).refusal == "moved"  # without them: refused
    part.command(reset)
    assert part.state.groups[G].cursor == records[0]
    assert part.consume_all() == records  # again, every record once, no control entry


def test_a_rewind_planned_before_the_groups_moved_on_is_refused_and_planned_again(
    tmp_path: Path,
) -> None:
    part = Partition(tmp_path)
    first = part.records(3)[0]
    part.consume_all()
    for _ in range(10):
        part.records(3)
        part.consume_all()
    plan = plan_reset(part.state, part.log, G, 0, now_ms=0)
    part.records(3)  # meanwhile the group goes on, and the forgotten floor with it
    part.consume_all()
    assert part.state.known_from > plan.known_from
    cursor = part.state.groups[G].cursor
    part.command(plan)
    assert part.state.groups[G].cursor == cursor  # refused ("moved"): left as it was
    part.command(plan_reset(part.state, part.log, G, 0, now_ms=0))
    assert part.state.groups[G].cursor == first


def test_a_rewind_further_than_one_command_reads_goes_in_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rewind, "MAX_RESET_BATCHES", 10)
    part = Partition(tmp_path)
    records: list[int] = []
    for _ in range(20):
        records += part.records(2)
        part.consume_all()
    cursors = []
    for _ in range(20):
        plan = plan_reset(part.state, part.log, G, 0, now_ms=0)
        part.command(plan)
        cursors.append(part.state.groups[G].cursor)
        if plan.cursor == 0:
            break
    assert len(cursors) > 2 and cursors == sorted(cursors, reverse=True)
    assert cursors[-1] == records[0]
    assert part.consume_all() == records


def test_other_groups_are_untouched_by_a_rewind(tmp_path: Path) -> None:
    part = Partition(tmp_path)
    for _ in range(5):
        part.records(2)
        part.consume_all("other")
        part.consume_all()
    part.records(2)
    waiting = part.state.available("other", 10, 0)
    assert len(waiting) == 2
    part.command(plan_reset(part.state, part.log, G, 0, now_ms=0))
    assert part.state.available("other", 10, 0) == waiting


def test_a_rewind_fits_the_topics_batch_limit_in_smaller_steps(tmp_path: Path) -> None:
    """A topic whose max_batch_bytes is small: each Reset is planned within it (fewer
    batches a step), and the steps get there all the same."""
    tight = LogConfig(segment_bytes=4096, max_batch_bytes=400)
    part = Partition(tmp_path, tight)
    records: list[int] = []
    for _ in range(40):
        records += part.records(2)
        part.consume_all()
    steps = 0
    for _ in range(100):
        plan = plan_reset(part.state, part.log, G, 0, now_ms=0)
        assert len(encode_entry(plan)) <= tight.batch_limit_bytes
        part.command(plan)
        steps += 1
        if plan.cursor == 0:
            break
    assert steps > 2
    assert part.consume_all() == records
