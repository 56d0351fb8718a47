"""The node scenario: whole brokers' cores (`NodeCore`, the class the broker runs) with SWIM
inside, under every fault the simulation injects.

Each simulated node runs a `laminar.node.core.NodeCore` over `MemoryDirectory` storage (its
`NodeStorage` in memory: a crash loses what was not fsynced) and a `laminar.swim.core.Swim`
whose datagrams cross the simulated network. Rounds are carried out as the broker carries
them out (`NodeCore.begin`; the early messages; each storage's disk work, `Flush.run`, which
the broker runs in threads: its writes, then, unless the node crashes in between, its
fdatasync; `NodeCore.stored`; the saves; the late messages; `finish`); membership comes
from SWIM; topics, weights and drains from admin commands proposed through the metadata
group (`NodeCore.propose_metadata`); every node gossips its partition status report
(`StatusPublisher`, `StatusTable`) and collects the replicas their leaders no longer count
(`NodeCore.collect_removed`), as brokers do.

The script: three nodes start the metadata group; a topic of PARTITIONS partitions (RF 3) is
created through it; two nodes join through SWIM; one is drained; one changes weight; the
metadata leader crashes for good, after which the group must still take a weight change. The
fault injectors of `laminar.sim.faults` act throughout (drops, duplicates, delays, reordering,
partitions, crashes also mid-write, clock jumps, full disks, bit flips). On top of the base
simulation's invariants (Raft safety, no acknowledged record lost), after settling:

* placement converged: every partition's and the metadata group's configuration is its
  rendezvous target (the metadata group's other live nodes are its learners): one worker on
  each broker placement picks, the one that owns the partition there;
* the partition status table agrees with the groups: on every live node, the table's leader
  of each partition, with its term and voters, is the group's real leader;
* idempotent dedupe: each partition's producer (one batch in flight, retried with the same
  producer id and sequence until acknowledged, through `Replica.propose` as the HTTP append
  does) finds every batch committed exactly once, however often it retried it;
* transactions (`laminar.sim.txn_workload`): transactional producers, a zombie and a
  consume → produce loop run through the metadata group and the partition leaders, with the
  coordinator's driver (`laminar.txn.driver`) on the metadata leader;
  every transaction is atomic under `read_committed`, no aborted record is returned, the
  fenced zombie never commits, and every consumed message has exactly one output.

With `workers` > 1 each node is a broker of that many workers (`laminar.workers`): Raft nodes
`n2`, `n2~1`, ... Worker 0 runs the broker's SWIM member, advertising its workers and which
are down; the others see the members through it (the broker's local feed) and learn the
metadata as the group's learners. Two brokers change their count during the run (n2 gains a
worker, n3 loses one), and the crash for good takes the metadata leader's whole broker.
"""

from __future__ import annotations

import asyncio
import heapq
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

from ..log.batch import Record, encode_batch, parse_header, verify_batch
from ..log.journal import MIN_JOURNAL_BYTES
from ..log.storage import DirectWrite, MemoryDirectory
from ..metadata import (
    METADATA_GROUP,
    ClusterState,
    Command,
    CreateTopic,
    MetadataError,
    SetDraining,
    SetWeight,
    metadata_voters,
)
from ..node.core import CoreConfig, Member, NodeCore, Round
from ..node.store import NodeStorage
from ..partition.errors import NotLeader, Overloaded, ReplicaClosed, SequenceConflict
from ..partition.replica import Replica
from ..partition.status_table import (
    FRESH_MS,
    ReportError,
    StatusPublisher,
    StatusTable,
    leaders,
)
from ..placement import hosts
from ..raft.messages import Message, MessageType
from ..raft.raft import Raft, Role
from ..swim.config import SwimConfig
from ..swim.core import Swim
from ..swim.member import Addresses
from ..swim.member import Member as SwimMember
from ..workers import (
    broker_of,
    expand,
    standing_events,
    worker_ids,
    worker_index,
)
from .cluster import SCENARIO as RAFT_SCENARIO
from .cluster import TICK_MS, SimConfig, SimNode, Simulation, _hash
from .faults import Partition
from .txn_workload import CP_INPUT, TxnWorkload

