"""The queue scenario: shared-queue consumer groups on Raft partitions under faults.

Every partition (Raft group) carries one consumer group, `workers`. Each replica keeps a
`QueueApplier` in step with its committed log, as the broker does: it is handed the entries
once they are durable, checkpoints often, is rebuilt from storage on restart, reset when a
snapshot is installed, and snapshotted when the log is compacted. Producers append record
batches (the base simulation's proposals): the committed record indexes are the messages.
Virtual consumers act through whichever node claims to lead the partition: the leader picks
`available` indexes from its own applied state, then records it proposed and has not applied
(pipelined acquisition, `laminar.queue.pending`), minus those in its uncommitted Acquires, and
proposes an Acquire with its own clock; as the broker hands new records to its parked long-polls,
a consumer that is idle may have its Acquire proposed right behind the records, before their
Ready is persisted (one round for both) (a `ClockJump` puts a node's clock ahead of the
others': leases then end early and are granted late); a consumer learns what it was granted
only when the proposing node applies that entry (and the answer is not lost). Consumers accept,
release, reject and renew what they believe they hold, and sometimes crash, forgetting it
all, so leases must expire. Leaders switch `max_deliveries` to 3, propose Expire when a lease
is due, and drain dead letters: append to a modelled dead-letter topic (an idempotent
producer keyed by the group's incarnation and the dead letter's sequence), then propose
DeadLettered. A leader change between the two makes the next leader append again: the model
must absorb it. While faults happen an admin now and then resets the group's cursor (to the
earliest, the latest or any index; forced or not, so busy groups are refused or dropped) as
the broker plans it (`laminar.queue.rewind`: a rewind carries the record ranges the leader
reads from its own log), or deletes the group (a consumer's next command makes it again).

Invariants, on top of the base simulation's Raft checks:

* an oracle rebuilt from the committed commands and their results, in log order, checks
  every result: no index is granted while another lease on it holds, an accepted or
  dead-lettered message is never granted again, delivery counts and dead letters follow
  `max_deliveries`, only the holder finishes a message, and only while its lease holds at
  the command's time (expired or not); a settle is answered `done` exactly when it took
  effect or repeats the consumer's own settlement that took effect last since the message
  was handed out, else `refused`; a free message is not refused; and the oracle matches the
  applied state (holders, delivery counts, dead letters, totals);
* replicas that applied the same log prefix hold byte-identical queue snapshots, and a
  state restored from a snapshot decides as the live one does (flow control, expiring the
  earliest lease), so nothing kept beside the snapshot can make replicas drift apart;
* a dead-letter sequence names one message;
* a reset or delete is refused as busy exactly when the oracle holds a message under a lease
  or a dead letter, and it is not forced; a reset puts the cursor on the first record at or
  after its target; a deleted group's successor starts no later than the first message its
  predecessor had not finished; and nothing below the cursor a reset set is granted;
* after faults stop and the consumers drain the queues: every committed message from the last
  reset's cursor on was accepted exactly once or landed in the dead-letter topic exactly once
  (never both) since that reset, and each group's cursor is at the end of its log with nothing
  held or waiting to be dead-lettered.

Everything random comes from the simulation's seeded generator: `python -m laminar.sim
--queue --seed N` replays a failure exactly.
"""

from __future__ import annotations

import copy
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import xxhash

from ..log.batch import Record, encode_batch
from ..queue.applier import Applied, QueueApplier
from ..queue.entries import QUEUE_KEY
from ..queue.pending import pending_records
from ..queue.rewind import plan_reset
from ..queue.state import (
    Accept,
    Acquire,
    Configure,
    DeadLetter,
    DeadLettered,
    DeleteGroup,
    Expire,
    QueueCommand,
    QueueState,
    Reject,
    Release,
    Renew,
    Reset,
    Result,
    encode_command,
)
from ..raft.config import RaftConfig
from ..raft.log_storage import LogStorage
from ..raft.messages import ConfState, EntryKind
from ..raft.raft import ProposalDropped, Raft, Ready, Role
from ..raft.storage import stored_entries
from .cluster import TICK_MS, InvariantViolation, SimConfig, SimNode, Simulation, _hash

QUEUE_GROUP = "workers"
CONSUMERS = 4
MAX_DELIVERIES = 3
LEASE_MS = (100, 400)
MAX_HELD = 6  # a consumer asks for more only while it believes it holds fewer
ACT_RATE = 0.3  # per consumer per tick
CONSUMER_CRASH_RATE = 0.004  # per consumer per faulty tick
ANSWER_LOSS_RATE = 0.05  # the answer to a committed request never reaches the consumer
DLQ_FAILURE_RATE = 0.1  # a dead-letter append fails (the leader retries next tick)
REQUEST_TIMEOUT_MS = 300  # a consumer waits this long for an answer before acting again
HAND_OFF_RATE = 0.5  # new records are handed to an idle consumer's Acquire in their Ready
ADMIN_RATE = 0.03  # per faulty tick: an admin resets (or deletes) one partition's group
CHECKPOINT_INDEXES = 40  # small, so restarts also start from queue checkpoints
HISTORY = 8  # commands of the partition quoted when a check fails
DRAIN_TICKS = 3000  # after settling: at most this long for the consumers to finish
STALL_TICKS = 300  # ... and fail sooner if nothing moves this long
QUIET_TICKS = 60  # then without requests, for every commit to reach every replica

