"""The consumer-group state machine: each Qpid guarantee on its own, snapshots, bad commands,
and a Hypothesis stateful test that checks the invariants after every step of random
acquire / accept / release / reject / expire / dead-letter sequences (with snapshot-restore
standing in for a replica that catches up), then drains everything to completion."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from laminar.queue import (
    Accept,
    Acquire,
    Configure,
    DeadLettered,
    Expire,
    QueueConfig,
    QueueError,
    QueueState,
    Reject,
    Release,
    Renew,
    Result,
    decode_command,
    encode_command,
)
from laminar.queue import state as state_module

G = "workers"


def state_with(records: int, config: QueueConfig | None = None) -> QueueState:
    """Records 1..records, with a control entry at index 0 (a leader's no-op)."""
    state = QueueState(config)
    state.on_other(0, 1)
    state.on_records(1, records)
    return state


def acquire(state: QueueState, consumer: str, n: int, now: int, lease: int = 1000) -> list[int]:
    indexes = state.available(G, n, now)
    if not indexes:
        return []
    result = state.apply(Acquire(G, consumer, tuple(indexes), lease, now))
    return [g.index for g in result.granted]


def test_acquire_hands_out_oldest_first_and_not_twice_while_the_lease_holds() -> None:
    state = state_with(5)
    assert acquire(state, "a", 2, now=0) == [1, 2]
    assert acquire(state, "b", 10, now=500) == [3, 4, 5]
    assert acquire(state, "c", 10, now=999) == []
    # a stale choice (made before b's acquire applied) is refused, not double-granted
    result = state.apply(Acquire(G, "c", (1, 3), 1000, 999))
    assert result.granted == [] and result.refused == [1, 3]


def test_expiry_redelivers_with_a_higher_delivery_count() -> None:
    state = state_with(2)
    assert acquire(state, "a", 2, now=0) == [1, 2]
    result = state.apply(Acquire(G, "b", (1,), 1000, 1000))  # a's lease ends at 1000
    assert [(g.index, g.deliveries) for g in result.granted] == [(1, 2)]
    assert state.describe(G)["acquired"] == 1  # 2 expired and is free again


def test_accept_is_final_and_idempotent() -> None:
    state = state_with(3)
    acquire(state, "a", 3, now=0)
    assert state.apply(Accept(G, "a", (1, 2))).done == [1, 2]
    assert state.apply(Accept(G, "a", (1,))).done == [1]  # again: harmless
    assert state.groups[G].cursor == 3
    state.apply(Expire(G, 10_000))
    assert state.available(G, 10, 10_000) == [3]


def test_only_the_holder_may_accept_release_or_reject() -> None:
    state = state_with(1)
    acquire(state, "a", 1, now=0)
    for command in (Accept(G, "b", (1,)), Release(G, "b", (1,)), Reject(G, "b", (1,))):
        assert state.apply(command).refused == [1]
    assert state.groups[G].acquired[1].consumer == "a"


def test_release_redelivers_and_repeating_it_is_harmless() -> None:
    state = state_with(1)
    acquire(state, "a", 1, now=0)
    assert state.apply(Release(G, "a", (1,))).done == [1]
    assert state.apply(Release(G, "a", (1,))).done == [1]
    result = state.apply(Acquire(G, "b", (1,), 1000, 1))
    assert [(g.index, g.deliveries) for g in result.granted] == [(1, 2)]


def test_reject_dead_letters_exactly_once_then_the_group_forgets() -> None:
    state = state_with(2)
    acquire(state, "a", 2, now=0)
    result = state.apply(Reject(G, "a", (2,), "bad payload"))
    assert result.dead_lettered == [2]
    assert state.apply(Reject(G, "a", (2,))).dead_lettered == []  # repeated: nothing new
    pending = state.groups[G].dead_pending
    assert list(pending) == [2] and pending[2].sequence == 0 and pending[2].reason == "bad payload"
    assert state.available(G, 10, 5_000) == [1]  # 1 expired; 2 is never offered again
    assert state.apply(DeadLettered(G, (2,))).done == [2]
    assert state.apply(DeadLettered(G, (2,))).done == []
    assert state.describe(G)["dead_lettered"] == 1


def test_past_max_deliveries_a_message_is_dead_lettered() -> None:
    state = state_with(1, QueueConfig(max_deliveries=2))
    now = 0
    for expected in (1, 2):
        result = state.apply(Acquire(G, "a", (1,), 10, now))
        assert [g.deliveries for g in result.granted] == [expected]
        now += 10
    result = state.apply(Expire(G, now))
    assert result.dead_lettered == [1]
    assert state.groups[G].dead_pending[1].reason == "max_deliveries"
    assert state.available(G, 5, now) == []


def test_flow_control_per_consumer_and_per_group() -> None:
    state = state_with(10, QueueConfig(max_acquired_per_consumer=3, max_acquired_per_group=5))
    assert acquire(state, "a", 10, now=0) == [1, 2, 3]
    assert state.room(G, "a") == 0
    assert acquire(state, "b", 10, now=0) == [4, 5]
    assert state.room(G, "c") == 0
    state.apply(Accept(G, "a", (1,)))
    assert state.room(G, "c") == 1


def test_cursor_skips_control_entries_and_compacts_done_indexes() -> None:
    state = QueueState()
    state.on_records(0, 2)
    state.on_other(2, 1)  # a control entry between two record batches
    state.on_records(3, 2)
    indexes = acquire(state, "a", 10, now=0)
    assert indexes == [0, 1, 3, 4]
    state.apply(Accept(G, "a", (4, 3, 1, 0)))
    group = state.groups[G]
    assert group.cursor == 5 and not group.done and not group.acquired


def test_groups_are_independent_and_start_at_the_log_start() -> None:
    state = state_with(2)
    # a consumer's command creates its group (even one that changes nothing else) ...
    assert state.apply(Release("other", "a", (1,), 0)).refused == [1]
    # ... but the leader's own Expire or DeadLettered does not: a late one (after a delete)
    # must not bring a deleted group back
    state.apply(Expire("gone", 0))
    state.apply(DeadLettered("gone", (1,)))
    assert "gone" not in state.groups
    acquire(state, "a", 2, now=0)
    state.apply(Accept(G, "a", (1, 2)))
    assert state.available("other", 10, 0) == [1, 2]


def test_ranges_below_every_cursor_are_forgotten_and_new_groups_start_there() -> None:
    state = QueueState()
    for base in range(0, 40, 2):  # record batches interleaved with queue commands
        state.on_records(base, 1)
        state.on_other(base + 1, 1)
    for index in range(0, 30, 2):
        state.apply(Acquire(G, "a", (index,), 1000, 0))
        state.apply(Accept(G, "a", (index,)))
    assert state.groups[G].cursor == 30
    assert state.start_index == 30 and list(state.records_from(0)) == [30, 32, 34, 36, 38]
    assert state.available("late", 10, 0) == [30, 32, 34, 36, 38]


def test_renew_extends_only_the_holders_live_leases() -> None:
    state = state_with(3)
    acquire(state, "a", 2, now=0, lease=100)
    result = state.apply(Renew(G, "a", (1, 2, 3), 500, 50))
    assert result.done == [1, 2] and result.refused == [3]
    assert state.available(G, 10, 200) == [3]  # 1 and 2 now held until 550
    assert state.apply(Renew(G, "b", (1,), 500, 60)).refused == [1]
    assert state.apply(Renew(G, "a", (1,), 500, 600)).refused == [1]  # ran out at 550


def test_configure_changes_max_deliveries_and_survives_a_snapshot() -> None:
    state = state_with(1)
    state.apply(Configure(2))
    for now in (0, 100):
        acquire(state, "a", 1, now=now, lease=50)
        state.apply(Release(G, "a", (1,)))
    assert state.groups[G].dead_pending[1].reason == "max_deliveries"
    assert QueueState.restore(state.snapshot()).config.max_deliveries == 2


def test_retention_trims_the_messages_of_every_group() -> None:
    state = state_with(6)
    acquire(state, "a", 2, now=0)
    state.trim(4)
    assert state.groups[G].cursor == 4 and not state.groups[G].acquired
    assert state.available(G, 10, 0) == [4, 5, 6]


def test_snapshot_round_trip_is_canonical() -> None:
    state = state_with(5)
    acquire(state, "a", 3, now=0)
    state.apply(Accept(G, "a", (2,)))
    state.apply(Reject(G, "a", (3,), "why"))
    data = state.snapshot()
    assert QueueState.restore(data).snapshot() == data


def test_commands_round_trip_and_bad_ones_are_refused() -> None:
    for command in (
        Acquire(G, "c-1", (1, 2), 500, 7),
        Accept(G, "c-1", (1,), now_ms=8),
        Release(G, "c-1", (2,), now_ms=8),
        Reject(G, "c-1", (2,), "no", now_ms=8),
        Expire(G, 9),
        DeadLettered(G, (2,)),
    ):
        assert decode_command(encode_command(command)) == command
    # settles logged before they carried the leader's clock still decode (time unknown)
    old = b'{"consumer":"c-1","group":"workers","indexes":[2],"kind":"reject","reason":"no"}'
    assert decode_command(old) == Reject(G, "c-1", (2,), "no", now_ms=None)
    state = state_with(1)
    before = state.snapshot()
    for bad in (
        Accept("..", "c", (1,)),
        Accept(G, "", (1,)),
        Accept(G, "c", ()),
        Accept(G, "c", (-1,)),
        Acquire(G, "c", (1,), 0, 0),
        Reject(G, "c", (1,), ""),
        Accept(G, "c", (1,), now_ms=-1),
    ):
        with pytest.raises(QueueError):
            state.apply(bad)
    assert state.snapshot() == before
    with pytest.raises(QueueError):
        decode_command(b'{"kind": "explode"}')


# ---- who may settle: the holder while its lease holds, or a repeat of its own settlement ---


@pytest.mark.parametrize("expired_first", [True, False], ids=["expired", "not-yet-expired"])
def test_a_reject_after_the_lease_ended_is_refused_and_the_message_comes_again(
    expired_first: bool,
) -> None:
    state = state_with(1)
    assert acquire(state, "a", 1, now=0, lease=500) == [1]
    if expired_first:  # the leader's Expire applied before the reject (or not yet)
        state.apply(Expire(G, 2_000))
    result = state.apply(Reject(G, "a", (1,), now_ms=2_000))
    assert (result.done, result.refused, result.dead_lettered) == ([], [1], [])
    group = state.groups[G]
    assert not group.dead_pending and not group.acquired and group.deliveries == {1: 1}
    # not lost: free again, delivered again, and its new holder's reject dead-letters it once
    granted = state.apply(Acquire(G, "b", (1,), 500, 2_000)).granted
    assert [(g.index, g.deliveries) for g in granted] == [(1, 2)]
    assert state.apply(Reject(G, "b", (1,), "poison", now_ms=2_100)).dead_lettered == [1]
    assert state.apply(Reject(G, "a", (1,), now_ms=2_200)).refused == [1]
    assert state.apply(DeadLettered(G, (1,))).done == [1]
    again = state.apply(Reject(G, "b", (1,), "poison", now_ms=2_300))  # b's, repeated
    assert (again.done, again.dead_lettered) == ([1], [])
    assert state.describe(G)["dead_lettered"] == 1 and group.dead_pending == {}
    assert group.cursor == 2 and state.available(G, 10, 10_000) == []


@pytest.mark.parametrize("expired_first", [True, False], ids=["expired", "not-yet-expired"])
@pytest.mark.parametrize("action", ["accept", "release"])
def test_an_accept_or_release_after_the_lease_ended_is_refused(
    action: str, expired_first: bool
) -> None:
    state = state_with(2)
    assert acquire(state, "a", 2, now=0, lease=500) == [1, 2]
    if expired_first:
        state.apply(Expire(G, 500))
    command = Accept if action == "accept" else Release
    result = state.apply(command(G, "a", (1, 2), now_ms=500))  # the lease ends at 500
    assert (result.done, result.refused) == ([], [1, 2])
    assert state.describe(G)["accepted"] == 0
    assert state.available(G, 10, 500) == [1, 2]
    assert state.groups[G].deliveries == {1: 1, 2: 1}


def test_a_lease_that_holds_at_the_settles_time_is_settled() -> None:
    state = state_with(1)
    acquire(state, "a", 1, now=0, lease=500)
    assert state.apply(Accept(G, "a", (1,), now_ms=499)).done == [1]


@pytest.mark.parametrize("later", ["accept", "release", "reject"])
@pytest.mark.parametrize("first", ["accept", "reject"])
def test_settling_what_another_consumer_settled_is_refused(first: str, later: str) -> None:
    state = state_with(1)
    acquire(state, "a", 1, now=0, lease=500)
    state.apply(Acquire(G, "b", (1,), 500, 1_000))  # a's lease ended: b holds it now
    settle(state, "b", first, 1_100)
    assert settle(state, "a", later, 1_200).refused == [1]
    state.apply(DeadLettered(G, (1,)))
    assert state.groups[G].cursor == 2  # finished: below the cursor too
    assert settle(state, "a", later, 1_300).refused == [1]
    assert settle(state, "c", later, 1_300).refused == [1]  # never held it at all


def settle(state: QueueState, consumer: str, action: str, now: int) -> Result:
    if action == "accept":
        return state.apply(Accept(G, consumer, (1,), now_ms=now))
    if action == "release":
        return state.apply(Release(G, consumer, (1,), now_ms=now))
    return state.apply(Reject(G, consumer, (1,), now_ms=now))


def test_a_retried_settle_by_the_same_consumer_is_done_and_takes_effect_once() -> None:
    state = state_with(3)
    acquire(state, "a", 3, now=0, lease=500)
    assert state.apply(Accept(G, "a", (1,), now_ms=10)).done == [1]
    assert state.apply(Reject(G, "a", (2,), now_ms=10)).dead_lettered == [2]
    state.apply(DeadLettered(G, (2,)))
    assert state.groups[G].cursor == 3
    # the answers were lost: the same calls again, after the leases would have ended
    assert state.apply(Accept(G, "a", (1,), now_ms=5_000)).done == [1]
    repeated = state.apply(Reject(G, "a", (2,), now_ms=5_000))
    assert (repeated.done, repeated.dead_lettered) == ([2], [])
    assert (state.describe(G)["accepted"], state.describe(G)["dead_lettered"]) == (1, 1)
    # another action than the one that took effect is not a repeat
    assert state.apply(Reject(G, "a", (1,), now_ms=5_000)).refused == [1]
    assert state.apply(Accept(G, "a", (2,), now_ms=5_000)).refused == [2]
    # once it is handed out again, a release of the earlier delivery is no repeat
    assert state.apply(Release(G, "a", (3,), now_ms=5_000)).refused == [3]  # lease ended
    state.apply(Acquire(G, "a", (3,), 500, 5_000))
    assert state.apply(Release(G, "a", (3,), now_ms=5_100)).done == [3]
    assert state.apply(Release(G, "a", (3,), now_ms=5_200)).done == [3]  # repeated
    state.apply(Acquire(G, "b", (3,), 500, 5_300))
    assert state.apply(Release(G, "a", (3,), now_ms=5_400)).refused == [3]
    # a repeat survives a snapshot (a replica that catches up answers the same)
    restored = QueueState.restore(state.snapshot())
    assert restored.apply(Accept(G, "a", (1,), now_ms=6_000)).done == [1]


def test_settlements_are_remembered_in_two_bounded_generations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(state_module, "SETTLED_GENERATION", 4)
    state = state_with(20)
    acquire(state, "a", 20, now=0, lease=10_000)
    for index in range(1, 21):
        state.apply(Accept(G, "a", (index,), now_ms=1))
        group = state.groups[G]
        assert len(group.settled) <= 4 and len(group.settled_before) <= 4
    # the last settlements are remembered, the older ones forgotten (refused: unknown)
    assert state.apply(Accept(G, "a", (17, 20), now_ms=2)).done == [17, 20]
    assert state.apply(Accept(G, "a", (12,), now_ms=2)).refused == [12]
    restored = QueueState.restore(state.snapshot())
    assert restored.snapshot() == state.snapshot()
    assert restored.apply(Accept(G, "a", (17, 20), now_ms=2)).done == [17, 20]


def test_a_version_1_snapshot_is_restored_without_settlements() -> None:
    # written by the code before settlements were remembered: a holds 1, accepted 2 and
    # rejected 3 (dead-lettered); b holds 4
    old = (
        b'{"end_index":5,"groups":{"workers":{"accepted_total":1,"acquired":[[1,"a",1000,1],'
        b'[4,"b",1000,1]],"cursor":1,"dead_done":[3],"dead_lettered_total":1,"dead_pending"'
        b':[],"deliveries":[],"done":[2,3],"frontier":5,"next_dead_sequence":1}},'
        b'"max_deliveries":10,"ranges":[[1,5]],"start_index":0,"version":1}'
    )
    state = QueueState.restore(old)
    group = state.groups[G]
    assert group.cursor == 1 and group.done == {2, 3} and not group.settled
    # what it did not remember is refused, even the true repeat
    assert state.apply(Accept(G, "a", (2, 3), now_ms=10)).refused == [2, 3]
    assert state.apply(Accept(G, "a", (1,), now_ms=10)).done == [1]
    assert state.apply(Accept(G, "a", (1,), now_ms=20)).done == [1]  # remembered from now
    assert group.cursor == 4 and json.loads(state.snapshot())["version"] == 2


# ---- random sequences against the invariants ----------------------------------------------

CONSUMERS = ("c1", "c2", "c3")
RECORDS = 30


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = state_with(1, QueueConfig(max_deliveries=3, max_acquired_per_group=8))
        self.appended = 1  # records 1..appended exist
        self.now = 0
        self.accepted: set[int] = set()
        self.dead: dict[int, int] = {}  # index -> times dead-lettered (confirmed)
        self.ever_pending: set[int] = set()
        self.leases: dict[int, tuple[str, int]] = {}  # the model: index -> (holder, deadline)
        #: the model: index -> (consumer, action) that settled it last since it was granted
        self.settled: dict[int, tuple[str, str]] = {}

    @rule(count=st.integers(1, 5))
    def produce(self, count: int) -> None:
        if self.appended + count <= RECORDS:
            self.state.on_records(self.appended + 1, count)
            self.appended += count

    @rule(consumer=st.sampled_from(CONSUMERS), n=st.integers(1, 4), lease=st.integers(1, 50))
    def acquire(self, consumer: str, n: int, lease: int) -> None:
        indexes = self.state.available(G, n, self.now)
        if not indexes:
            return
        self.acquire_exactly(consumer, tuple(indexes), lease)

    @rule(consumer=st.sampled_from(CONSUMERS), data=st.data(), lease=st.integers(1, 50))
    def acquire_some(self, consumer: str, data: st.DataObject, lease: int) -> None:
        """An acquire the leader chose beside others in flight: any subset, any order, stale
        indexes (held, finished, beyond the log) mixed in."""
        candidates = self.state.available(G, 8, self.now) + list(range(0, self.appended + 3))
        picked = data.draw(
            st.lists(st.sampled_from(candidates), min_size=1, max_size=6, unique=True)
        )
        self.acquire_exactly(consumer, tuple(picked), lease)

    def acquire_exactly(self, consumer: str, indexes: tuple[int, ...], lease: int) -> None:
        result = self.state.apply(Acquire(G, consumer, indexes, lease, self.now))
        for granted in result.granted:
            holder = self.leases.get(granted.index)
            assert holder is None or holder[1] <= self.now, f"two holders of {granted.index}"
            self.leases[granted.index] = (consumer, granted.deadline_ms)
            self.settled.pop(granted.index, None)
            assert granted.index not in self.accepted, "an accepted message came back"
            assert granted.index not in self.dead, "a dead-lettered message came back"
            assert granted.index not in self.ever_pending, "a dead-lettered message came back"

    def _held(self, consumer: str) -> list[int]:
        return sorted(i for i, h in self.state.groups[G].acquired.items() if h.consumer == consumer)

    @precondition(lambda self: G in self.state.groups)
    @rule(consumer=st.sampled_from(CONSUMERS), data=st.data())
    def settle(self, consumer: str, data: st.DataObject) -> None:
        """Settle some of what `consumer` holds (its lease may have ended), and maybe other
        indexes too (settled by it or by others before, held by others, never acquired)."""
        held = self._held(consumer)
        others = st.integers(0, self.appended + 2)
        candidates = st.sampled_from(held) | others if held else others
        picked = tuple(data.draw(st.lists(candidates, min_size=1, max_size=6, unique=True)))
        action = data.draw(st.sampled_from(["accept", "release", "reject"]))
        expected_done = []
        for index in picked:  # the model: the holder while its lease holds, or a repeat
            holder, deadline = self.leases.get(index, ("", 0))
            if holder == consumer and deadline > self.now:
                del self.leases[index]
                self.settled[index] = (consumer, action)
                expected_done.append(index)
            elif self.settled.get(index) == (consumer, action):
                event("a repeated settle")
                expected_done.append(index)
            elif holder == consumer:
                event("a settle after the lease ended")
            elif index in self.settled:
                event("a settle of what another settlement finished")
        if action == "accept":
            result = self.state.apply(Accept(G, consumer, picked, now_ms=self.now))
            self.accepted.update(result.done)
        elif action == "release":
            result = self.state.apply(Release(G, consumer, picked, now_ms=self.now))
        else:
            result = self.state.apply(Reject(G, consumer, picked, now_ms=self.now))
        assert result.done == expected_done
        assert result.refused == [i for i in picked if i not in expected_done]

    @rule(ms=st.integers(1, 40))
    def tick(self, ms: int) -> None:
        self.now += ms

    @precondition(lambda self: G in self.state.groups)
    @rule()
    def expire(self) -> None:
        self.state.apply(Expire(G, self.now))

    @precondition(lambda self: G in self.state.groups and self.state.groups[G].dead_pending)
    @rule()
    def dead_letter(self) -> None:
        pending = self.state.groups[G].dead_pending
        first = min(pending, key=lambda i: pending[i].sequence)
        result = self.state.apply(DeadLettered(G, (first,)))
        for index in result.done:
            self.dead[index] = self.dead.get(index, 0) + 1

    @rule()
    def replica_catches_up(self) -> None:
        restored = QueueState.restore(self.state.snapshot(), self.state.config)
        assert restored.snapshot() == self.state.snapshot()
        self.state = restored

    @invariant()
    def invariants(self) -> None:
        group = self.state.groups.get(G)
        if group is None:
            return
        self.ever_pending.update(group.dead_pending)
        holders = set(group.acquired)
        assert not holders & self.accepted, "an accepted message is held"
        assert not holders & set(group.dead_pending), "a dead-letter-pending message is held"
        assert all(n == 1 for n in self.dead.values()), "dead-lettered twice"
        assert not self.accepted & set(self.dead), "accepted and dead-lettered"
        sequences = [d.sequence for d in group.dead_pending.values()]
        assert len(sequences) == len(set(sequences))
        # what the leader offers is exactly what a scan of every record finds free
        scanned = [
            i
            for i in self.state.records_from(group.cursor)
            if i not in group.done
            and i not in group.dead_pending
            and (i not in group.acquired or group.acquired[i].deadline_ms <= self.now)
        ]
        assert self.state.available(G, 1000, self.now) == scanned
        # the derived bookkeeping follows the holdings
        assert group.held == Counter(h.consumer for h in group.acquired.values())
        assert all(group.next_deadline_ms <= h.deadline_ms for h in group.acquired.values())
        assert group.cursor <= self.appended + 1
        assert all(i >= group.cursor for i in group.done | holders)

    def teardown(self) -> None:
        """Drain: every record ends accepted or dead-lettered, exactly once."""
        for _ in range(10 * RECORDS):
            self.now += 1000
            self.state.apply(Expire(G, self.now))
            pending = self.state.groups[G].dead_pending if G in self.state.groups else {}
            for index in sorted(pending, key=lambda i: pending[i].sequence):
                self.state.apply(DeadLettered(G, (index,)))
                self.dead[index] = self.dead.get(index, 0) + 1
            indexes = self.state.available(G, 8, self.now)
            if not indexes:
                if not pending:
                    break
                continue
            result = self.state.apply(Acquire(G, "drain", tuple(indexes), 10, self.now))
            granted = tuple(g.index for g in result.granted)
            if granted:
                self.accepted.update(self.state.apply(Accept(G, "drain", granted)).done)
        finished = sorted(self.accepted | set(self.dead))
        assert finished == list(range(1, self.appended + 1)), "a message was lost"
        assert not self.accepted & set(self.dead)
        assert all(n == 1 for n in self.dead.values())


GroupMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
test_random_group_sequences = GroupMachine.TestCase


def test_a_renew_that_shortens_a_lease_expires_at_the_new_deadline() -> None:
    state = state_with(1)
    acquire(state, "a", 1, now=0, lease=1000)
    state.apply(Renew(G, "a", (1,), 100, 400))  # now ends at 500, not 1000
    state.apply(Expire(G, 600))
    assert state.groups[G].deliveries == {1: 1} and state.groups[G].held == {}
    assert QueueState.restore(state.snapshot()).snapshot() == state.snapshot()


def test_accepting_a_dead_lettered_message_is_refused_before_and_after_its_append() -> None:
    state = state_with(3, QueueConfig(max_deliveries=1))
    acquire(state, "b", 1, now=0, lease=1000)  # holds 1: the cursor stays below 2 and 3
    acquire(state, "a", 2, now=0, lease=10)
    state.apply(Expire(G, 10))  # 2 and 3 came back at the limit: dead letters
    assert state.apply(Accept(G, "a", (2,))).refused == [2]
    state.apply(DeadLettered(G, (2, 3)))
    assert state.apply(Accept(G, "a", (2, 3))).refused == [2, 3]
    assert state.apply(Accept(G, "b", (1,))).done == [1]
    # below the cursor too: only b's own accept is done (repeated)
    assert state.groups[G].cursor == 4
    assert state.apply(Accept(G, "a", (2, 3))).refused == [2, 3]
    assert state.apply(Accept(G, "b", (1,))).done == [1]


def test_lowering_max_deliveries_dead_letters_free_messages_already_past_it() -> None:
    state = state_with(2)
    for now in (0, 100, 200):
        acquire(state, "a", 1, now=now, lease=50)
        state.apply(Release(G, "a", (1,)))
    result = state.apply(Configure(2))
    assert result.dead_lettered == [1]
    assert state.available(G, 10, 300) == [2]