TOPIC = "events"
PARTITIONS = 6
REPLICATION_FACTOR = 3
INITIAL_NODES = ("n0", "n1", "n2")
JOINING_NODES = ("n3", "n4")
CLUSTER_ID = "sim-cluster"
SECRET = b"sim-cluster-secret"
#: an admin command not answered within this many ticks is proposed again
RETRY_ADMIN_TICKS = 50
#: when the metadata leader crashes for good (or as soon after as it may)
CRASH_TICK = 600
#: `Simulation.unrepaired`'s index for a group whose worker stopped for good (`_change_workers`)
RETIRED = -2
#: how often each node collects replicas its leaders no longer count (the API's collector)
COLLECT_EVERY_TICKS = 50
#: a producer's batch not acknowledged within this many ticks is sent again (same sequence)
RETRY_PRODUCE_TICKS = 30
#: SWIM at simulation speed: the same protocol, faster timers
SWIM = SwimConfig(
    probe_interval_ms=100,
    probe_timeout_ms=50,
    gossip_interval_ms=20,
    push_pull_interval_ms=2_000,
    reconnect_interval_ms=1_000,
    join_retry_interval_ms=100,
    gossip_to_the_dead_ms=3_000,
)

SCENARIO = replace(
    RAFT_SCENARIO,
    nodes=5,
    groups=(),
    ticks=1_000,
    settle_ticks=600,
    partition_rate=0.004,
    crash_rate=0.002,  # and the one scripted crash
    crash_in_persist_rate=0.001,
    propose_rate=0.3,
    conf_change_rate=0.0,  # the leaders' placement control changes memberships
    compact_rate=0.0,  # the core compacts the metadata itself
    corrupt_rate=0.003,
    clock_jump_rate=0.003,
    disk_full_rate=0.002,
)


@dataclass(slots=True)
class Producer:
    """An idempotent producer of one partition: one batch in flight, retried until acked."""

    id: int
    sequence: int = 0
    batch: bytes | None = None
    answer: asyncio.Future[int] | None = None
    sent_tick: int = 0


@dataclass(slots=True)
class Runtime:
    """A live node's parts besides its Raft groups (`SimNode.multi` is its core's)."""

    core: NodeCore
    swim: Swim | None  # worker 0's (a broker's other workers follow its view)
    publisher: StatusPublisher
    table: StatusTable


Job = DirectWrite | Callable[[], None]  # one of a round's disk jobs

#: each node's journal (a broker's is off by default, and the simulator runs one): small, so
#: that runs checkpoint it beside the rounds, in a round when it is full, and wrap it often
JOURNAL_BYTES = MIN_JOURNAL_BYTES
#: and so that some writes go around it, and some of those must not
MAX_JOURNALED_BYTES = 1 << 8