SCENARIO = SimConfig(
    nodes=5,
    groups=((0, 1, 2, 3, 4), (0, 1, 2), (2, 3, 4)),
    ticks=250,
    settle_ticks=100,
    propose_rate=0.25,
    compact_rate=0.008,
    corrupt_rate=0.0,  # bit flips are the Raft simulation's (sim/cluster.py)
    reorder_rate=0.01,
    clock_jump_rate=0.005,  # a leader ahead ends leases early and grants them late
    disk_full_rate=0.005,
    raft=RaftConfig(election_ticks=10, heartbeat_ticks=2, max_append_bytes=4096),
)

#: counters every run reports (also when zero)
STAT_KEYS = (
    "messages",
    "requests",
    "grants",
    "redeliveries",
    "accepts",
    "releases",
    "rejects",
    "renewals",
    "expiries",
    "refused",
    "dead_letters",
    "max_delivery_dead_letters",
    "dlq_appends",
    "dlq_duplicate_appends",
    "dlq_failures",
    "lost_answers",
    "consumer_crashes",
    "queue_resets",
    "queue_compactions",
    "queue_checkpoints",
    "repeated_settles",
    "late_settles",
    "handed_off_acquires",
    "group_resets",
    "group_deletes",
    "group_admin_refused",
    "rewinds_below_forgotten_ranges",
)


@dataclass
class Lease:
    consumer: str
    deadline_ms: int
    deliveries: int


