"""The node simulator's transactional workload (docs/transactions.md), under its full fault mix.

Transactional producers act as the HTTP API's handlers do, on the simulated brokers' cores:
InitTxn, AddTxnPartitions and EndTxn are proposed through the metadata group
(`NodeCore.propose_metadata`); transactional batches (TRANSACTIONAL_ATTRIBUTE, the
coordinator's producer id, a sequence per partition and epoch, retried until acknowledged)
go through the partition leader's `Replica.propose`, once the leader's own metadata lets
them (`Coordinator.may_write`, the check `check_transactional` makes). The coordinator's
driver is `laminar.txn.driver.decide`, run on the metadata leader's core every tick: its
timeout aborts are proposed through the metadata group, its markers through the partition
leaders' `Replica.propose`, then its CompleteTxn.

* two producers (`tx-a`, `tx-b`) each write 1 or 2 batches to each of 2 or 3 of the
  partitions 0..3 of the topic, then commit or abort at random;
* a consume → produce producer (`cp`) acquires up to three messages of partition 5 for the
  consumer group `cp`, writes one output record for each to partition 4 in its transaction,
  accepts the messages in the same transaction (`Accept.txn_producer_id`), then commits
  (or sometimes aborts: the messages come back and are consumed again);
* a zombie: `tx-a` is restarted (InitTxn of the id again) while its instance has a
  transaction open; once the new instance's init is applied, the old one goes on writing
  (half the time past the leader's check, as a leader with stale metadata would let it) and
  then asks to commit.

Invariants, checked on the partition leaders after settling (their reads are the HTTP
read path's: `Replica.read` with and without `committed`), each a `_fail` of the simulation:

* every transaction has ended: none ONGOING or PREPARE in the metadata, none open on a
  partition;
* atomicity: a transaction's batches in the logs of all its partitions are all visible to
  `read_committed`, or none is; one whose commit was acknowledged is visible, with every
  batch acknowledged to it;
* no aborted record is returned: every batch `read_committed` returns has its producer's
  COMMIT marker in that partition, and no transaction the producer saw abort (or refused)
  is visible;
* a fenced zombie never commits: its commit is refused, and none of its batches is visible;
* consume → produce exactly once: each message of partition 5 the group finished has
  exactly one visible output record, and every other has none.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..log.batch import Record, decode_batch, encode_batch, parse_header, split_batches
from ..log.errors import CorruptBatchError
from ..metadata import Command, MetadataError
from ..node.core import NodeCore
from ..partition.errors import NotLeader, Overloaded, ReplicaClosed
from ..partition.replica import Replica
from ..queue import Accept, Acquire, QueueError, Result
from ..txn.coordinator import ENDING, AddTxnPartitions, EndTxn, InitTxn, Phase
from ..txn.driver import Abort, Action, ActionKey, Forget, decide
from ..txn.markers import decode_marker
from ..txn.producer import TxnProducer

if TYPE_CHECKING:
    from .node_cluster import NodeSimulation

#: partitions the plain transactions write to; the consume → produce output and input
TXN_PARTITIONS = (0, 1, 2, 3)
CP_OUTPUT = 4
CP_INPUT = 5
#: the consumer group (and its consumer) of consume → produce
CP_GROUP = "cp"
CP_CONSUMER = "cp-0"
CP_LEASE_MS = 3_000
#: a transaction open longer than this is aborted by the driver
TIMEOUT_MS = 2_000
#: a metadata command, batch or queue command not answered within this many ticks is sent again
RETRY_TICKS = 30
#: How often the driver looks for idle ids to forget (none expire within a run: it runs all
#: the same, as the broker's does).
IDLE_CHECK_TICKS = 100
#: a transaction whose writes are refused this long is aborted by its producer
GIVE_UP_TICKS = 150
#: per tick, the chance an idle producer starts a transaction; a plain one commits
START_RATE = 0.012
COMMIT_RATE = 0.7
CP_COMMIT_RATE = 0.85
#: when `tx-a` is restarted, leaving a zombie (or as soon after as it has written)
ZOMBIE_TICKS = (300, 650)


@dataclass(slots=True)
class Request:
    """A metadata command in flight, answered by `on_answer(result, core)`."""

    command: Command
    index: int
    term: int
    tick: int
    on_answer: Callable[[MetadataError | None, NodeCore], None]


@dataclass(slots=True)
class InFlight:
    """A batch or queue command proposed to a partition leader."""

    future: asyncio.Future[int] | asyncio.Future[Result]
    tick: int


@dataclass(slots=True)
class Txn:
    """One transaction of one producer epoch, as its producer saw it."""

    txn_id: str
    producer: TxnProducer
    #: (partition, records) still to write, in order
    to_write: list[tuple[int, list[Record]]]
    partitions: tuple[int, ...]
    zombie: bool = False
    #: cp: the input indexes it holds (accepted in the transaction once written)
    inputs: tuple[int, ...] = ()
    sequences: dict[int, int] = field(default_factory=dict)
    acked: set[tuple[int, int]] = field(default_factory=set)  # (partition, base index)
    #: open; committed or aborted (as answered); refused (the end refused: it did not commit)
    outcome: str = "open"


@dataclass(slots=True)
class Instance:
    """A transactional producer instance (a restarted id leaves its old instance a zombie)."""

    txn_id: str
    cp: bool = False
    producer: TxnProducer | None = None
    step: str = "init"  # init, idle, acquire, add, write, accept, end, retired
    txn: Txn | None = None
    request: Request | None = None
    sent: InFlight | None = None
    #: the batch in flight (resent as it is: same sequence)
    batch: bytes | None = None
    commit: bool = False
    since_tick: int = 0  # when the current step began
    next_tick: int = 0  # do nothing before
    zombie: bool = False
    fenced: bool = False  # a zombie whose successor's init applied


@dataclass(slots=True)
class Driving:
    """A driver action under way on the metadata leader."""

    action: Action
    tick: int
    markers: dict[int, InFlight] = field(default_factory=dict)  # partition -> marker
    marked: set[int] = field(default_factory=set)
    request: Request | None = None
    done: bool = False


class TxnWorkload:
    def __init__(self, sim: NodeSimulation, topic: str) -> None:
        self.sim = sim
        self.topic = topic
        self.rng = random.Random(sim.rng.getrandbits(64))
        self.instances = [Instance("tx-a"), Instance("tx-b"), Instance("cp", cp=True)]
        self.txns: list[Txn] = []
        self.requests: dict[tuple[int, int], Request] = {}
        self.driver_node: str | None = None
        self.driving: dict[ActionKey, Driving] = {}
        self.zombies_made = 0
        sim.stats.update(
            txn_committed=0,
            txn_aborted=0,
            txn_refused=0,
            txn_timeouts=0,
            txn_markers=0,
            txn_writes_refused=0,
            zombies_fenced=0,
            zombie_writes=0,
            cp_inputs_accepted=0,
        )

    # ---- the simulation's hooks ------------------------------------------------------------

    def tick(self) -> None:
        """Once a tick, after message delivery: the driver, then every producer."""
        if not self.sim.group_names:
            return  # the topic does not exist yet
        self._drive()
        ticks = self.sim.ticks
        made = self.zombies_made
        if self.sim.faulty and made < len(ZOMBIE_TICKS) and ticks >= ZOMBIE_TICKS[made]:
            self._make_zombie()
        for instance in list(self.instances):
            if ticks >= instance.next_tick:
                self._act(instance)
        self.instances = [i for i in self.instances if i.step != "retired"]

    def on_answers(
        self, core: NodeCore, answers: list[tuple[int, int, MetadataError | None]]
    ) -> None:
        """A round's metadata answers (`Round.answers`) on `core`."""
        for index, term, result in answers:
            request = self.requests.pop((index, term), None)
            if request is not None:
                request.on_answer(result, core)

    # ---- talking to the cores --------------------------------------------------------------

    def _meta(
        self, command: Command, on_answer: Callable[[MetadataError | None, NodeCore], None]
    ) -> Request | None:
        found = self.sim._metadata_leader()
        if found is None:
            return None
        node, core = found
        try:
            index, term = core.propose_metadata(command)
        except (NotLeader, ReplicaClosed, MetadataError):
            return None
        request = Request(command, index, term, self.sim.ticks, on_answer)
        self.requests[(index, term)] = request
        self.sim._log(f"{node.id} proposes {command!r} at {index}")
        self.sim._process(node)
        return request

    def _expired(self, request: Request | None) -> bool:
        """No answer came in time: forget it (it may still apply)."""
        if request is None or self.sim.ticks - request.tick < RETRY_TICKS:
            return False
        self.requests.pop((request.index, request.term), None)
        return True

    def _leader(self, partition: int) -> tuple[NodeCore, Replica] | None:
        group = f"{self.topic}/{partition}"
        found = self.sim._leader_of(group)
        core = self.sim._core(found[0]) if found is not None else None
        replica = core.replicas.get(group) if core is not None else None
        if core is None or replica is None or not replica.is_leader:
            return None
        return core, replica

    def _now_ms(self, core: NodeCore) -> int:
        """The wall clock of `core`'s node (as the API handlers read it)."""
        return self.sim.clock_ms(self.sim.nodes[core.id])

    def _propose_batch(self, partition: int, batch: bytes) -> InFlight | None:
        found = self.sim.propose_batch(f"{self.topic}/{partition}", batch)
        return None if found is None else InFlight(found, self.sim.ticks)

    def _propose_queue(self, replica: Replica, command: Acquire | Accept) -> InFlight | None:
        groups = replica.groups
        assert groups is not None

        async def propose() -> asyncio.Future[Result]:
            return groups.propose(command)

        try:
            future = self.sim.loop.run_until_complete(propose())
        except (NotLeader, ReplicaClosed, Overloaded, QueueError):
            return None
        node = self.sim.nodes[replica.node_id]
        self.sim._process(node)
        return InFlight(future, self.sim.ticks)

    # ---- the driver ------------------------------------------------------------------------

    def _drive(self) -> None:
        """`decide` on the metadata leader's core, and carry out what is under way (a new
        leader's driver starts afresh, as the broker's does)."""
        found = self.sim._metadata_leader()
        if found is None:
            return
        node, core = found
        if node.id != self.driver_node:
            self.driver_node = node.id
            self.driving.clear()
        idle = self.sim.ticks % IDLE_CHECK_TICKS == 0  # (the broker: every 10 s)
        for action in decide(core.state.txns, self.sim.clock_ms(node), self.driving, idle=idle):
            self.driving[action.key] = Driving(action, self.sim.ticks)
        for key, driving in list(self.driving.items()):
            self._carry_out(driving)
            if driving.done or self.sim.ticks - driving.tick > 4 * RETRY_TICKS:
                del self.driving[key]

    def _carry_out(self, driving: Driving) -> None:
        action = driving.action

        def answered(result: MetadataError | None, _: NodeCore) -> None:
            driving.done = True
            if isinstance(action, Abort) and result is None:
                self.sim.stats["txn_timeouts"] += 1

        if driving.request is not None:
            if self._expired(driving.request):
                driving.request = None
            return
        if isinstance(action, Abort | Forget):
            driving.request = self._meta(action.command(), answered)
            return
        for topic, partition in action.partitions:
            if topic != self.topic or partition in driving.marked:
                continue
            sent = driving.markers.get(partition)
            if sent is not None and sent.future.done():
                if sent.future.exception() is None:
                    driving.marked.add(partition)
                    self.sim.stats["txn_markers"] += 1
                    continue
                sent = None
            if sent is None or self.sim.ticks - sent.tick >= RETRY_TICKS:
                again = self._propose_batch(partition, action.marker())
                if again is not None:
                    driving.markers[partition] = again
        if len(driving.marked) == len(action.partitions):
            driving.request = self._meta(action.complete(), answered)

    # ---- the producers ---------------------------------------------------------------------

    def _step(self, instance: Instance, step: str, *, wait_ticks: int = 0) -> None:
        instance.step = step
        instance.since_tick = self.sim.ticks
        instance.next_tick = self.sim.ticks + wait_ticks
        instance.request = instance.sent = None
        instance.batch = None

    def _act(self, instance: Instance) -> None:
        if instance.zombie and not instance.fenced:
            return  # (it acts once its successor's init applied)
        if instance.request is not None:
            if self._expired(instance.request):
                instance.request = None
            else:
                return
        act = {
            "init": self._init,
            "idle": self._idle,
            "acquire": self._acquire,
            "add": self._add,
            "write": self._write,
            "accept": self._accept,
            "end": self._end,
        }.get(instance.step)
        if act is not None:
            act(instance)

    def _init(self, instance: Instance) -> None:
        def answered(result: MetadataError | None, core: NodeCore) -> None:
            for old in self.instances:
                if old.zombie and old.txn_id == instance.txn_id and not old.fenced:
                    old.fenced = True  # its transaction is no longer ONGOING
                    old.since_tick = self.sim.ticks
            record = core.state.txns.records.get(instance.txn_id)
            if result is None and record is not None and record.init_index == index[0]:
                instance.producer = record.producer
                self._step(instance, "idle")
            else:  # busy: what the old instance left open is being aborted
                self._step(instance, "init", wait_ticks=5)

        index: list[int] = []  # (the request's, known once proposed)
        instance.request = self._meta(InitTxn(instance.txn_id, TIMEOUT_MS), answered)
        if instance.request is not None:
            index.append(instance.request.index)

    def _idle(self, instance: Instance) -> None:
        if not self.sim.faulty or self.rng.random() >= START_RATE:
            return  # (no new transactions while settling)
        if instance.cp:
            self._step(instance, "acquire")
            return
        producer = instance.producer
        assert producer is not None
        partitions = tuple(sorted(self.rng.sample(TXN_PARTITIONS, self.rng.randint(2, 3))))
        to_write = []
        for partition in partitions:
            for _ in range(self.rng.randint(1, 2)):
                values = [f"{instance.txn_id}:{producer.epoch}:{partition}:{i}" for i in range(2)]
                to_write.append((partition, [Record(value=v.encode()) for v in values]))
        self.rng.shuffle(to_write)
        self._start(instance, Txn(instance.txn_id, producer, to_write, partitions))

    def _start(self, instance: Instance, txn: Txn) -> None:
        instance.txn = txn
        self.txns.append(txn)
        self._step(instance, "add")

    def _acquire(self, instance: Instance) -> None:
        if instance.sent is None:
            found = self._leader(CP_INPUT)
            groups = found[1].groups if found is not None else None
            if found is None or groups is None:
                return
            now = self._now_ms(found[0])
            indexes = tuple(groups.state.available(CP_GROUP, 3, now))
            if not indexes:
                return
            command = Acquire(CP_GROUP, CP_CONSUMER, indexes, CP_LEASE_MS, now)
            instance.sent = self._propose_queue(found[1], command)
            return
        future = instance.sent.future
        if not future.done():
            if self.sim.ticks - instance.sent.tick >= RETRY_TICKS:
                self._step(instance, "idle")  # (a lease it got ends)
            return
        result = future.result() if future.exception() is None else None
        granted = tuple(g.index for g in result.granted) if isinstance(result, Result) else ()
        if not granted:
            self._step(instance, "idle")
            return
        producer = instance.producer
        assert producer is not None
        records = [Record(value=f"cp:{index}".encode()) for index in granted]
        txn = Txn(
            instance.txn_id, producer, [(CP_OUTPUT, records)], (CP_OUTPUT, CP_INPUT), inputs=granted
        )
        self._start(instance, txn)

    def _add(self, instance: Instance) -> None:
        txn = instance.txn
        assert txn is not None
        if self.sim.ticks - instance.since_tick > GIVE_UP_TICKS:
            self._ended(instance, "refused")  # (never started: nothing written)
            return

        def answered(result: MetadataError | None, _: NodeCore) -> None:
            if result is None:
                self._step(instance, "write")
            elif result.code == "busy":  # the last transaction is still being completed
                instance.request = None
                instance.next_tick = self.sim.ticks + 5
            else:
                self._ended(instance, "refused")

        found = self.sim._metadata_leader()
        if found is None:
            return
        parts = tuple((self.topic, p) for p in txn.partitions)
        now = self._now_ms(found[1])
        command = AddTxnPartitions(txn.txn_id, *txn.producer, parts, now)
        instance.request = self._meta(command, answered)

    def _write(self, instance: Instance) -> None:
        txn = instance.txn
        assert txn is not None
        if instance.sent is not None and instance.sent.future.done():
            future = instance.sent.future
            if future.exception() is None:
                partition, _ = txn.to_write.pop(0)
                base = future.result()
                assert isinstance(base, int)
                txn.acked.add((partition, base))
                instance.batch = instance.sent = None
                instance.since_tick = self.sim.ticks
        if not txn.to_write:
            if instance.zombie:
                instance.commit = True
                self._step(instance, "end")
            elif instance.cp:
                self._step(instance, "accept")
            else:
                instance.commit = self.rng.random() < COMMIT_RATE
                self._step(instance, "end")
            return
        if instance.sent is not None and self.sim.ticks - instance.sent.tick < RETRY_TICKS:
            return
        if self.sim.ticks - instance.since_tick > GIVE_UP_TICKS:
            instance.commit = instance.zombie  # (a zombie asks to commit all the same)
            self._step(instance, "end")
            return
        partition, records = txn.to_write[0]
        if instance.batch is None:
            sequence = txn.sequences.get(partition, 0)
            txn.sequences[partition] = sequence + len(records)
            instance.batch = encode_batch(
                records,
                producer_id=txn.producer.producer_id,
                producer_seq=sequence,
                now_ms=0,
                transactional=True,
            )
        found = self._leader(partition)
        if found is None:
            return
        bypass = instance.zombie and self.rng.random() < 0.5  # a leader's stale metadata
        allowed = found[0].state.txns.may_write(txn.producer, self.topic, partition)
        if allowed is None and not bypass:
            self.sim.stats["txn_writes_refused"] += 1
            if instance.zombie:  # refused, as it is fenced: on to the rest
                txn.to_write.pop(0)
                instance.batch = None
            return
        instance.sent = self._propose_batch(partition, instance.batch)
        if instance.zombie and instance.sent is not None:
            self.sim.stats["zombie_writes"] += 1

    def _accept(self, instance: Instance) -> None:
        txn = instance.txn
        assert txn is not None
        sent = instance.sent
        if sent is not None and sent.future.done():
            result = sent.future.result() if sent.future.exception() is None else None
            if isinstance(result, Result):
                instance.commit = set(txn.inputs) <= set(result.done)
                if instance.commit:
                    instance.commit = self.rng.random() < CP_COMMIT_RATE
                self._step(instance, "end")
                return
            instance.sent = sent = None
        if sent is not None and self.sim.ticks - sent.tick < RETRY_TICKS:
            return
        if self.sim.ticks - instance.since_tick > GIVE_UP_TICKS:
            instance.commit = False
            self._step(instance, "end")
            return
        found = self._leader(CP_INPUT)
        if found is None:
            return
        core, replica = found
        if core.state.txns.may_write(txn.producer, self.topic, CP_INPUT) is None:
            self.sim.stats["txn_writes_refused"] += 1
            return
        pid = txn.producer.producer_id
        command = Accept(CP_GROUP, CP_CONSUMER, txn.inputs, self._now_ms(core), pid)
        instance.sent = self._propose_queue(replica, command)

    def _end(self, instance: Instance) -> None:
        txn = instance.txn
        assert txn is not None
        commit = instance.commit

        def answered(result: MetadataError | None, _: NodeCore) -> None:
            if instance.zombie:
                if result is None and commit:
                    self.sim._fail(f"{txn.txn_id}: the fenced zombie {txn.producer} committed")
                self.sim.stats["zombies_fenced"] += 1
                txn.outcome = "refused"
                self._step(instance, "retired")
                return
            if result is None:
                self._ended(instance, "committed" if commit else "aborted")
            else:
                self._ended(instance, "refused")

        command = EndTxn(txn.txn_id, *txn.producer, commit)
        instance.request = self._meta(command, answered)

    def _ended(self, instance: Instance, outcome: str) -> None:
        """The transaction ended as `outcome`; the next one writes with the next epoch (after a
        refusal, the producer starts again: a new epoch of its own)."""
        txn = instance.txn
        assert txn is not None and instance.producer is not None
        txn.outcome = outcome
        self.sim.stats[f"txn_{outcome}"] += 1
        if outcome == "committed" and txn.inputs:
            self.sim.stats["cp_inputs_accepted"] += len(txn.inputs)
        instance.txn = None
        if outcome == "refused":
            self._step(instance, "init")
        else:
            instance.producer = instance.producer._replace(epoch=instance.producer.epoch + 1)
            self._step(instance, "idle")

    def _make_zombie(self) -> None:
        """Restart `tx-a` while it has a transaction open (once it has written)."""
        current = next(i for i in self.instances if i.txn_id == "tx-a" and not i.zombie)
        txn = current.txn
        if current.step != "write" or txn is None or not txn.acked:
            return
        current.zombie = True
        txn.zombie = True
        self.zombies_made += 1
        self.sim._log(f"tx-a restarts: {txn.producer} becomes a zombie")
        self.instances.append(Instance("tx-a"))

    # ---- invariants ------------------------------------------------------------------------

    def check(self) -> None:
        """After settling: every transaction ended, atomic, none aborted visible, no zombie
        committed, consume → produce exactly once."""
        sim = self.sim
        meta = sim._metadata_leader()
        if meta is None:
            return  # (the simulation's own checks fail this)
        for txn_record in meta[1].state.txns.records.values():
            if txn_record.phase is Phase.ONGOING or txn_record.phase in ENDING:
                sim._fail(f"{txn_record.txn_id}: still {txn_record.phase.value} after settling")
        written: dict[int, set[tuple[int, int]]] = {}  # producer id -> (partition, base)
        visible: dict[int, set[tuple[int, int]]] = {}
        commits: set[tuple[int, int, int]] = set()  # (partition, number, marker epoch)
        outputs: Counter[int] = Counter()
        inputs: set[int] = set()  # the input partition's record indexes
        for partition in (*TXN_PARTITIONS, CP_OUTPUT, CP_INPUT):
            found = self._readable(partition)
            if found is None:
                sim._fail(f"{self.topic}/{partition}: no replica reads whole after settling")
                return
            replica, every, returned = found
            txns = replica.groups.state.txns if replica.groups is not None else None
            if txns is None or txns.open_count:
                sim._fail(f"{replica.group}: transactions still open after settling")
            if replica.log_start > 0:
                sim._fail(f"{replica.group}: its log starts at {replica.log_start}")
            for batch in every:
                header = parse_header(batch)
                if header.is_control and header.producer_id:
                    marker = TxnProducer.of(header.producer_id)
                    if decode_marker(batch, header.producer_id):
                        commits.add((partition, *marker))
                elif partition == CP_INPUT and not header.is_control:
                    inputs.update(range(header.base_index, header.base_index + header.record_count))
                elif header.is_transactional:
                    at = (partition, header.base_index)
                    written.setdefault(header.producer_id, set()).add(at)
            for batch in returned:
                header = parse_header(batch)
                if not header.is_transactional:
                    continue
                visible.setdefault(header.producer_id, set()).add((partition, header.base_index))
                number, epoch = TxnProducer.of(header.producer_id)
                if (partition, number, epoch + 1) not in commits:
                    sim._fail(
                        f"{replica.group}: read_committed returns the batch at "
                        f"{header.base_index} of {TxnProducer(number, epoch)}, not committed"
                    )
                if partition == CP_OUTPUT:
                    for record in decode_batch(batch):
                        assert record.value is not None
                        outputs[int(record.value.split(b":")[1])] += 1
        for pid, batches in sorted(written.items()):
            seen = visible.get(pid, set())
            if seen and seen != batches:
                sim._fail(
                    f"atomicity: of {TxnProducer.of(pid)}'s batches {sorted(batches)}, "
                    f"read_committed returns {sorted(seen)}"
                )
        for txn in self.txns:
            seen = visible.get(txn.producer.producer_id, set())
            if txn.outcome == "committed" and not txn.acked <= seen:
                sim._fail(f"{txn.producer}: committed, yet {sorted(txn.acked - seen)} not visible")
            if (txn.zombie or txn.outcome in ("aborted", "refused")) and seen:
                what = "the zombie" if txn.zombie else txn.outcome
                sim._fail(f"{txn.producer} ({what}): read_committed returns {sorted(seen)}")
        self._check_exactly_once(inputs, outputs)
        sim.stats["txn_checked"] = len(written)

    def _readable(
        self, partition: int
    ) -> tuple[Replica, list[memoryview], list[memoryview]] | None:
        """A replica of `partition`, its leader's if it reads whole (else another that has
        applied as far, as bit flips may leave one damaged), with every committed batch and
        those read_committed returns."""
        leader = self._leader(partition)
        if leader is None:
            return None
        group = leader[1].group
        replicas = [leader[1]]
        for node in self.sim._alive():
            core = self.sim._core(node)
            replica = core.replicas.get(group) if core is not None else None
            if replica is not None and replica.commit_index == leader[1].commit_index:
                replicas.append(replica)
        for replica in replicas:
            hook, replica.log.on_corrupt = replica.log.on_corrupt, None  # (not the node's read)
            try:
                every = _batches(replica, committed=False)
                return replica, every, _batches(replica, committed=True)
            except CorruptBatchError:
                continue
            finally:
                replica.log.on_corrupt = hook
        return None

    def _check_exactly_once(self, inputs: set[int], outputs: Counter[int]) -> None:
        """Every message of the input partition (its record indexes: `inputs`) the group
        finished has one visible output, every other none."""
        found = self._readable(CP_INPUT)
        assert found is not None and found[0].groups is not None
        state = found[0].groups.state
        group = state.groups.get(CP_GROUP)
        if group is None:
            if outputs:
                self.sim._fail(f"consume → produce: outputs {sorted(outputs)} of nothing consumed")
            return
        if group.txn_pending:
            self.sim._fail(f"consume → produce: {sorted(group.txn_pending)} still pending")
        # (below the cursor, all are finished: the queue state may start past the log start)
        finished = {i for i in inputs if i < group.cursor} | group.done
        for index in sorted(finished | set(outputs)):
            if outputs[index] != (index in finished):
                self.sim._fail(
                    f"consume → produce: message {index} "
                    f"{'finished' if index in finished else 'not finished'} has "
                    f"{outputs[index]} visible outputs"
                )
        self.sim.stats["cp_finished"] = len(finished)


def _batches(replica: Replica, *, committed: bool) -> list[memoryview]:
    """Every batch a reader of `replica` gets from its log start (read_committed or not)."""
    out: list[memoryview] = []
    index = replica.log_start
    for _ in range(100_000):
        result = replica.read(index, 1 << 20, committed=committed)
        if not result.batch_count and result.next_index <= index:
            return out
        out.extend(split_batches(result.data))
        index = result.next_index
    raise AssertionError(f"{replica.group}: reading it does not end")