class NodeSimulation(Simulation):
    replay_command = "python -m laminar.sim --node"

    def __init__(
        self,
        seed: int,
        config: SimConfig = SCENARIO,
        *,
        partitions: int = PARTITIONS,
        workers: int = 1,
        transactions: bool = True,
    ) -> None:
        """`transactions`: run the transactional workload (`laminar.sim.txn_workload`; it
        needs the topic's partitions 0 to 5)."""
        self.partitions = partitions
        self.workers = workers
        if workers > 1:
            self.replay_command = f"python -m laminar.sim --node --workers {workers}"
        #: each broker's workers (with more than one, the script changes two brokers')
        self.worker_counts = {f"n{i}": workers for i in range(config.nodes)}
        #: each broker's members as its worker 0 last told its other workers
        self.views: dict[str, dict[str, Member]] = {}
        #: the down workers each live worker 0 advertises
        self.advertised: dict[str, int] = {}
        self.runtimes: dict[str, Runtime] = {}
        self.stores: dict[str, NodeStorage] = {}
        self.datagrams: list[tuple[int, int, str, bytes, str]] = []  # SWIM's, in flight
        self.datagram_seq = 0
        self.epoch = 0
        self.admin: list[Command] = []
        self.admin_sent: tuple[int, int, int] | None = None  # (index, term, tick) in flight
        self.admin_done = 0
        self.crashed_for_good = False
        #: a broker's change of worker count the script is still to make (broker, count)
        self.worker_change: tuple[str, int] | None = None
        self.producers: dict[str, Producer] = {}
        #: where `Replica.propose` makes its answers (run once a tick, for their callbacks)
        self.loop = asyncio.new_event_loop()
        self.ticks = 0
        self.txn_workload: TxnWorkload | None = None
        #: each node's journal checkpoint syncing beside its rounds: (jobs, done), run before
        #: its next round
        self.beside: dict[str, tuple[list[Job], Callable[[], None]]] = {}
        super().__init__(seed, config)
        self.group_names = []  # partition groups, once the topic exists
        if transactions and partitions > CP_INPUT:
            self.txn_workload = TxnWorkload(self, TOPIC)
        self.stats.update(
            dropped=0,
            status_reports=0,
            metadata_snapshots=0,
            retries=0,
            duplicates_answered=0,
            crashed_for_good=0,
            applied_once_stored=0,
            worker_changes=0,
            journal_checkpoints=0,
        )

    # ---- nodes -----------------------------------------------------------------------------

    def _initial_nodes(self) -> list[SimNode]:
        return [n for b in INITIAL_NODES for n in self._workers_of(b)]

    def _workers_of(self, broker: str) -> list[SimNode]:
        """The nodes of `broker`'s workers (made on first use), worker 0 first."""
        out = []
        for worker in worker_ids(broker, self.worker_counts[broker]):
            if worker not in self.nodes:
                self.nodes[worker] = SimNode(worker, self.nodes[broker].number)
            out.append(self.nodes[worker])
        return out

    def _start(self, node: SimNode) -> None:
        store = self.stores.get(node.id)
        if store is None:
            store = NodeStorage(
                None, memory=node.directories, new_memory=partial(self._new_directory, node)
            )
            self.stores[node.id] = store
        config = CoreConfig(
            node.id,
            election_ticks=self.config.raft.election_ticks,
            segment_bytes=16 << 10,
            initial_nodes=INITIAL_NODES,
            joins=node.id not in INITIAL_NODES,
            dead_grace_ms=500,
            removed_grace_ms=1_000,
            journal_bytes=JOURNAL_BYTES,
            max_journaled_bytes=MAX_JOURNALED_BYTES,
        )
        core = NodeCore(config, store, partial(self._members, node), seed=self.rng.getrandbits(32))
        core.set_clock(self.now_ms, self.clock_ms(node))
        self.epoch += 1
        swim = None
        if worker_index(node.id) == 0:  # a broker's SWIM member runs in its worker 0
            member = SwimMember(
                node.id,
                _addresses(node.number),
                epoch=self.epoch,
                workers=self.worker_counts[node.id],
                workers_down=self._workers_down(node.id),
            )
            seeds = [_addresses(self.nodes[n].number).gossip for n in INITIAL_NODES]
            swim = Swim(
                SWIM, member, seeds, random.Random(self.rng.getrandbits(64)), CLUSTER_ID, SECRET
            )
            self.advertised[node.id] = member.workers_down
        first_version = self.now_ms * 1_000  # (the broker: the wall clock's microseconds)
        self.runtimes[node.id] = Runtime(
            core, swim, StatusPublisher(node.id, first_version), StatusTable()
        )
        core.open()
        node.multi = core.multi
        self._refresh(node)
        if swim is not None:
            swim.tick(self.now_ms, self.clock_ms(node))
            self._route_swim(node)
        elif (first := self.runtimes.get(broker_of(node.id))) is not None and first.swim:
            # worker 0's feed: the members gone before this worker ran
            for event in standing_events(first.swim.members().values(), self.now_ms):
                core.on_member_event(event)

    def _new_directory(self, node: SimNode) -> MemoryDirectory:
        return MemoryDirectory(0 if self._disk_full(node) else None)

    def _refresh(self, node: SimNode) -> None:
        """The base simulation's view of the node's groups (its checks read storages)."""
        runtime = self.runtimes.get(node.id)
        if runtime is None or node.multi is None:
            node.storages = {}
            return
        node.storages = {r.group: r.storage for r in runtime.core.all_replicas()}

    def _crash(self, node: SimNode, *, torn: bool) -> None:
        super()._crash(node, torn=torn)
        self.runtimes.pop(node.id, None)
        self.beside.pop(node.id, None)

    def _members(self, node: SimNode) -> dict[str, Member]:
        """What SWIM tells the node: its broker's worker 0's view (the broker's local feed;
        while worker 0 is down, the last view it gave)."""
        broker = broker_of(node.id)
        runtime = self.runtimes.get(broker)
        if runtime is not None and runtime.swim is not None and self.nodes[broker].multi:
            self.views[broker] = expand(runtime.swim.members().values())
        return self.views.get(broker, {})

    def _workers_down(self, broker: str) -> int:
        """The bit mask of `broker`'s workers not running (worker 0 sees its other workers'
        feed connections close)."""
        return sum(
            1 << w for w, worker in enumerate(self._workers_of(broker)) if worker.multi is None
        )

    def _core(self, node: SimNode) -> NodeCore | None:
        runtime = self.runtimes.get(node.id)
        return runtime.core if runtime is not None and node.multi is not None else None

    # ---- rounds: as the broker carries them out --------------------------------------------

    def _drain_rounds(self, node: SimNode) -> None:
        while (core := self._core(node)) is not None:
            core.set_clock(self.now_ms, self.clock_ms(node))
            if (beside := self.beside.pop(node.id, None)) is not None:
                # a journal checkpoint's log syncs, begun by an earlier round: done by now
                jobs, done = beside
                for job in jobs:
                    assert callable(job)  # (in memory: never a DirectWrite)
                    job()
                done()
            round_ = self._begin(core)
            if round_ is None:
                return
            if round_.background_done is not None:
                self.stats["journal_checkpoints"] += 1
                self.beside[node.id] = (round_.background, round_.background_done)
            self._refresh(node)
            for group, ready in round_.readies.items():
                if ready.snapshot is not None:
                    self.stats["snapshots"] += 1
                    if group == METADATA_GROUP:
                        self.stats["metadata_snapshots"] += 1
                    self._log(f"{node.id} {group} installs snapshot at {ready.snapshot.index}")
            for message in round_.before:
                self._send(message)
            # what committed and was stored before the round: applied (and answered) already
            self._check_committed(node, round_)
            if round_.checkpointed is not None:  # a journal checkpoint, first
                self.stats["journal_checkpoints"] += 1
                for job in round_.checkpoint:
                    assert callable(job)  # (in memory: never a DirectWrite)
                    job()
                if self.faulty and any(i.on_persist(self, node) for i in self.injectors):
                    return  # crashed: the logs synced, the journal's start not moved
                round_.checkpointed()
            for flush in round_.syncs:  # the broker's threads: `Flush.run` is these two
                flush.write()
            written = [g for g, ready in round_.readies.items() if ready.entries]
            if (
                written
                and self.faulty
                and any(injector.on_persist(self, node) for injector in self.injectors)
            ):
                return  # crashed: written and sent, never fsynced (nor published)
            for flush in round_.syncs:
                flush.sync()
            core.stored(round_)
            self.stats["applied_once_stored"] += len(round_.unstored)
            self._check_committed(node, round_)  # the rest, applied once stored
            for group in written:
                if group in node.storages:
                    self._check_entries(node, group, round_.readies[group])
            for save in round_.saves:
                save()
            for message in round_.after:
                self._send(message)
            self._answered(round_)
            if self.txn_workload is not None:
                self.txn_workload.on_answers(core, round_.answers)
            core.finish(round_)

    def _begin(self, core: NodeCore) -> Round | None:
        """`core.begin()` in the event loop, as the broker's driver runs it (its queue duties
        propose Expire commands, whose answers are futures)."""

        asyncio.events._set_running_loop(self.loop)  # (cheaper than a run_until_complete)
        try:
            return core.begin()
        finally:
            asyncio.events._set_running_loop(None)

    def _check_committed(self, node: SimNode, round_: Round) -> None:
        """State-machine safety (and what was acknowledged) for the committed entries of
        `round_` that `node` stores now (those still being written are checked once
        stored)."""
        for group, ready in round_.readies.items():
            if ready.committed is not None and group in node.storages:
                self._check_commit(node, group, ready.committed)

    def _deliver_due(self) -> None:
        """Hand each node the messages due, then run its rounds: as the broker's transport
        fills its core's inbox and its driver steps it at the start of the next round."""
        receiving: dict[str, SimNode] = {}
        while self.in_flight and self.in_flight[0][0] <= self.now_ms:
            _, _, message = heapq.heappop(self.in_flight)
            node = self.nodes[message.dst]
            core = self._core(node)
            if core is None or not all(i.delivers(self, message) for i in self.filters):
                continue
            self.trace.append((self.now_ms, message))  # formatted only if a check fails
            if message.type is MessageType.STATUS:
                self._on_status(node, message)
            else:
                core.receive([message])
                receiving[node.id] = node
        for _, node in sorted(receiving.items()):
            self._process(node)

    # ---- SWIM ------------------------------------------------------------------------------

    def _swim(self) -> None:
        """Deliver the datagrams due, tick every live node's SWIM, hand its events to its
        core."""
        while self.datagrams and self.datagrams[0][0] <= self.now_ms:
            _, _, target, data, source = heapq.heappop(self.datagrams)
            node = self.nodes[target]
            runtime = self.runtimes.get(target)
            if runtime is None or node.multi is None or not self._connected(source, target):
                continue
            assert runtime.swim is not None  # (datagrams go to worker 0s)
            runtime.swim.receive(data, _addresses(self.nodes[source].number).gossip, self.now_ms)
            self._route_swim(node)
        for node in self._alive():
            swim = self.runtimes[node.id].swim
            if swim is None:
                continue
            down = self._workers_down(node.id)
            if self.advertised.get(node.id) != down:
                swim.update_self(workers_down=down)
                self.advertised[node.id] = down
                self._route_swim(node)
            if swim.next_tick_ms() <= self.now_ms:
                swim.tick(self.now_ms, self.clock_ms(node))
                self._route_swim(node)

    def _route_swim(self, node: SimNode) -> None:
        swim = self.runtimes[node.id].swim
        assert swim is not None
        for address, data in swim.outbox():
            target = _node_at(address)
            if target is None or self.rng.random() < self.config.drop_rate:
                continue
            self.datagram_seq += 1
            delay_ms = self.rng.randint(1, max(1, self.config.max_delay_ms))
            heapq.heappush(
                self.datagrams, (self.now_ms + delay_ms, self.datagram_seq, target, data, node.id)
            )
        events = swim.events()
        for worker in self._workers_of(node.id):  # (worker 0's feed: events to every worker)
            runtime = self.runtimes.get(worker.id)
            if runtime is None or worker.multi is None:
                continue
            for event in events:
                if event.kind.name in ("DEAD", "LEFT"):
                    for gone in worker_ids(event.state.id, event.state.member.workers):
                        runtime.table.forget(gone)
                runtime.core.on_member_event(event)

    def _connected(self, a: str, b: str) -> bool:
        sides = [i.side for i in self.injectors if isinstance(i, Partition) and i.side]
        return all((a in side) == (b in side) for side in sides)

    # ---- the partition status table --------------------------------------------------------

    def _publish(self, node: SimNode, *, force: bool = False) -> None:
        runtime = self.runtimes[node.id]
        core = runtime.core
        shape = core.hosted_structure()
        if not (force or runtime.publisher.due(shape, self.now_ms)):
            return
        peers = sorted(core.alive() - {node.id})
        # (the broker's status gossip: an unchanged report's bytes are sent again)
        messages = runtime.publisher.publish(
            shape, core.hosted, peers, self.now_ms, reuse=core.hosted_changes
        )
        for message in messages:
            self._send(message)

    def _on_status(self, node: SimNode, message: Message) -> None:
        try:
            if self.runtimes[node.id].table.receive(message, self.now_ms):
                self.stats["status_reports"] += 1
        except ReportError as e:
            self._fail(f"{node.id}: a status report it cannot read: {e}")

    def _collect(self, node: SimNode) -> None:
        """What the broker's API collector does every few seconds."""
        runtime = self.runtimes[node.id]
        view = runtime.table.view(runtime.core.alive(), self.now_ms, FRESH_MS)
        view.pop(node.id, None)
        try:
            dropped = runtime.core.collect_removed(leaders(view))
        except Exception as e:
            self._stop_if_no_space(node, e)
            return
        if dropped:
            self.stats["dropped"] += len(dropped)
            self._log(f"{node.id} drops {dropped}")
            self._refresh(node)

    # ---- admin commands --------------------------------------------------------------------

    def _led(self) -> bool:
        return super()._led() and self._metadata_leader() is not None

    def _metadata_leader(self) -> tuple[SimNode, NodeCore] | None:
        for node in self._alive():
            core = self._core(node)
            if core is not None and core.meta is not None and core.meta.raft.role is Role.LEADER:
                return node, core
        return None

    def _send_admin(self) -> None:
        if not self.admin:
            return
        if self.admin_sent is not None and self.ticks - self.admin_sent[2] < RETRY_ADMIN_TICKS:
            return
        found = self._metadata_leader()
        if found is None:
            return
        node, core = found
        command = self.admin[0]
        try:
            index, term = core.propose_metadata(command)
        except (NotLeader, ReplicaClosed, MetadataError) as e:
            self._log(f"{node.id} refuses {type(command).__name__}: {e}")
            return
        self.admin_sent = (index, term, self.ticks)
        self._log(f"{node.id} proposes {type(command).__name__} at {index}")
        self._process(node)

    def _answered(self, round_: Round) -> None:
        sent = self.admin_sent
        for index, term, result in round_.answers:
            if sent is None or (index, term) != sent[:2]:
                continue
            if result is not None and result.code != "exists":
                self._fail(f"admin command {self.admin[0]!r} failed: {result}")
            self.admin.pop(0)
            self.admin_sent = sent = None
            self.admin_done += 1
            if self.admin_done == 1:
                self.group_names = [f"{TOPIC}/{p}" for p in range(self.partitions)]

    # ---- the idempotent producers ----------------------------------------------------------

    def _propose(self, group: str) -> None:
        """The partition's producer: a new batch once the last is acknowledged, else the same
        batch again after RETRY_PRODUCE_TICKS (its answer lost with a crash, a partition or
        a leader change), through the leader's `Replica.propose`."""
        producer = self.producers.get(group)
        if producer is None:
            producer = Producer(zlib.crc32(group.encode()) | 1)
            self.producers[group] = producer
        answer = producer.answer
        if answer is not None and answer.done() and answer.exception() is None:
            assert producer.batch is not None
            producer.sequence += parse_header(producer.batch).record_count
            producer.batch = producer.answer = None
        elif answer is not None and self.ticks - producer.sent_tick < RETRY_PRODUCE_TICKS:
            return
        leader = self._leader_replica(group)
        if leader is None:
            return
        retry = producer.batch is not None
        if producer.batch is None:
            count = self.rng.randint(1, 3)
            records = [
                Record(value=f"{group}:{producer.sequence + i}".encode()) for i in range(count)
            ]
            producer.batch = encode_batch(
                records, producer_id=producer.id, producer_seq=producer.sequence, now_ms=0
            )
        assert producer.batch is not None
        proposed = self._propose_on(leader, group, producer.batch)
        if proposed is None:
            return
        producer.answer, duplicate = proposed
        producer.sent_tick = self.ticks
        self.stats["retries"] += retry
        self.stats["duplicates_answered"] += duplicate

    def propose_batch(self, group: str, batch: bytes) -> asyncio.Future[int] | None:
        """Propose `batch` through the leader's `Replica.propose` of `group` (as the HTTP
        append does): the future of its base index (None: no leader, or refused). Its entry
        counts as acknowledged once committed (the base simulation's loss check)."""
        leader = self._leader_replica(group)
        proposed = None if leader is None else self._propose_on(leader, group, batch)
        return None if proposed is None else proposed[0]

    def _leader_replica(self, group: str) -> tuple[SimNode, Raft, Replica] | None:
        """`group`'s leader: its node, Raft and replica (None: it has none now)."""
        found = self._leader_of(group)
        core = self._core(found[0]) if found is not None else None
        replica = core.replicas.get(group) if core is not None else None
        if found is None or replica is None:
            return None
        return found[0], found[1], replica

    def _propose_on(
        self, leader: tuple[SimNode, Raft, Replica], group: str, batch: bytes
    ) -> tuple[asyncio.Future[int], bool] | None:
        """`batch` proposed through `leader`'s `Replica.propose`: its future and whether it
        was a duplicate (None: refused); a new entry is remembered for the loss check."""
        node, raft, replica = leader
        before = raft.log.last_index()

        async def propose() -> tuple[asyncio.Future[int], bool]:
            # (checked as the API checks it: the log then writes it without checking again)
            limit = replica.log.config.batch_limit_bytes
            return replica.propose(batch, *verify_batch(batch, limit))

        try:
            future, duplicate = self.loop.run_until_complete(propose())
        except (NotLeader, ReplicaClosed, Overloaded, SequenceConflict):
            return None
        if not duplicate:
            self.proposals[group][before + 1] = (raft.term, _hash(batch), node.id)
        self._process(node)
        return future, duplicate

    def _check_dedupe(self) -> None:
        """Every producer's sequence is committed once in its partition, and every sequence
        it was acknowledged for is there."""
        for group in self.group_names:
            found = self._leader_of(group)
            assert found is not None
            log = found[1].log
            storage = found[0].storages[group].log
            seen: dict[tuple[int, int], int] = {}
            for header in storage.batch_headers(log.first_index()):
                if header.base_index > log.committed:
                    break
                if not header.producer_id or header.is_control:
                    continue  # (a transaction marker names a producer, and may come twice)
                key = (header.producer_id, header.producer_seq)
                if key in seen:
                    self._fail(
                        f"idempotent dedupe: {group} holds producer {key[0]} sequence {key[1]} "
                        f"at {seen[key]} and {header.base_index}"
                    )
                seen[key] = header.base_index
            producer = self.producers.get(group)
            if producer is not None and producer.sequence > 0:
                acked = (producer.id, producer.sequence - 1)
                if not any(k[0] == acked[0] and k[1] <= acked[1] for k in seen):
                    self._fail(f"{group}: the producer's acknowledged batches are gone")
        self.stats["dedupe_checked"] = len(self.group_names)

    # ---- the script ------------------------------------------------------------------------

    def _tick(self, *, faulty: bool) -> None:
        self.ticks += 1
        script: dict[int, Callable[[], None]] = {
            30: lambda: self.admin.append(CreateTopic(TOPIC, self.partitions, REPLICATION_FACTOR)),
            150: self._join,
            300: lambda: self.admin.append(SetDraining("n1", True)),
            450: lambda: self.admin.append(SetWeight("n2", 3)),
            # the metadata group must still take writes without its old leader
            750: lambda: self.admin.append(SetWeight("n3", 2)),
        }
        if self.workers > 1:  # a broker gains a worker, another loses one
            script[500] = partial(setattr, self, "worker_change", ("n2", self.workers + 1))
            script[550] = partial(setattr, self, "worker_change", ("n3", self.workers - 1))
        action = script.get(self.ticks)
        if action is not None:
            self._log(f"script at tick {self.ticks}")
            action()
        if self.worker_change is not None and self._change_workers(*self.worker_change):
            self.worker_change = None
        self._forget_retired()
        if self.ticks >= CRASH_TICK and not self.crashed_for_good and faulty:
            self.crashed_for_good = self._crash_metadata_leader()
            self.stats["crashed_for_good"] = int(self.crashed_for_good)
        self._swim()
        super()._tick(faulty=faulty)
        # the answers' callbacks (the HTTP handlers' side: exceptions retrieved)
        self.loop.run_until_complete(asyncio.sleep(0))
        self._send_admin()
        if self.txn_workload is not None:
            self.txn_workload.tick()
        for node in self._alive():
            self._publish(node)
            if self.ticks % COLLECT_EVERY_TICKS == 0:
                self._collect(node)

    def _join(self) -> None:
        for name in JOINING_NODES:
            for worker in self._workers_of(name):
                self._start(worker)

    def _change_workers(self, broker: str, count: int) -> bool:
        """Restart `broker` with `count` workers (True), unless a worker that goes stops more
        than its groups survive (False: try again next tick; see `_survivable`, and
        docs/transactions.md: a worker's replicas do not move away before it stops). A worker
        gone stops for good (its replicas move to the broker's worker that owns them now; its
        groups count as damaged until their leader's configuration drops it), a new one
        starts empty."""
        before = self._workers_of(broker)
        held = self._survivable(before[count:])
        if held is None:
            return False
        for group, node_id in held.items():
            self.unrepaired[group] = (node_id, RETIRED)
        self.worker_counts[broker] = count
        self._log(f"{broker} restarts with {count} workers")
        self.stats["worker_changes"] += 1
        for worker in before[count:]:
            if worker.multi is not None:
                self._crash(worker, torn=False)
            worker.down_until_ms = -1  # for good
        first = self.nodes[broker]
        if first.multi is not None:
            self._crash(first, torn=False)
            self._start(first)  # (a new epoch, advertising the new workers)
        for worker in self._workers_of(broker)[len(before) :]:
            self._start(worker)
        return True

    def _forget_retired(self) -> None:
        """A group that lost a retired worker's replica is whole again once its leader's
        configuration, with no change in flight, no longer has that worker."""
        for group, (node_id, index) in sorted(self.unrepaired.items()):
            if index != RETIRED:
                continue
            found = self._leader_of(group)
            if found is None:
                continue
            raft = found[1]
            if node_id not in raft.conf.members() and raft.pending_conf_index <= raft.log.committed:
                del self.unrepaired[group]

    def _crash_metadata_leader(self) -> bool:
        """Crash the metadata leader's broker (all its workers) for good (True), unless that
        is more than its groups can survive (False: try again next tick; `_survivable`). Its
        groups then count as damaged for good (no more bit flips there)."""
        found = self._metadata_leader()
        if found is None:
            return False
        workers = self._workers_of(found[0].id)
        held = self._survivable(workers)
        if held is None:
            return False
        for node in workers:
            self._crash(node, torn=True)
            node.down_until_ms = -1  # for good
        for group, node_id in held.items():
            self.unrepaired[group] = (node_id, -1)
        return True

    def _survivable(self, workers: list[SimNode]) -> dict[str, str] | None:
        """The groups `workers` are members of (group -> the worker), if their groups survive
        losing them all for good; None if not: one of them is down, or one of those groups
        has a damaged replica elsewhere (one they vote in), no leader, a configuration change
        in flight, one of them as a learner (its promotion may be next), or too few other
        live voters for a majority."""
        held: dict[str, str] = {}  # group -> the worker holding it
        voting: set[str] = set()  # the groups one of them is a voter of
        for worker in workers:
            core = self._core(worker)
            if core is None:
                return None  # a worker restarting: its groups are not known here
            for replica in core.all_replicas():
                if worker.id in replica.raft.conf.members():
                    held[replica.group] = worker.id
                if worker.id in replica.raft.conf.voters:
                    voting.add(replica.group)
        if voting & set(self.unrepaired):
            return None
        live = {n.id for n in self._alive()} - {n.id for n in workers}
        doomed = {n.id for n in workers}
        for group in held:
            if self._leader_of(group) is None:
                return None
            rafts = [r for n in self._alive() if n.multi and (r := n.multi.groups.get(group))]
            for raft in rafts:  # every configuration a live member holds, stale ones too
                voters = raft.conf.voters
                if len(live & set(voters)) <= len(voters) // 2:
                    return None
                if raft.pending_conf_index > raft.log.committed:
                    return None  # a change in flight: its outcome is not known yet
                if group != METADATA_GROUP and doomed & set(raft.conf.learners):
                    # its leader may promote that learner before it learns of the crash (a
                    # worker taking over from another of its broker's, both then voters;
                    # the metadata group's learners are every live node's, as followers)
                    return None
        return held

    # ---- invariants after settling ---------------------------------------------------------

    def run(self) -> dict[str, int]:
        try:  # (the loop stays open through the checks: they run rounds)
            super().run()
            try:
                self._check_converged()
                self._check_metadata_agrees()
                self._check_status_table()
                self._check_dedupe()
                if self.txn_workload is not None:
                    self.txn_workload.check()
            except AssertionError as e:
                raise type(e)(self.report(str(e))) from None
        finally:
            self.loop.close()
        return dict(self.stats)

    def _check_converged(self) -> None:
        found = self._metadata_leader()
        if found is None:
            self._fail("the metadata group has no leader after settling")
            return
        node, core = found
        state: ClusterState = core.state
        if self.admin or TOPIC not in state.topics or state.draining != {"n1"}:
            self._fail(f"admin commands missing from the metadata: {self.admin!r}")
        if state.weight("n2") != 3 or state.weight("n3") != 2:
            self._fail(f"weights missing from the metadata: {state.weights!r}")
        candidates = core.candidates()
        alive = {c.id for c in candidates if c.alive}
        if alive != {broker_of(n.id) for n in self._alive()}:
            self._fail(f"{node.id}'s SWIM sees {sorted(alive)} alive after settling")
        if core.alive() != {n.id for n in self._alive()}:
            self._fail(f"{node.id} counts {sorted(core.alive())} alive after settling")
        metadata_target = set(metadata_voters(candidates))
        assert core.meta is not None
        conf = core.meta.raft.conf
        learners = core.alive() - metadata_target  # every other worker of every broker
        if set(conf.voters) != metadata_target or set(conf.learners) != learners:
            self._fail(f"metadata group {conf} != voters {sorted(metadata_target)} + learners")
        for group in self.group_names:
            leader = self._leader_of(group)
            if leader is None:
                self._fail(f"{group} has no leader after settling")
                return
            conf = leader[1].conf
            if len({broker_of(n) for n in conf.voters}) != len(conf.voters):
                self._fail(f"{group}: two workers of one broker in {conf.voters}")
            target = set(hosts(group, candidates, REPLICATION_FACTOR))
            if set(conf.voters) != target or conf.learners:
                self._fail(f"{group}: voters {conf.voters} learners {conf.learners} != {target}")
        if self.stats["metadata_snapshots"] < len(JOINING_NODES):
            self._fail("the joining nodes did not learn the metadata from a snapshot")
        self.stats["converged_partitions"] = len(self.group_names)

    def _check_metadata_agrees(self) -> None:
        """State-machine safety of the metadata as applied: live nodes that applied the
        metadata group up to the same index hold the same cluster state."""
        states: dict[int, tuple[str, bytes]] = {}
        compared = 0
        for node in self._alive():
            core = self.runtimes[node.id].core
            state = core.state.snapshot()
            first = states.setdefault(core.meta_applied_index, (node.id, state))
            if first[0] != node.id:
                compared += 1
                if first[1] != state:
                    self._fail(
                        f"{node.id} and {first[0]} applied the metadata up to "
                        f"{core.meta_applied_index} and hold different states"
                    )
        self.stats["metadata_states_compared"] = compared

    def _check_status_table(self) -> None:
        """Publish once more, deliver, then every live node's table names each partition's
        real leader, term and voters."""
        for node in self._alive():
            self._publish(node, force=True)
        for _ in range(self.config.max_delay_ms // TICK_MS + 2):
            self.now_ms += TICK_MS
            self._deliver_due()
        for node in self._alive():
            runtime = self.runtimes[node.id]
            view = runtime.table.view(runtime.core.alive(), self.now_ms)
            view[node.id] = runtime.core.hosted()
            table = leaders(view)
            for group in self.group_names:
                found = self._leader_of(group)
                row = table.get(group)
                assert found is not None
                leader, raft = found
                if row is None or (row["leader"], row["term"]) != (leader.id, raft.term):
                    self._fail(
                        f"{node.id}'s status table has {group} led by {row!r}, not "
                        f"{leader.id} in term {raft.term}"
                    )
                elif set(row["voters"]) != set(raft.conf.voters):
                    self._fail(f"{node.id}'s status table has {group} voters {row['voters']}")
        self.stats["status_tables_checked"] = len(self._alive())


def _addresses(number: int) -> Addresses:
    host = f"10.0.0.{number + 1}"
    return Addresses(api=f"{host}:8080", peer=f"{host}:7000", gossip=f"{host}:7946")


def _node_at(gossip_address: str) -> str | None:
    host = gossip_address.rsplit(":", 1)[0]
    number = int(host.rsplit(".", 1)[1]) - 1 if host.startswith("10.0.0.") else -1
    return f"n{number}" if number >= 0 else None


def run_node_seed(seed: int, config: SimConfig = SCENARIO, *, workers: int = 1) -> dict[str, int]:
    return NodeSimulation(seed, config, workers=workers).run()