@dataclass
class Oracle:
    """One partition's consumer group as its committed commands say it must be, rebuilt in
    log order from the commands and their results without using QueueState."""

    partition: str
    stats: dict[str, int]
    end: int = 0  # the next log index to take in
    max_deliveries: int = 10
    max_lease_ms: int = 3_600_000
    records: set[int] = field(default_factory=set)
    #: the group exists (its state is held), and the log index of the command that made it
    exists: bool = False
    incarnation: int = 0
    #: nothing below it is handed out (since the last reset or delete); the sequence of the
    #: generation's first dead letter
    floor: int = 0
    first_sequence: int = 0
    #: what the state's totals say (the group's whole history, but a delete's)
    accepted_total: int = 0
    confirmed_total: int = 0
    holders: dict[int, Lease] = field(default_factory=dict)
    #: delivery counts of messages given out before and free again
    deliveries: dict[int, int] = field(default_factory=dict)
    #: since the last reset or delete (a generation): index -> finishing accepts
    accepted: dict[int, int] = field(default_factory=dict)
    dead_pending: dict[int, int] = field(default_factory=dict)  # index -> sequence
    dead_sequences: dict[int, int] = field(default_factory=dict)  # every dead letter ever
    dead_confirmed: dict[int, int] = field(default_factory=dict)  # index -> confirmations
    #: index -> (consumer, action) of the settlement that took effect last since the index
    #: was last granted (the runs settle far fewer than SETTLED_GENERATION messages a group,
    #: so the state forgets none of them)
    settled: dict[int, tuple[str, str]] = field(default_factory=dict)
    next_sequence: int = 0
    #: the last commands taken in, for the failure report
    history: deque[str] = field(default_factory=lambda: deque(maxlen=HISTORY))

    def fail(self, index: int, problem: str) -> None:
        recent = "\n".join(f"    {line}" for line in self.history)
        raise InvariantViolation(
            f"{self.partition}@{index}: {problem}\n  {self.partition}'s last commands:\n{recent}"
        )

    def count(self, key: str, n: int = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + n

    def take_records(self, base: int, count: int) -> None:
        self.records.update(range(base, base + count))
        self.count("messages", count)

    def _finished(self, index: int) -> bool:
        return index in self.accepted or index in self.dead_sequences

    def _returned(self, index: int, deliveries: int, dead: list[int]) -> None:
        if deliveries >= self.max_deliveries:
            dead.append(index)
            self.count("max_delivery_dead_letters")
        else:
            self.deliveries[index] = deliveries

    def _expire(self, now_ms: int, dead: list[int]) -> None:
        for index in sorted(i for i, lease in self.holders.items() if lease.deadline_ms <= now_ms):
            lease = self.holders.pop(index)
            self.count("expiries")
            self._returned(index, lease.deliveries, dead)

    def apply(self, at: int, command: QueueCommand, result: Result) -> None:
        """Check a committed command's result against the oracle, then take it in."""
        self.history.append(f"@{at} {command} -> {result}")
        dead: list[int] = []
        done, refused = set(result.done), set(result.refused)
        self.count("refused", len(refused))
        makes = not isinstance(command, Configure | Expire | DeadLettered | DeleteGroup)
        if makes and not self.exists:  # (the state makes the group at this command)
            self.exists, self.incarnation = True, at
            self.accepted_total = self.confirmed_total = 0
        if isinstance(command, Configure):
            self.max_deliveries = command.max_deliveries
        elif isinstance(command, Reset | DeleteGroup):
            self._admin(at, command, result)
        elif isinstance(command, Acquire):
            self._acquire(at, command, result, dead)
        elif isinstance(command, Accept | Release | Reject):
            self._settle(at, command, done, refused, dead)
        elif isinstance(command, Renew):
            lease_ms = min(command.lease_ms, self.max_lease_ms)
            for index in command.indexes:
                lease = self.holders.get(index)
                mine = lease is not None and lease.consumer == command.consumer
                if lease is not None and mine and lease.deadline_ms > command.now_ms:
                    if index not in done:
                        self.fail(at, f"{command.consumer}'s live lease on {index} not renewed")
                    lease.deadline_ms = command.now_ms + lease_ms
                    self.count("renewals")
                elif index in done:
                    self.fail(at, f"{command.consumer} renewed {index} it does not hold: {lease}")
        elif isinstance(command, Expire):
            self._expire(command.now_ms, dead)
        else:
            mine = command.incarnation in (None, self.incarnation)
            sequences = command.sequences or (None,) * len(command.indexes)
            for index, sequence in zip(command.indexes, sequences, strict=True):
                pending = self.dead_pending.get(index)
                if mine and pending is not None and sequence in (None, pending):
                    if index not in done:
                        self.fail(at, f"the dead-letter append of {index} was not taken")
                    del self.dead_pending[index]
                    self.dead_confirmed[index] = self.dead_confirmed.get(index, 0) + 1
                    self.confirmed_total += 1
                    self.count("dead_letters")
                elif index in done:
                    self.fail(at, f"{index} confirmed as dead-lettered but not the one pending")
        if sorted(dead) != sorted(result.dead_lettered):
            self.fail(at, f"{command} dead-lettered {result.dead_lettered}, expected {dead}")
        for index in result.dead_lettered:
            self.deliveries.pop(index, None)
            self.dead_pending[index] = self.dead_sequences[index] = self.next_sequence
            self.next_sequence += 1

    def _busy(self, now_ms: int) -> bool:
        """Is a message held under a lease not ended by `now_ms`, or a dead letter pending?"""
        held = any(lease.deadline_ms > now_ms for lease in self.holders.values())
        return held or bool(self.dead_pending)

    def _admin(self, at: int, command: Reset | DeleteGroup, result: Result) -> None:
        """A reset or a delete: refused exactly when busy and not forced (or, a delete, when
        there is no group); done, it starts a generation."""
        if isinstance(command, DeleteGroup) and not self.exists:
            if result.refusal != "not_found":
                self.fail(at, f"{command} of no group answered {result}")
            self.count("group_admin_refused")
            return
        busy = self._busy(command.now_ms) and not command.force
        said_busy = result.refusal is not None and result.refusal.startswith("busy")
        if busy != said_busy:
            self.fail(at, f"{command}: busy is {busy}, the state answered {result.refusal}")
        if busy or (result.refusal == "moved" and isinstance(command, Reset)):
            # (moved: the forgotten floor moved since the leader planned it; planned again)
            self.count("group_admin_refused")
            return
        if result.refusal is not None or result.cursor is None:
            self.fail(at, f"{command} refused: {result}")
        assert result.cursor is not None
        if isinstance(command, Reset):
            # the first record at or after the target (below the state's end, at + 1)
            target = min(command.cursor, at + 1)
            expected = min((i for i in self.records if i >= target), default=at + 1)
            if result.cursor != expected:
                self.fail(at, f"{command} put the cursor at {result.cursor}, not {expected}")
            self.count("group_resets")
        else:
            unfinished = [i for i in self.records if i >= self.floor and not self._finished(i)]
            if unfinished and result.cursor > min(unfinished):
                self.fail(
                    at, f"a group made again starts at {result.cursor}, past {min(unfinished)}"
                )
            self.exists = False
            self.accepted_total = self.confirmed_total = 0
            self.next_sequence = 0  # (the next incarnation's dead-letter producer is new)
            self.count("group_deletes")
        self.floor = result.cursor
        self.first_sequence = self.next_sequence
        self.holders.clear()
        self.deliveries.clear()
        self.dead_pending.clear()
        self.settled.clear()
        self.accepted.clear()
        self.dead_sequences.clear()
        self.dead_confirmed.clear()

    def _acquire(self, at: int, command: Acquire, result: Result, dead: list[int]) -> None:
        now = command.now_ms
        self._expire(now, dead)
        lease_ms = min(command.lease_ms, self.max_lease_ms)
        for granted in result.granted:
            index = granted.index
            if index in self.accepted:
                self.fail(at, f"accepted message {index} redelivered to {command.consumer}")
            if index in self.dead_sequences:
                self.fail(at, f"dead-lettered message {index} redelivered to {command.consumer}")
            if index not in self.records or index not in command.indexes:
                self.fail(at, f"granted {index}: not a record, or not asked for")
            if index < self.floor:
                self.fail(at, f"granted {index}, below the cursor {self.floor} a reset set")
            holder = self.holders.get(index)
            if holder is not None:
                self.fail(
                    at,
                    f"two holders: {index} granted to {command.consumer} at {now} ms while "
                    f"{holder.consumer} holds it until {holder.deadline_ms} ms",
                )
            deliveries = self.deliveries.pop(index, 0) + 1
            if (granted.deliveries, granted.deadline_ms) != (deliveries, now + lease_ms):
                self.fail(at, f"grant {granted}: expected delivery {deliveries}, lease {lease_ms}")
            self.holders[index] = Lease(command.consumer, granted.deadline_ms, deliveries)
            self.settled.pop(index, None)
            self.count("grants")
            if deliveries > 1:
                self.count("redeliveries")
        for index in result.refused:
            free = not self._finished(index) and index not in self.holders and index not in dead
            if index in self.records and free and index >= self.floor:
                self.fail(at, f"free message {index} refused to {command.consumer}")

    def _settle(
        self,
        at: int,
        command: Accept | Release | Reject,
        done: set[int],
        refused: set[int],
        dead: list[int],
    ) -> None:
        if command.now_ms is not None:  # leases ended by the command's time are over
            self._expire(command.now_ms, dead)
        action = {Accept: "accept", Release: "release", Reject: "reject"}[type(command)]
        settlement = (command.consumer, action)
        for index in command.indexes:
            lease = self.holders.get(index)
            if lease is None or lease.consumer != command.consumer:
                if self.settled.get(index) == settlement:
                    if index not in done:
                        self.fail(at, f"{command.consumer}'s repeated {action} of {index} refused")
                    self.count("repeated_settles")
                elif index in done or index not in refused:
                    self.fail(
                        at,
                        f"{command.consumer}'s {action} of {index} answered done but did not "
                        f"take effect (held by {lease}, settled last by "
                        f"{self.settled.get(index)})",
                    )
                else:
                    self.count("late_settles")
                continue
            if index not in done:
                self.fail(at, f"the holder {command.consumer} could not {action} {index}")
            del self.holders[index]
            self.settled[index] = settlement
            if isinstance(command, Accept):
                self.accepted[index] = self.accepted.get(index, 0) + 1
                self.accepted_total += 1
                self.count("accepts")
            elif isinstance(command, Reject):
                self.count("rejects")
                dead.append(index)
            else:
                self.count("releases")
                self._returned(index, lease.deliveries, dead)

    def compare(self, state: QueueState, where: str) -> None:
        """The applied state must hold what the oracle holds."""
        group = state.groups.get(QUEUE_GROUP)
        acquired = (
            {i: (h.consumer, h.deadline_ms, h.deliveries) for i, h in group.acquired.items()}
            if group is not None
            else {}
        )
        expected = {i: (h.consumer, h.deadline_ms, h.deliveries) for i, h in self.holders.items()}
        if acquired != expected:
            self.fail(self.end - 1, f"on {where}: holders {acquired} != oracle {expected}")
        # (a count of 0 may mark a message passed over, never given out: not a delivery)
        deliveries = {i: n for i, n in group.deliveries.items() if n} if group else {}
        if deliveries != self.deliveries:
            self.fail(self.end - 1, f"on {where}: deliveries {deliveries} != {self.deliveries}")
        pending = {i: d.sequence for i, d in group.dead_pending.items()} if group else {}
        if pending != self.dead_pending:
            self.fail(self.end - 1, f"on {where}: dead letters {pending} != {self.dead_pending}")
        totals = (group.accepted_total, group.dead_lettered_total) if group else (0, 0)
        if totals != (self.accepted_total, self.confirmed_total):
            self.fail(self.end - 1, f"on {where}: accepted/dead-lettered totals {totals} wrong")
        if (group is not None) != self.exists:
            self.fail(self.end - 1, f"on {where}: the group exists: {group is not None}")
        if group is not None and group.incarnation != self.incarnation:
            self.fail(self.end - 1, f"on {where}: incarnation {group.incarnation}")
        if state.config.max_deliveries != self.max_deliveries:
            self.fail(self.end - 1, f"on {where}: max_deliveries {state.config.max_deliveries}")


@dataclass
class Consumer:
    name: str
    holds: dict[int, int] = field(default_factory=dict)  # index -> deadline it was told
    incarnation: int = 0
    down_until_ms: int = -1
    waiting_until_ms: int = -1  # a request is out until then


@dataclass(frozen=True)
class Request:
    """A command proposed on a node: answered when that node applies it."""

    consumer: str
    incarnation: int
    term: int
    command: QueueCommand


class ObservedApplier(QueueApplier):
    """A QueueApplier that reports every catch-up, the one its constructor does too."""

    def __init__(
        self,
        storage: LogStorage,
        observe: Callable[[ObservedApplier, int, list[Applied]], None],
        stats: dict[str, int],
    ) -> None:
        self.observe = observe
        self.stats = stats
        self.hashed_end = -1  # the end index of the state last fingerprinted
        super().__init__(storage, checkpoint_indexes=CHECKPOINT_INDEXES)

    def checkpoint(self) -> None:
        super().checkpoint()
        self.stats["queue_checkpoints"] = self.stats.get("queue_checkpoints", 0) + 1

    def catch_up(self, last: int) -> list[Applied]:
        before = self.state.end_index
        applied = super().catch_up(last)
        self.observe(self, before, applied)
        return applied


class QueueSimulation(Simulation):
    replay_command = "python -m laminar.sim --queue"

    def __init__(self, seed: int, config: SimConfig = SCENARIO) -> None:
        self.appliers: dict[str, dict[str, ObservedApplier]] = defaultdict(dict)
        self.oracles: dict[str, Oracle] = {}
        #: partition -> applied end index -> (fingerprint of the queue state, node)
        self.fingerprints: dict[str, dict[int, tuple[int, str]]] = defaultdict(dict)
        #: node -> partition -> log index -> consumer request / leader duty awaiting apply
        self.requests: dict[str, dict[str, dict[int, Request]]] = defaultdict(
            lambda: defaultdict(dict)
        )
        #: the dead-letter topic: (group, incarnation, partition, sequence) -> original index
        self.dlq: dict[tuple[str, int, str, int], int] = {}
        self.quiet = False  # after draining: no consumer requests, no leader duties
        super().__init__(seed, config)
        for key in STAT_KEYS:
            self.stats.setdefault(key, 0)
        self.consumers = {
            group: [Consumer(f"c{i}") for i in range(CONSUMERS)] for group in self.group_names
        }

    def _count(self, key: str, n: int = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + n

    # ---- replicas: one applier per hosted partition ----------------------------------------

    def _host(
        self,
        node: SimNode,
        group: str,
        conf: ConfState,
        *,
        repair_at: int | None = None,
        joining: bool = False,
    ) -> None:
        super()._host(node, group, conf, repair_at=repair_at, joining=joining)
        if group not in self.oracles:
            self.oracles[group] = Oracle(group, self.stats)

        def observe(applier: ObservedApplier, before: int, applied: list[Applied]) -> None:
            self._observe(node, group, applier, before, applied)

        self.appliers[node.id][group] = ObservedApplier(node.storages[group], observe, self.stats)

    def _on_written(self, node: SimNode, group: str, ready: Ready) -> None:
        """Hand a Ready's entries to the applier as soon as they are written, as the broker
        does, so that applying them needs no read."""
        self.appliers[node.id][group].written(ready.entries)

    def _crash(self, node: SimNode, *, torn: bool) -> None:
        super()._crash(node, torn=torn)
        self.appliers.pop(node.id, None)
        self.requests.pop(node.id, None)  # its clients' connections are gone

    def _on_commit(self, node: SimNode, group: str, committed: tuple[int, int]) -> None:
        self.appliers[node.id][group].catch_up(committed[1])

    def _on_snapshot(self, node: SimNode, group: str) -> None:
        applier = self.appliers[node.id][group]
        applier.reset()
        self._count("queue_resets")
        self._fingerprint(node, group, applier)
        self._forget_answered(node, group, applier)

    def _compact(self, node: SimNode, group: str) -> None:
        """Compact at the applied index (= the commit, so the snapshot's configuration is
        exact), with the queue state as the snapshot data."""
        assert node.multi is not None
        storage = node.storages[group]
        applier = self.appliers[node.id][group]
        point = applier.applied_index
        if point != node.multi.groups[group].log.committed:
            return
        if point <= storage.first_index() or point > storage.last_index():
            return
        storage.compact(point, applier.snapshot_data())
        storage.log.remove_through(point)
        self._count("queue_compactions")
        self._log(f"{node.id} {group} compacts through {point}")

    def _observe(
        self,
        node: SimNode,
        group: str,
        applier: ObservedApplier,
        before: int,
        applied: list[Applied],
    ) -> None:
        """A replica applied committed entries: feed the oracle what nobody applied before,
        compare states, and answer the requests this node proposed."""
        oracle = self.oracles[group]
        end = applier.state.end_index
        if end > oracle.end:
            if before > oracle.end:
                self._fail(f"{node.id} {group} applied from {before} past the oracle {oracle.end}")
            results = {a.index: a for a in applied}
            for entry in stored_entries(applier.storage, oracle.end, end - 1):
                if entry.index < oracle.end:
                    continue
                if entry.kind is EntryKind.NORMAL:
                    oracle.take_records(entry.index, entry.count)
                elif entry.index in results:
                    done = results[entry.index]
                    oracle.apply(entry.index, done.command, done.result)
                oracle.end = entry.last_index + 1
            if oracle.end != end:
                self._fail(f"{node.id} {group}: the oracle reached {oracle.end}, not {end}")
            oracle.compare(applier.state, node.id)
            self._check_restorable(applier.state, oracle, f"{node.id} {group}@{end - 1}")
        self._fingerprint(node, group, applier)
        if self.appliers.get(node.id, {}).get(group) is applier:  # not while (re)starting
            self._answer(node, group, applied)
            self._forget_answered(node, group, applier)

    def _check_restorable(self, state: QueueState, oracle: Oracle, where: str) -> None:
        """A replica restored from a snapshot of this state must behave as this one does:
        state kept beside the snapshot (caches, indexes) must not change any decision. Probe
        both with flow control and with expiring the earliest lease."""
        group = state.groups.get(QUEUE_GROUP)
        if group is None:
            return
        fresh = QueueState.restore(state.snapshot(), state.config)
        for name in sorted({h.consumer for h in group.acquired.values()}):
            if state.room(QUEUE_GROUP, name) != fresh.room(QUEUE_GROUP, name):
                oracle.fail(oracle.end - 1, f"on {where}: room for {name} differs once restored")
        if not group.acquired:
            return
        live = copy.deepcopy(state)
        earliest = min(h.deadline_ms for h in group.acquired.values())
        for probe in (live, fresh):
            probe.apply(Expire(QUEUE_GROUP, earliest))
        if live.snapshot() != fresh.snapshot():
            oracle.fail(
                oracle.end - 1,
                f"on {where}: Expire at {earliest} ms acts differently on the replica's state "
                f"and on the same state restored from its snapshot",
            )

    def _fingerprint(self, node: SimNode, group: str, applier: ObservedApplier) -> None:
        """State-machine safety for the queue: equal applied prefixes, equal states."""
        end = applier.state.end_index
        if end == applier.hashed_end:
            return
        applier.hashed_end = end
        digest = int(xxhash.xxh3_64_intdigest(applier.state.snapshot()))
        known = self.fingerprints[group].setdefault(end, (digest, node.id))
        if known[0] != digest:
            self._fail(
                f"queue state-machine safety: {node.id} and {known[1]} applied {group} through "
                f"{end - 1} into different queue states"
            )

    # ---- answers to requests ---------------------------------------------------------------

    def _answer(self, node: SimNode, group: str, applied: list[Applied]) -> None:
        waiting = self.requests.get(node.id, {}).get(group)
        if not waiting:
            return
        for done in applied:
            request = waiting.pop(done.index, None)
            if request is None or request.command != done.command or not request.consumer:
                continue
            consumer = self._consumer(group, request.consumer)
            if consumer.incarnation != request.incarnation:
                continue
            if self.rng.random() < ANSWER_LOSS_RATE:
                self._count("lost_answers")
                continue
            consumer.waiting_until_ms = -1
            command, result = done.command, done.result
            if isinstance(command, Acquire):
                for granted in result.granted:
                    consumer.holds[granted.index] = granted.deadline_ms
            elif isinstance(command, Renew):
                for index in result.done:
                    consumer.holds[index] = command.now_ms + command.lease_ms
                for index in result.refused:
                    consumer.holds.pop(index, None)
            else:
                for index in (*result.done, *result.refused):
                    consumer.holds.pop(index, None)

    def _forget_answered(self, node: SimNode, group: str, applier: ObservedApplier) -> None:
        """Requests at or below the applied index were answered or lost to another entry."""
        waiting = self.requests.get(node.id, {}).get(group)
        if waiting:
            for index in [i for i in waiting if i <= applier.applied_index]:
                del waiting[index]

    def _consumer(self, group: str, name: str) -> Consumer:
        return self.consumers[group][int(name[1:])]

    # ---- proposing -------------------------------------------------------------------------

    def _submit(
        self, node: SimNode, raft: Raft, command: QueueCommand, consumer: Consumer | None = None
    ) -> bool:
        batch = encode_batch(
            [Record(key=QUEUE_KEY, value=encode_command(command))],
            control=True,
            now_ms=self.clock_ms(node),
        )
        try:
            index = raft.propose(batch, 1)
        except ProposalDropped:
            return False
        group = raft.group
        self.proposals[group][index] = (raft.term, _hash(batch), node.id)
        name, incarnation = (consumer.name, consumer.incarnation) if consumer else ("", 0)
        self.requests[node.id][group][index] = Request(name, incarnation, raft.term, command)
        self._count("requests")
        self._log(f"{node.id} {group} proposes {command} at {index}")
        self._process(node)
        return True

    def _in_flight(self, node: SimNode, raft: Raft) -> list[QueueCommand]:
        """Commands this leader proposed in its current term and has not applied yet."""
        waiting = self.requests.get(node.id, {}).get(raft.group, {})
        return [r.command for _, r in sorted(waiting.items()) if r.term == raft.term]

    def _leaders(self, group: str) -> list[tuple[SimNode, Raft]]:
        """Every live node that believes it leads `group` (a stale one too)."""
        found = []
        for node in self._alive():
            assert node.multi is not None
            raft = node.multi.groups.get(group)
            if raft is not None and raft.role is Role.LEADER:
                found.append((node, raft))
        return found

    # ---- the leader's duties ---------------------------------------------------------------

    def _control(self, node: SimNode) -> None:
        assert node.multi is not None
        for group, raft in sorted(node.multi.groups.items()):
            if node.multi is None:
                return  # crashed while persisting a proposal
            if raft.role is Role.LEADER and group in self.oracles and not self.quiet:
                self._lead(node, raft)

    def _lead(self, node: SimNode, raft: Raft) -> None:
        """Switch max_deliveries, expire due leases, drain dead letters."""
        state = self.appliers[node.id][raft.group].state
        in_flight = self._in_flight(node, raft)
        commands: list[QueueCommand] = []
        if state.config.max_deliveries != MAX_DELIVERIES and not any(
            isinstance(c, Configure) for c in in_flight
        ):
            commands.append(Configure(MAX_DELIVERIES))
        group = state.groups.get(QUEUE_GROUP)
        now = self.clock_ms(node)  # the leader's clock
        if group is not None:
            due = any(h.deadline_ms <= now for h in group.acquired.values())
            if due and not any(isinstance(c, Expire) for c in in_flight):
                commands.append(Expire(QUEUE_GROUP, now))
            confirming = {i for c in in_flight if isinstance(c, DeadLettered) for i in c.indexes}
            appended: list[tuple[int, int]] = []
            for index, dead in sorted(group.dead_pending.items(), key=lambda d: d[1].sequence):
                if index in confirming:
                    continue
                if self.rng.random() < DLQ_FAILURE_RATE:
                    self._count("dlq_failures")
                    break  # in sequence order: retry from here next tick
                self._dlq_append(raft.group, group.incarnation, index, dead)
                appended.append((index, dead.sequence))
            if appended:
                appended.sort()
                indexes = tuple(i for i, _ in appended)
                sequences = tuple(q for _, q in appended)
                commands.append(DeadLettered(QUEUE_GROUP, indexes, sequences, group.incarnation))
        for command in commands:
            if node.multi is None or raft.role is not Role.LEADER:
                return
            self._submit(node, raft, command)

    def _dlq_append(self, partition: str, incarnation: int, index: int, dead: DeadLetter) -> None:
        """The idempotent dead-letter producer (one per incarnation of the group, as the
        broker's): one entry per sequence number."""
        key = (QUEUE_GROUP, incarnation, partition, dead.sequence)
        known = self.dlq.get(key)
        if known is None:
            self.dlq[key] = index
            self._count("dlq_appends")
        elif known == index:
            self._count("dlq_duplicate_appends")  # a new leader repeating an append: absorbed
        else:
            self._fail(
                f"dead-letter sequence {dead.sequence} of {partition} names both {known} and "
                f"{index}: the idempotent producer would drop one"
            )

    # ---- consumers -------------------------------------------------------------------------

    def _consumers_act(self, *, faulty: bool) -> None:
        for group in self.group_names:
            for consumer in self.consumers[group]:
                self._consumer_act(group, consumer, faulty=faulty)

    def _consumer_act(self, group: str, consumer: Consumer, *, faulty: bool) -> None:
        rng = self.rng
        if consumer.down_until_ms > self.now_ms:
            return
        if faulty and rng.random() < CONSUMER_CRASH_RATE:
            self._log(f"consumer {group}/{consumer.name} crashes holding {sorted(consumer.holds)}")
            self._count("consumer_crashes")
            consumer.holds.clear()
            consumer.incarnation += 1
            consumer.waiting_until_ms = -1
            consumer.down_until_ms = self.now_ms + TICK_MS * rng.randint(5, 30)
            return
        if consumer.waiting_until_ms > self.now_ms or rng.random() >= ACT_RATE:
            return
        leaders = self._leaders(group)
        if not leaders:
            return
        node, raft = rng.choice(leaders)
        held = sorted(consumer.holds)
        command: QueueCommand | None = None
        if held:
            some = tuple(sorted(rng.sample(held, rng.randint(1, len(held)))))
            roll = rng.random() if faulty else 0.0
            now = self.clock_ms(node)  # the leader stamps its own clock on the command
            if not faulty:
                command = Accept(QUEUE_GROUP, consumer.name, tuple(held), now)
            elif roll < 0.5:
                command = Accept(QUEUE_GROUP, consumer.name, some, now)
            elif roll < 0.6:
                command = Release(QUEUE_GROUP, consumer.name, some, now)
            elif roll < 0.67:
                command = Reject(QUEUE_GROUP, consumer.name, some, "poison", now)
            elif roll < 0.77:
                command = Renew(QUEUE_GROUP, consumer.name, some, self._lease(), now)
        if command is None:
            if len(held) >= MAX_HELD:
                return
            command = self._choose(node, raft, consumer, rng.randint(1, 3))
            if command is None:
                return
        if self._submit(node, raft, command, consumer):
            consumer.waiting_until_ms = self.now_ms + REQUEST_TIMEOUT_MS

    def _lease(self) -> int:
        return self.rng.randint(*LEASE_MS)

    def _on_records_proposed(self, node: SimNode, raft: Raft) -> None:
        """As the broker's `ConsumerGroups._serve_parked`: an idle consumer long-polling this
        leader has its Acquire of the new records proposed now, behind them in the same
        Ready (so that both commit, or are lost, together)."""
        if self.quiet or self.rng.random() >= HAND_OFF_RATE:
            return
        group = raft.group
        idle = [
            consumer
            for consumer in self.consumers[group]
            if consumer.down_until_ms <= self.now_ms
            and consumer.waiting_until_ms <= self.now_ms
            and len(consumer.holds) < MAX_HELD
        ]
        if not idle:
            return
        consumer = self.rng.choice(idle)
        command = self._choose(node, raft, consumer, self.rng.randint(1, 3))
        if command is None:
            return
        # _submit persists the Ready: the records' and the Acquire's entries go in it together
        if self._submit(node, raft, command, consumer):
            self._count("handed_off_acquires")
            consumer.waiting_until_ms = self.now_ms + REQUEST_TIMEOUT_MS

    def _choose(self, node: SimNode, raft: Raft, consumer: Consumer, n: int) -> Acquire | None:
        """The leader's pick: available in its applied state, then proposed and not applied yet
        (laminar.queue.pending), not in its pending Acquires."""
        state = self.appliers[node.id][raft.group].state
        in_flight = self._in_flight(node, raft)
        taken = {i for c in in_flight if isinstance(c, Acquire) for i in c.indexes}
        n = min(n, state.room(QUEUE_GROUP, consumer.name))
        if n <= 0:
            return None
        now = self.clock_ms(node)  # the leader's clock
        free = state.available(QUEUE_GROUP, n + len(taken), now)
        indexes = [i for i in free if i not in taken][:n]
        if len(indexes) < n:  # pipelined, as the broker's leader: proposed, not applied yet
            ahead = pending_records(raft.log, state.end_index, n - len(indexes) + len(taken))
            pipelined = [i for i, _ in ahead if i not in taken][: n - len(indexes)]
            if pipelined:
                self._count("pipelined_acquires")
            indexes += pipelined
        if not indexes:
            return None
        return Acquire(QUEUE_GROUP, consumer.name, tuple(indexes), self._lease(), now)

    # ---- the run ---------------------------------------------------------------------------

    def _tick(self, *, faulty: bool) -> None:
        super()._tick(faulty=faulty)
        if not self.quiet:
            self._consumers_act(faulty=faulty)
            if faulty and self.rng.random() < ADMIN_RATE:
                self._admin_acts()

    def _admin_acts(self) -> None:
        """An admin resets one partition's group (to the earliest, the latest or an index;
        forced or not) or deletes it, through a node that believes it leads, which plans the
        reset from its own log and state as the broker does."""
        rng = self.rng
        group = rng.choice(self.group_names)
        leaders = self._leaders(group)
        if not leaders:
            return
        node, raft = rng.choice(leaders)
        state = self.appliers[node.id][group].state
        now, force = self.clock_ms(node), rng.random() < 0.5
        command: QueueCommand
        if rng.random() < 0.25:
            command = DeleteGroup(QUEUE_GROUP, now, force)
        else:
            roll = rng.random()
            if roll < 0.3:
                target = 0  # the earliest: the log start
            elif roll < 0.5:
                target = state.end_index  # the latest
            else:
                target = rng.randint(0, state.end_index)
            log = node.storages[group].log
            command = plan_reset(state, log, QUEUE_GROUP, target, now, force=force)
            if command.ranges and command.cursor < state.known_from:
                self._count("rewinds_below_forgotten_ranges")
        self._log(f"admin: {command} through {node.id}")
        self._submit(node, raft, command)

    def _drained(self) -> bool:
        """Every partition's leader has applied its whole log, and its group has finished
        every message."""
        for group in self.group_names:
            found = self._leader_of(group)
            if found is None:
                return False
            node, raft = found
            applier = self.appliers[node.id][group]
            if not raft.log.committed == raft.log.last_index() == applier.applied_index:
                return False
            state = applier.state
            queue = state.groups.get(QUEUE_GROUP)
            if queue is None:  # (never made, or deleted: a consumer makes it again if need be)
                if state.available(QUEUE_GROUP, 1, self.clock_ms(node)):
                    return False
                continue
            if queue.cursor != state.end_index or queue.acquired or queue.dead_pending:
                return False
        return True

    def _check_outcome(self) -> None:
        """Every committed message was accepted exactly once or dead-lettered exactly once."""
        for group in self.group_names:
            oracle = self.oracles[group]
            # the dead letters of the last generation: its incarnation, from its first sequence
            landed: Counter[int] = Counter(
                index
                for (_, incarnation, partition, sequence), index in self.dlq.items()
                if partition == group
                and incarnation == oracle.incarnation
                and sequence >= oracle.first_sequence
            )
            found = self._leader_of(group)
            assert found is not None
            state = self.appliers[found[0].id][group].state
            if oracle.end != state.end_index:
                self._fail(f"{group}: the oracle ends at {oracle.end}, leader at {state.end_index}")
            for index in sorted(i for i in oracle.records if i >= oracle.floor):
                accepted = oracle.accepted.get(index, 0)
                dead = landed[index]
                confirmed = oracle.dead_confirmed.get(index, 0)
                if (accepted, dead, confirmed) not in ((1, 0, 0), (0, 1, 1)):
                    self._fail(
                        f"{group} message {index}: accepted {accepted} times, in the dead-letter "
                        f"topic {dead} times (confirmed {confirmed} times)"
                    )
            every = {i for (_, _, p, _), i in self.dlq.items() if p == group}
            strays = sorted(every - oracle.records)
            if strays:
                self._fail(f"{group}: dead letters {strays} are not messages")
            queue = state.groups.get(QUEUE_GROUP)
            if queue is None:
                continue
            if (
                queue.cursor != state.end_index
                or queue.acquired
                or queue.dead_pending
                or queue.done
            ):
                self._fail(f"{group} not drained: {state.describe(QUEUE_GROUP)}")

    def _check_acked_everywhere(self) -> None:
        if not self.quiet:
            return  # the consumers are still busy: checked once they are done
        super()._check_acked_everywhere()

    def run(self) -> dict[str, int]:
        stats = super().run()
        try:
            progress: tuple[object, ...] = ()
            still = 0
            for _ in range(DRAIN_TICKS):
                if self._drained():
                    break
                self._tick(faulty=False)
                now = self._progress()
                still = still + 1 if now == progress else 0
                progress = now
                if still >= STALL_TICKS:
                    self._fail(f"the queues stopped draining: {self._describe_leaders()}")
            else:
                self._fail(f"the queues did not drain: {self._describe_leaders()}")
            self._check_outcome()
            self.quiet = True  # no more requests: let every commit reach everyone
            self._log("queues drained; quiet")
            for _ in range(QUIET_TICKS):
                self._tick(faulty=False)
            self._check_acked_everywhere()
        except InvariantViolation as e:
            raise InvariantViolation(self.report(str(e))) from None
        except Exception as e:
            raise InvariantViolation(self.report(f"{type(e).__name__}: {e}")) from e
        outcome = repr(
            (
                stats.get("digest"),
                sorted(self.dlq.items()),
                [sorted(self.oracles[g].accepted) for g in self.group_names],
            )
        )
        self.stats["digest"] = int(xxhash.xxh32_intdigest(outcome.encode()))
        return dict(self.stats)

    def _describe_leaders(self) -> dict[str, dict[str, int] | None]:
        described: dict[str, dict[str, int] | None] = {}
        for group in self.group_names:
            found = self._leader_of(group)
            state = self.appliers[found[0].id][group].state if found else None
            described[group] = state.describe(QUEUE_GROUP) if state else None
        return described

    def _progress(self) -> tuple[object, ...]:
        """What changes while the queues drain: the applied log and the groups' counts."""
        return (
            tuple(self.oracles[g].end for g in self.group_names),
            tuple(sorted(self._describe_leaders().items(), key=lambda item: item[0])),
        )


def run_queue_seed(seed: int, config: SimConfig = SCENARIO) -> dict[str, int]:
    return QueueSimulation(seed, config).run()
