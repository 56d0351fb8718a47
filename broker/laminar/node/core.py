"""The node core: everything one broker decides, with no I/O of its own (sans-I/O).

`NodeCore` owns the node's Raft groups (`MultiRaft`): the `__cluster` metadata group, whose
state machine (`ClusterState`) it applies, and the data partitions' replicas, which it hosts,
repairs, quarantines and drops. It runs placement control (each leader moves its group one
step toward its rendezvous target), retention, metadata compaction, metadata barriers (read
index) and a partition leader's consumer-group duties.

Its inputs: `receive(messages)` from peers, `tick()` from the clock, `set_clock(...)`,
`propose_metadata(command)`, `request_barrier()`, membership events (`on_member_event`) and
the members SWIM reports (`membership`, a function given at construction). Its output is
one `Round` at a time (`begin`): the group-commit round. A round has applied what committed
and is stored here already; it lists

* `before`: messages to send at once (a leader's appends and heartbeats: sent before its
  own fsync, as etcd's `msgs`);
* `syncs`: each storage's disk work, run off the event loop: write the round's entries, then
  fdatasync the log and its staged checkpoint and topic files (as the fsync policy asks);
  then `stored` publishes the entries (nothing reads them from disk before) and applies what
  committed among them;
* `saves`: the durable hard-state writes;
* `after`: messages to send only once those are durable (votes and acknowledgements:
  etcd's `msgsAfterAppend`);
* `answers` (metadata proposals applied) and `barriers` (metadata read barriers passed);
* `movers`: partitions whose dead letters want moving.

The runtime (`laminar.server.node.Broker`) carries a round out with real sockets, threads
and files, calling `stored` and then `finish`; the simulator (`laminar.sim.node_cluster`)
carries it out over a simulated network and `MemoryDirectory` storage. Both run this class.

A replica's data is removed only after a committed change says so: a deletion of its topic
that this node has applied (known by identity: the metadata index that created it, recorded
beside the replica), or its group's leader no longer counting this node, seen in two fresh
status reports (`collect_removed`; never the replica's own configuration, which a member
added again passes through while it catches up). Metadata that may be stale (a restart
replays only what it saved) never removes anything. A replica whose log is found
damaged is reopened repaired (`laminar.raft.repair`): cut at the damage and fetched again from
the leader; a damaged leader so steps down. Other replicas are not touched.
"""

from __future__ import annotations

import contextlib
import logging
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from ..log.batch import Record, decode_batch, encode_batch
from ..log.config import FsyncPolicy, LogConfig
from ..log.errors import STORAGE_FAILURES, CorruptBatchError
from ..log.journal import MIN_JOURNAL_BYTES, Journal, JournalFlush, Section
from ..log.storage import DirectWrite, no_space
from ..metadata import (
    METADATA_GROUP,
    AlterTopic,
    ClusterState,
    Command,
    CreateTopic,
    MetadataError,
    decode_command,
    encode_command,
    metadata_voters,
    validate_proposal,
)
from ..metadata.state import LOG_CONFIG_KEYS, MAX_PARTITIONS, MAX_REPLICATION_FACTOR, Topic
from ..models import HostedPartition
from ..partition.errors import NotLeader, Overloaded, ReplicaClosed
from ..partition.reconcile import (
    LeaderBalance,
    StepKind,
    TopicPlan,
    leader_step,
    plan_topic,
    rebalance_to,
)
from ..partition.replica import Replica
from ..placement import Candidate, hosts
from ..queue.state import QueueConfig
from ..raft.config import RaftConfig
from ..raft.log_storage import Flush, LogStorage
from ..raft.messages import ConfState, EntryKind, Message, MessageType
from ..raft.multi import MultiRaft
from ..raft.raft import ProposalDropped, Raft, Ready, Role
from ..raft.round import plan
from ..raft.storage import StorageUnavailable, stored_entries
from ..swim.member import EventKind, MembershipEvent, MemberStatus
from ..workers import broker_of
from .barriers import Barriers
from .store import NodeStorage

log = logging.getLogger(__name__)
MT = MessageType
#: The messages that may create a replica here (a leader reaching a member it added).
LEADER_MESSAGES = frozenset({MT.APPEND, MT.HEARTBEAT, MT.SNAPSHOT})
CONTROL_INTERVAL_MS = 250
#: a control sweep looks at every data replica once in this many passes (a second), or
#: more with many replicas: a pass looks at CONTROL_VISITS_PER_PASS of them at most
CONTROL_SWEEP_PASSES = 4
CONTROL_VISITS_PER_PASS = 625
#: quiesced groups are checked against SWIM at least every this many ticks (`_wake_quiesced`)
WAKE_SWEEP_TICKS = 20
ALIVE = MemberStatus.ALIVE
#: A learner within this many indexes of the leader's log may be promoted.
CATCH_UP_LAG_INDEXES = 256
#: Compact the metadata log once this many entries sit behind the commit.
METADATA_COMPACT_ENTRIES = 256
RETENTION_INTERVAL_MS = 2_000
#: ticks stepped per round at most (a stalled loop does not fire a burst of elections)
MAX_TICKS_PER_ROUND = 3
#: what can meet malformed records (`NodeCore.report_malformed`)
MALFORMED_PATHS = ("read", "acquire", "dead_letter")
#: batches whose report is remembered (beyond it, reports start over)
MALFORMED_SEEN_LIMIT = 10_000
DEFAULT_MAX_DELIVERIES = QueueConfig().max_deliveries

#: a member as SWIM reports it: (status, API address, peer address)
Member = tuple[MemberStatus, str, str]


@dataclass(frozen=True, slots=True)
class CoreConfig:
    """What the core needs of the broker's settings."""

    node_id: str
    election_ticks: int = 10
    segment_bytes: int = 64 << 20
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS
    fsync_interval_ms: int = 1_000
    max_pending_bytes_per_partition: int = 64 << 20
    #: a broker dead this long is replaced by placement (`counts_for_placement`)
    dead_grace_ms: int = 60_000
    #: the nodes that start the metadata group; empty: this node alone, unless `joins`
    initial_nodes: tuple[str, ...] = ()
    #: this node joins a running cluster (it was given seeds)
    joins: bool = False
    #: a replica a leader no longer counts is dropped once it is older than this
    removed_grace_ms: int = 10_000
    #: with fsync `always`: the node's journal (`laminar.log.journal`), this many bytes, in
    #: which a round makes its log writes durable with one fdatasync; 0: none (each log
    #: written is synced itself)
    journal_bytes: int = 0
    #: a log that writes more in a round syncs itself rather than go through the journal
    #: (unless it must): its fdatasync's fixed cost is small beside its bytes, and the journal
    #: would write them twice (bench/RESULTS.md, issue 22, twenty-sixth sitting)
    max_journaled_bytes: int = 256 << 10


@dataclass(frozen=True, slots=True)
class GroupStatus:
    role: Role
    lead: str | None
    term: int


@dataclass(slots=True)
class Round:
    """One group-commit round (see the module's docstring): carry it out in this order."""

    readies: dict[str, Ready]
    before: list[Message] = field(default_factory=list)
    #: a journal checkpoint to carry out first, off the event loop, in this order: sync
    #: these logs, then `checkpointed` (the journal's start moves past its records)
    checkpoint: list[DirectWrite | Callable[[], None]] = field(default_factory=list)
    checkpointed: Callable[[], None] | None = None
    #: a journal checkpoint's log syncs to start beside the rounds (off the event loop, not
    #: awaited by this round), and what to call once they are done
    background: list[DirectWrite | Callable[[], None]] = field(default_factory=list)
    background_done: Callable[[], None] | None = None
    #: the journal header this round writes (with its record, or alone), and what to call
    #: once the round's disk work is done (`NodeCore.stored`)
    journal_header: tuple[int, bytes] | None = None
    journal_moved: Callable[[], None] | None = None
    #: each storage's disk work (write its entries, fdatasync; the journal's record with
    #: them): `run` off the event loop, then `NodeCore.stored` publishes them
    syncs: list[Flush | JournalFlush] = field(default_factory=list)
    #: committed ranges whose entries this round writes: applied once stored (`stored`)
    unstored: dict[str, tuple[int, int]] = field(default_factory=dict)
    saves: list[Callable[[], None]] = field(default_factory=list)
    after: list[Message] = field(default_factory=list)
    #: (index, term, result) of each metadata entry proposed here and now applied
    answers: list[tuple[int, int, MetadataError | None]] = field(default_factory=list)
    barriers: list[int] = field(default_factory=list)
    movers: list[str] = field(default_factory=list)


class NodeCore:
    def __init__(
        self,
        config: CoreConfig,
        storage: NodeStorage,
        membership: Callable[[], Mapping[str, Member]],
        *,
        seed: int | None = None,
    ) -> None:
        """`membership`: the members SWIM knows (this node may be missing from it); `seed`:
        for the Raft groups' election jitter (None: the system's randomness)."""
        self.config = config
        self.id = config.node_id
        self.storage = storage
        self.membership = membership
        self.seed = seed
        self.raft_config = RaftConfig(
            election_ticks=config.election_ticks,
            heartbeat_ticks=1,
            max_inflight_appends=16,
            max_append_bytes=1 << 20,
            promote_lag_indexes=CATCH_UP_LAG_INDEXES,
        )
        #: idle groups quiesce; the failure detector's word wakes them (`_wake_quiesced`)
        self.multi = MultiRaft(self.id, quiesce=True)
        self.multi.live = self._counts_alive
        self.replicas: dict[str, Replica] = {}  # data partitions, by group
        self.meta: Replica | None = None
        self.state = ClusterState()
        self.meta_applied_index = -1  # last metadata-group index applied (no-ops included)
        self.now_ms = 0  # monotonic
        self.wall_ms = 0  # the leases' clock
        #: called when work arrives outside a round (proposals, damage): run one soon
        self.wake: Callable[[], None] = _nothing
        self.stopping = False
        self._inbox: list[Message] = []
        self._ticks_due = 0
        self._control_at_ms = -CONTROL_INTERVAL_MS
        self._control_due = True
        self._next_sync_ms = 0
        self._retained_at_ms = 0
        #: when this node saw each member that is away die or leave
        self._away_since_ms: dict[str, int] = {}
        #: brokers SWIM says are leaving (stopping): handed no leadership
        self._leaving: set[str] = set()
        #: this node is stopping (`leave`): it hands its leaderships away and takes none
        self.leaving = False
        #: when this node first looked for each broker of the metadata group's configuration
        #: that SWIM has not heard from yet (`unheard`)
        self._unheard_since_ms: dict[str, int] = {}
        self._status: dict[str, GroupStatus] = {}
        self._hosted_at_ms: dict[str, int] = {}
        self._excluded: set[str] = set()  # groups a leader excluded us from at the last check
        self._replaying = False  # re-applying the metadata log at start
        self._damaged: dict[str, int] = {}  # group -> first damaged index: reopen repaired
        self._meta_waiting: set[int] = set()  # metadata indexes proposed here
        self._answers: list[tuple[int, int, MetadataError | None]] = []
        self.barriers = Barriers()
        self.movers_wanted: set[str] = set()
        #: leader balance (`_control`): each topic's plan, the moves' rate limits
        self.balance = LeaderBalance()
        self._plans: dict[str, TopicPlan] = {}
        self._alive_now: set[str] | None = None  # `alive()`, until the next tick
        self._alive_seen: frozenset[str] = frozenset()  # strictly alive at the last sweep
        self._swept_at = 0  # (ticks)
        # the control sweep (`_control_visits`)
        self._seen: set[str] = set()  # the groups hosted at the last pass
        self._fresh: set[str] = set()  # new since the pass before
        self._sweep: list[str] = []
        self._swept = 0
        self._sweep_retains = False
        self._queue_leaders: set[str] = set()  # led groups with consumer groups
        #: groups whose storage has planned writes or staged files (`LogStorage.on_pending`):
        #: the only ones a round flushes, so that idle replicas cost it nothing
        self._pending: dict[str, None] = {}
        #: the node's journal (`open`; None: none), and the logs written through it since
        #: its last checkpoint, by group
        self.journal: Journal | None = None
        self._journaled: dict[str, LogStorage] = {}
        #: the checkpoints beside the rounds (`_plan_journal`): how many were begun, the one
        #: whose logs are syncing (and their cuts then), the synced one whose header is next
        self._checkpoints = 0
        self._syncing: int | None = None
        self._syncing_cuts: dict[LogStorage, int] | None = None
        self._synced: tuple[tuple[int, int], dict[LogStorage, int]] | None = None
        #: `hosted_structure`: each hosted group's row as last computed, the members alive
        #: then, and a version that grows whenever a row changes
        self._shape_rows: dict[str, tuple[object, ...]] = {}
        self._shape_alive: set[str] = set()
        self._shape_version = 0
        #: grows whenever anything `hosted()` reports may have changed (as `hosted_structure`
        #: last looked): equal, the status gossip sends its last report's bytes again
        self.hosted_changes = 0
        self._ticks = 0  # ticks given so far
        #: counters read by the metrics module
        self.counters: dict[str, int] = {
            "elections": 0,
            "leader_changes": 0,
            "fsyncs": 0,
            "ready_rounds": 0,
            "dropped_messages": 0,
            "bad_status_reports": 0,
            # storage damage (laminar_storage_*)
            "corrupt_batches": 0,
            "repairs": 0,
            "data_loss_repairs": 0,
            "quarantined_replicas": 0,
            # leader balance and quiescence
            "leader_rebalances": 0,
            "quiesce_wakes": 0,
            # placement control (`_control`): its passes, each a step toward placement
            "control_passes": 0,
        }
        #: records of malformed batches skipped, by what met them (read, acquire,
        #: dead_letter), each counted once (laminar_malformed_records_total)
        self.malformed_records: dict[str, int] = dict.fromkeys(MALFORMED_PATHS, 0)
        self._malformed_seen: set[tuple[str, str, int, str]] = set()

    # ---- inputs ----------------------------------------------------------------------------

    def set_clock(self, now_ms: int, wall_ms: int) -> None:
        self.now_ms, self.wall_ms = now_ms, wall_ms

    def receive(self, messages: Iterable[Message]) -> None:
        """Messages from peers, stepped at the start of the next round."""
        self._inbox.extend(messages)

    def tick(self) -> None:
        self._ticks_due += 1
        self._ticks += 1  # (the leader balance's clock)
        self._alive_now = None  # the members SWIM counts alive are read again

    def on_member_event(self, event: MembershipEvent) -> None:
        # (a death starts the grace after which placement replaces a broker; one that left
        # keeps its place until it is back: `counts_for_placement`)
        if event.kind in (EventKind.DEAD, EventKind.LEFT):
            self._away_since_ms.setdefault(event.state.id, self.now_ms)
        elif event.kind in (EventKind.JOINED, EventKind.ALIVE):
            self._away_since_ms.pop(event.state.id, None)
        if event.state.member.leaving and event.kind not in (EventKind.DEAD, EventKind.LEFT):
            self._leaving.add(event.state.id)
        else:
            self._leaving.discard(event.state.id)  # (a restart joins with a new epoch)
        self._control_due = True

    def leave(self, leaving: bool = True) -> None:
        """This node is stopping (or, `leaving` False, no longer): it campaigns early for
        nothing and takes no leadership handed over (its broker advertises it as leaving,
        so others hand it none)."""
        self.leaving = leaving
        if leaving:
            for replica in self.all_replicas():
                replica.raft.eager = False

    def takes_leadership(self, node: str) -> bool:
        """Whether leaderships may be handed to `node` (a handoff, a rebalance): not while
        it, or its broker, is stopping."""
        if node == self.id:
            return not self.leaving
        return broker_of(node) not in self._leaving

    # ---- opening ---------------------------------------------------------------------------

    def open(self) -> None:
        """Open what this node stored: the journal, the metadata group, then every replica
        (each redoing what the journal holds of its log); then start the journal anew. With
        no room for a new journal, it runs without one (each log fdatasyncs itself), as with
        `journal_bytes` 0: a broker upgraded on a full disk still starts."""
        wanted = self.config.journal_bytes if self.config.fsync is FsyncPolicy.ALWAYS else 0
        had = self.storage.has_journal()
        if wanted or had:
            # (one left by a run with a journal is replayed all the same, then removed)
            directory = self.storage.journal_directory()
            try:
                self.journal = Journal.open(directory, wanted or MIN_JOURNAL_BYTES)
            except STORAGE_FAILURES as e:
                if had or not no_space(e):
                    raise
                log.warning(
                    "%s: no room for a journal of %d bytes (%s): running without one, each "
                    "log fdatasyncing itself (free space, or set --journal-bytes lower or 0)",
                    self.id,
                    wanted,
                    e,
                )
                wanted = 0
            else:
                logs = self.journal.untaken()
                log.info("%s: the journal holds writes of %d logs, to redo", self.id, len(logs))
        self._open_groups()
        if self.journal is None:
            return
        for key in self.journal.untaken():  # (every log stored here was opened)
            log.info("%s: the journal's records of %s: its replica is gone", self.id, key)
        if wanted:
            self.journal.restart()
        else:
            self.journal.remove()
            self.journal = None

    def _replay(self, group: str) -> list[Section]:
        """What the journal holds of `group`'s log, for its opening (given out once)."""
        return self.journal.take(group) if self.journal is not None else []

    def _open_groups(self) -> None:
        voters = self.initial_metadata_voters()
        if self.storage.exists(None) or self.id in voters:
            self._host_metadata(ConfState(voters if self.id in voters else ()))
        for topic, partition in self.storage.partitions():
            created = self.storage.topic_identity(topic, partition)
            if created is not None and self._topic_deleted(topic, created):
                log.info(
                    "removing %s/%d: its topic (created at metadata index %d) was deleted",
                    topic,
                    partition,
                    created,
                )
                self.storage.remove(topic, partition)
                continue
            # a topic the metadata does not know (yet): its replica is hosted all the
            # same; the metadata this node replayed may be behind the cluster's
            self._host(topic, partition, self._reopen_bootstrap(topic, partition, created))

    def close(self) -> None:
        for replica in self.all_replicas():
            replica.close()  # (each syncs what it wrote through the journal)
        if self.journal is not None:
            self.journal.close()

    def refuse_proposals(self) -> None:
        self.stopping = True
        for replica in self.all_replicas():
            replica.refuse_proposals()

    def initial_metadata_voters(self) -> tuple[str, ...]:
        """The metadata group's bootstrap voters: placement's pick among the initial nodes;
        without them, a broker started alone is its one voter (a joining one: none). A
        broker's vote is its worker 0's (docs/workers.md): its other workers never bootstrap
        the group themselves (they would each found a metadata group of their own), they
        learn it from worker 0."""
        nodes = self.config.initial_nodes or (() if self.config.joins else (broker_of(self.id),))
        return tuple(sorted(metadata_voters(Candidate(n) for n in nodes)))

    def _log_config(self, overrides: Mapping[str, object] | None = None) -> LogConfig:
        settings: dict[str, object] = {"segment_bytes": self.config.segment_bytes}
        settings.update((k, v) for k, v in (overrides or {}).items() if k in LOG_CONFIG_KEYS)
        settings["fsync"] = self.config.fsync
        return LogConfig(**settings)  # type: ignore[arg-type]

    def _host_metadata(self, bootstrap: ConfState, *, repair_at: int | None = None) -> None:
        replica = Replica(
            METADATA_GROUP,
            0,
            self.id,
            self.storage.directory(None),
            self._log_config(),
            self.raft_config,
            bootstrap,
            group=METADATA_GROUP,
            queues=False,
            commit_save_indexes=1,  # a restart replays the metadata up to its commit
            repair_at=repair_at,
            seed=self._seed(METADATA_GROUP),
            replay=self._replay(METADATA_GROUP),
        )
        self._opened(replica)
        self.meta = replica
        self.multi.add(replica.raft)
        state, applied = self.state, self.meta_applied_index
        self._restore_metadata()
        storage = replica.storage
        commit = storage.initial_state()[0].commit
        if commit >= storage.first_index():
            # replaying what this node applied before: its replicas are on disk already
            self._replaying = True
            try:
                self._apply_metadata(storage.first_index(), commit)
            except (CorruptBatchError, StorageUnavailable):
                # a committed entry is damaged on disk: the replica reopens with its log
                # cut there (`_on_damage` asked for it), and replays again up to the cut
                if replica.damaged_at is None:
                    raise
            finally:
                self._replaying = False
        if state.applied_index > self.state.applied_index:
            # reopened after a repair cut committed entries: what was applied stays applied
            self.state, self.meta_applied_index = state, applied

    def _seed(self, group: str) -> int | None:
        if self.seed is None:
            return None
        return zlib.crc32(f"{self.seed}/{self.id}/{group}".encode())

    def _restore_metadata(self) -> None:
        assert self.meta is not None
        snapshot = self.meta.storage.snapshot()
        self.state = ClusterState.restore(snapshot.data) if snapshot.data else ClusterState()
        self.meta_applied_index = snapshot.index

    def _reopen_bootstrap(self, topic: str, partition: int, created: int | None) -> ConfState:
        """The configuration a replica found on disk is opened with, used only when it never
        saved its Raft state (created just before a crash): the partition's initial voters,
        as when it was created (safe for a member with an empty log: nothing it never
        persisted was counted in a quorum), or none while the topic is unknown."""
        known = self.state.topics.get(topic)
        found = self._assignment_conf(f"{topic}/{partition}")
        if known is None or found is None or created not in (None, known.created_index):
            return ConfState(())
        return found[2]

    def _topic_deleted(self, topic: str, created_index: int) -> bool:
        """Has this node applied the deletion of the topic created at `created_index`?"""
        state = self.state
        current = state.topics.get(topic)
        replaced = current is None or current.created_index != created_index
        return state.applied_index >= created_index and replaced

    # ---- hosting groups --------------------------------------------------------------------

    def _host(
        self,
        topic: str,
        partition: int,
        bootstrap: ConfState,
        *,
        repair_at: int | None = None,
        joining: bool = False,
    ) -> Replica:
        group = f"{topic}/{partition}"
        replica = Replica(
            topic,
            partition,
            self.id,
            self.storage.directory(topic, partition),
            self._log_config(),
            self.raft_config,
            bootstrap,
            max_pending_bytes=self.config.max_pending_bytes_per_partition,
            repair_at=repair_at,
            joining=joining,
            seed=self._seed(group),
            replay=self._replay(group),
        )
        self._opened(replica)
        self.replicas[replica.group] = replica
        replica.on_commit_wanted = self.wake
        if replica.groups is not None:
            replica.groups.on_propose = self.wake
            replica.groups.on_malformed = partial(self.report_malformed, replica.group)
        self._hosted_at_ms[replica.group] = self.now_ms
        self.multi.add(replica.raft)
        if (topic_state := self.state.topics.get(topic)) is not None:
            self._adopt(replica, topic_state)
        log.info("%s hosts %s (conf %s)", self.id, replica.group, replica.raft.conf)
        return replica

    def _adopt(self, replica: Replica, topic: Topic) -> None:
        """`replica` belongs to `topic` (unless it is marked as another topic of the same
        name): record that, and take the topic's log settings."""
        if replica.topic_created_index is None:
            replica.bind_topic(topic.created_index)
        if replica.topic_created_index == topic.created_index:
            replica.log.config = self._log_config(topic.config)

    def _opened(self, replica: Replica) -> None:
        """Report what opening `replica` repaired; listen for damage found later, and for
        disk work its storage plans (`_pending`)."""
        replica.on_damage = self._on_damage
        storage = replica.storage
        storage.on_pending = partial(self._pending.__setitem__, replica.group, None)
        if storage.planned or storage.needs_sync:
            self._pending[replica.group] = None
        for damage in replica.repairs:
            self.counters["repairs"] += 1
            if damage.data_loss:
                self.counters["data_loss_repairs"] += 1
                log.error(
                    "%s: %s: %s; records from %d on are lost (it has no other voter to fetch "
                    "them from)",
                    self.id,
                    replica.group,
                    damage.reason,
                    damage.first_index,
                )
            else:
                log.error(
                    "%s: %s: %s; the log is cut at %d and fetched again from the leader (it "
                    "had reached %s; until then this replica neither leads nor votes below it)",
                    self.id,
                    replica.group,
                    damage.reason,
                    damage.first_index,
                    damage.floor,
                )

    def report_malformed(self, group: str, path: str, first: int, end: int, reason: str) -> None:
        """Records [first, end) of `group` are malformed (a valid checksum, broken framing:
        stored before appends checked records) and `path` went past them: a read answered 422,
        an acquire skipped them, the dead-letter mover moved a letter without its record. Log
        and count each once (a reader that retries is not news; `reason` names the consumer
        group that skipped them)."""
        key = (group, path, first, reason)
        if key in self._malformed_seen:
            return
        if len(self._malformed_seen) >= MALFORMED_SEEN_LIMIT:
            self._malformed_seen.clear()
        self._malformed_seen.add(key)
        self.malformed_records[path] = self.malformed_records.get(path, 0) + end - first
        log.warning(
            "%s: %s: records %d..%d are malformed and skipped (%s): %s",
            self.id,
            group,
            first,
            end - 1,
            path,
            reason,
        )

    def _on_damage(self, replica: Replica, index: int) -> None:
        """A read met a damaged batch of `replica`: reopen it repaired (next round), unless
        it is its group's only voter (then reads of that batch are refused, and it stays)."""
        self.counters["corrupt_batches"] += 1
        repairable = replica.repairable
        log.error(
            "%s: %s: batch %d is damaged on disk%s",
            self.id,
            replica.group,
            index,
            "; repairing the replica" if repairable else " and this is its only replica",
        )
        if repairable:
            self._repair_later(replica, index)

    def _repair_later(self, replica: Replica, index: int) -> None:
        self._damaged[replica.group] = min(index, self._damaged.get(replica.group, index))
        self.wake()

    def _repair_damaged(self) -> None:
        """Reopen each damaged replica with its log cut at the damage (between rounds)."""
        damaged, self._damaged = self._damaged, {}
        for group, index in sorted(damaged.items()):
            replica = self.replica_of(group)
            if replica is None or replica.closed or self.stopping:
                continue
            self._unhost(replica)
            replica.close()
            conf = replica.raft.conf  # bootstraps the reopened group if it never saved one
            if group == METADATA_GROUP:
                self._host_metadata(conf, repair_at=index)
            else:
                self._host(replica.topic, replica.partition, conf, repair_at=index)

    def _unhost(self, replica: Replica) -> None:
        self.multi.remove(replica.group)
        if replica is not self.meta:
            self.replicas.pop(replica.group, None)
        self._status.pop(replica.group, None)
        self.movers_wanted.discard(replica.group)

    def _drop(self, replica: Replica) -> None:
        log.info("%s drops %s", self.id, replica.group)
        self._unhost(replica)
        with contextlib.suppress(*STORAGE_FAILURES):
            replica.close()  # (what closing would save is deleted next)
        self.storage.remove(replica.topic, replica.partition)

    def collect_removed(self, leaders: Mapping[str, Mapping[str, object]]) -> list[str]:
        """Drop replicas whose group's leader (`leaders`: fresh reports of the leader of each
        group, from other brokers) no longer counts us as a member, seen twice in a row: a
        removed replica may never learn of its removal from Raft (the leader stops talking
        to it once the change commits).

        Not while the replica holds entries of the report's term past the report's commit:
        the report is older than what that leader has sent us since, which may be our
        adding back (a leader whose target flaps removes and re-adds a member within one
        status round). Dropping then would throw away a log the leader counts as ours: the
        new, empty replica would be promoted on the old one's acknowledgements, a voter
        holding nothing."""
        excluded = set()
        now = self.now_ms
        for group, replica in self.replicas.items():
            report = leaders.get(group)
            if report is None or replica.raft.role is Role.LEADER:
                continue
            members = set(report["voters"]) | set(report["learners"])  # type: ignore[call-overload]
            hosted_ms = now - self._hosted_at_ms.get(group, now)
            term = int(report["term"])  # type: ignore[call-overload]
            log_ = replica.raft.log
            newer = log_.last_index() > int(report["commit_index"]) and log_.last_term() >= term  # type: ignore[call-overload]
            current = term >= replica.raft.term and not newer
            if self.id not in members and current and hosted_ms > self.config.removed_grace_ms:
                excluded.add(group)
        dropped = sorted(excluded & self._excluded)
        self._excluded = excluded - set(dropped)
        for group in dropped:
            found = self.replicas.get(group)
            if found is not None:
                self._drop(found)
        return dropped

    def _assignment_conf(self, group: str) -> tuple[str, int, ConfState] | None:
        topic_name, _, number = group.rpartition("/")
        topic = self.state.topics.get(topic_name)
        if topic is None or not (number.isascii() and number.isdigit()):
            return None
        if int(number) >= len(topic.assignment):
            return None  # (the assignment lists every partition of a topic it knows)
        partition = int(number)
        return topic_name, partition, ConfState(tuple(sorted(topic.assignment[partition])))

    def _maybe_host_for(self, group: str, kind: MT) -> bool:
        """A message for a group we do not host: a leader added us to it, if a leader sent
        it. The replica starts joining (it neither campaigns nor votes until it holds an
        entry a leader wrote): the message may be a stale one, reaching us after our removal
        from the group (and after we dropped our replica), and the configuration it starts
        with is only the group's initial one. Nothing else creates a replica: a removed
        member still campaigning must find no voter here."""
        if group == METADATA_GROUP:
            if self.meta is None:
                # the group's bootstrap configuration, as its initial voters saved it: the
                # conf changes of its log apply on top of it (unknown without initial
                # nodes: then only a snapshot, `_control`'s compaction, brings the conf)
                self._host_metadata(ConfState(self.initial_metadata_voters()))
            return True
        found = self._assignment_conf(group)
        if found is None or self.stopping or kind not in LEADER_MESSAGES:
            return False
        topic, partition, conf = found
        self._host(topic, partition, conf, joining=True)
        return True

    def all_replicas(self) -> list[Replica]:
        return ([self.meta] if self.meta is not None else []) + list(self.replicas.values())

    def replica(self, topic: str, partition: int) -> Replica | None:
        return self.replicas.get(f"{topic}/{partition}")

    def replica_of(self, group: str) -> Replica | None:
        return self.meta if group == METADATA_GROUP else self.replicas.get(group)

    # ---- membership ------------------------------------------------------------------------

    def members(self) -> dict[str, Member]:
        """id -> (status, api address, peer address), this node included (as alive)."""
        out = dict(self.membership())
        found = out.get(self.id)
        out[self.id] = (MemberStatus.ALIVE, *(found[1:] if found else ("", "")))
        return out

    def alive(self) -> set[str]:
        """The members SWIM counts as alive (suspects included), this node included."""
        alive = {
            node
            for node, (status, _, _) in self.membership().items()
            if status in (MemberStatus.ALIVE, MemberStatus.SUSPECT)
        }
        return alive | {self.id}

    def candidates(self) -> list[Candidate]:
        """Every known broker, with its workers (`laminar.workers`), alive for placement
        (`counts_for_placement`) unless it died more than `dead_grace_ms` ago. A drained
        worker other than worker 0 (whose id is the broker's: draining it drains the broker)
        is left out of its broker's workers, so that the partitions it owns move to the
        others, as a drained broker's do."""
        now = self.now_ms
        members = self.members()
        draining = self.state.draining
        unheard = self.unheard()
        workers: dict[str, list[str]] = {broker: [] for broker in unheard}
        for node in members:
            broker = broker_of(node)
            workers.setdefault(broker, [])
            if node == broker or node not in draining:
                workers[broker].append(node)
        mine = broker_of(self.id)
        out = []
        for broker, nodes in sorted(workers.items()):
            status = members[broker][0] if broker in members else MemberStatus.DEAD
            away_ms = unheard.get(broker, now - self._away_since_ms.get(broker, now))
            alive = counts_for_placement(status, away_ms, self.config.dead_grace_ms)
            out.append(
                Candidate(
                    broker,
                    self.state.weight(broker),
                    alive=alive or broker == mine,
                    draining=broker in self.state.draining,
                    workers=tuple(sorted(nodes)) if nodes != [broker] else (),
                )
            )
        return out

    def away(self) -> dict[str, tuple[MemberStatus, int, bool]]:
        """The brokers SWIM reports dead or left: each one's state, how long ago (ms) this
        node saw it go, and whether placement still counts it, so that its replicas stay
        where they are (`counts_for_placement`): one that left, until it is back; a dead
        one, until `dead_grace_ms` have passed (then placement replaces it)."""
        now = self.now_ms
        out: dict[str, tuple[MemberStatus, int, bool]] = {}
        for node, (status, _, _) in sorted(self.members().items()):
            if node != broker_of(node) or status not in (MemberStatus.DEAD, MemberStatus.LEFT):
                continue
            away_ms = now - self._away_since_ms.get(node, now)
            kept = counts_for_placement(status, away_ms, self.config.dead_grace_ms)
            out[node] = (status, away_ms, kept)
        for node, away_ms in self.unheard().items():  # (counted as dead since first looked for)
            kept = counts_for_placement(MemberStatus.DEAD, away_ms, self.config.dead_grace_ms)
            out[node] = (MemberStatus.DEAD, away_ms, kept)
        return dict(sorted(out.items()))

    def unheard(self) -> dict[str, int]:
        """The brokers of the metadata group's configuration that SWIM has not heard from
        (yet), or has forgotten: each one with how long ago (ms) this node first looked for
        it (or saw it go). Placement counts such a broker as one that died then
        (`counts_for_placement`): one still starting keeps its replicas and its metadata vote
        for `dead_grace_ms`. The first brokers of a cluster up, seeing only each other, used
        to take it out of the metadata group at once, leaving two voters that the loss of
        either stopped until it was back and promoted again."""
        meta = self.meta
        if meta is None:
            return {}
        members = self.membership()
        missing = {broker_of(n) for n in meta.raft.conf.members()} - set(members) - {self.id}
        for broker in set(self._unheard_since_ms) - missing:
            del self._unheard_since_ms[broker]
        now = self.now_ms
        out = {}
        for broker in sorted(missing):
            # (one SWIM forgot, dead a while: since it was seen go)
            since = self._away_since_ms.get(broker, now)
            out[broker] = now - self._unheard_since_ms.setdefault(broker, since)
        return out

    # ---- the round -------------------------------------------------------------------------

    def begin(self) -> Round | None:
        """Repair, step what arrived, tick, control, then plan the writes of one Ready of
        every group and apply what committed and is stored already; None when there is
        nothing to do."""
        if self._damaged:
            self._repair_damaged()
        self._step_inbox()
        ticks, self._ticks_due = min(self._ticks_due, MAX_TICKS_PER_ROUND), 0
        for _ in range(ticks):
            self.multi.tick()
        if self._control_due or self.now_ms - self._control_at_ms >= CONTROL_INTERVAL_MS:
            self._control_due = False
            self._control_at_ms = self.now_ms
            self._control()
        self.barriers.ask(self.meta.raft if self.meta is not None else None, self.now_ms)
        readies, messages = self.multi.ready()
        interval_sync = (
            self.config.fsync is FsyncPolicy.INTERVAL and self.now_ms >= self._next_sync_ms
        )
        staged = any(r.storage.needs_sync for r in self._pending_replicas())
        if not readies and not messages and not interval_sync and not staged:
            return None
        round_ = self._write(readies, messages)
        if interval_sync:
            # fsync policy `interval`: every log now (acks went out before)
            self._next_sync_ms = self.now_ms + self.config.fsync_interval_ms
        always = self.config.fsync is FsyncPolicy.ALWAYS
        replicas = self.all_replicas() if interval_sync else self._pending_replicas()
        journaled = self._plan_journal(round_, replicas)
        sections = []
        for replica in replicas:
            # one job per storage: write its entries, then fdatasync it if the fsync policy
            # asks (unless the journal's record holds them), or if files are staged
            # (checkpoints this round's applying wrote among them)
            storage = replica.storage
            planned = storage.planned
            if replica.group in journaled:
                flush, entries = storage.flush_journaled()
                round_.syncs.append(flush)
                journal_entries = [(e.index, e.term, e.data) for e in entries]
                sections.append((replica.group, storage.journal_epoch, journal_entries))
                self._journaled[replica.group] = storage
                continue
            sync = (planned and always) or interval_sync or storage.needs_sync
            if planned or sync:
                round_.syncs.append(storage.flush(sync=sync))
        if self.journal is not None and (sections or round_.journal_header is not None):
            if sections:
                round_.syncs.append(self.journal.write_round(sections, round_.journal_header))
            else:
                assert round_.journal_header is not None
                round_.syncs.append(self.journal.header_flush(round_.journal_header))
        self.counters["fsyncs"] += sum(1 for flush in round_.syncs if flush.syncs)
        self.counters["fsyncs"] += len(round_.checkpoint) + len(round_.background)
        round_.answers, self._answers = self._answers, []
        round_.barriers, self.barriers.passed = self.barriers.passed, []
        round_.movers = sorted(self.movers_wanted)
        self.movers_wanted.clear()
        return round_

    def _plan_journal(self, round_: Round, replicas: list[Replica]) -> set[str]:
        """The groups whose planned entries this round makes durable through the journal
        (every one that may: not more than `max_journaled_bytes`, unless it must), with the
        journal's checkpoints:

        * Once the journal wants one, the logs written through it so far are synced beside
          the rounds (`Round.background`); once they are, the next round's record carries the
          header that moves the journal's start past their records (`_synced`), and the
          space is free once that round is done (`_moved`).
        * If a record does not fit, that round syncs them all first (`Round.checkpoint`),
          then writes the header, then its record; none is journaled if it would not fit
          an empty ring.

        A log with records in the journal from before a cut is never written around the
        journal (`LogStorage.must_journal`): a replay would undo the write."""
        journal = self.journal
        if journal is None:
            return set()
        most = self.config.max_journaled_bytes
        chosen = [
            r
            for r in replicas
            if r.storage.planned
            and r.storage.journals
            and (r.storage.planned_bytes <= most or r.storage.must_journal)
        ]
        body = sum(
            journal.body_bytes(r.group, [len(e.data) for e in r.storage.planned_entries])
            for r in chosen
        )
        if chosen and not journal.fits(body):
            self._checkpoint_now(round_, journal)
            if not journal.fits(body):
                return set()  # (its logs sync themselves: none has live records now)
        elif self._synced is not None:
            start, cuts = self._synced
            self._synced = None
            round_.journal_header = journal.header_to(start)
            if round_.journal_header is not None:
                round_.journal_moved = partial(self._moved, start, cuts)
        elif chosen and self._syncing is None and journal.wants_checkpoint:
            storages = self._journaled.values()
            jobs = [job for st in storages if (job := st.sync_job(writeback=True)) is not None]
            cuts = {storage: storage.cuts for storage in storages}
            self._journaled.clear()
            self._checkpoints += 1
            self._syncing, self._syncing_cuts = self._checkpoints, cuts
            round_.background = jobs
            round_.background_done = partial(
                self._synced_logs, self._checkpoints, journal.mark(), cuts
            )
        return {r.group for r in chosen}

    def _checkpoint_now(self, round_: Round, journal: Journal) -> None:
        """A checkpoint this round carries out first: every log written through the journal
        since its start synced (those of a checkpoint beside the rounds too), then the header
        moving its start past every record; the checkpoint beside the rounds is void."""
        storages = set(self._journaled.values())
        for pending in (self._syncing_cuts, self._synced[1] if self._synced else None):
            storages.update(pending or ())
        for storage in storages:
            if (job := storage.sync_job(writeback=False)) is not None:
                round_.checkpoint.append(job)
            storage.covered(storage.cuts)
        self._journaled.clear()
        self._syncing, self._syncing_cuts, self._synced = None, None, None
        round_.checkpointed = journal.begin_checkpoint()

    def _synced_logs(
        self, checkpoint: int, start: tuple[int, int], cuts: dict[LogStorage, int]
    ) -> None:
        """The logs of checkpoint number `checkpoint` are synced (off the event loop): the
        next round moves the journal's start to `start`."""
        if self._syncing != checkpoint:
            return  # (a round checkpointed everything meanwhile)
        self._syncing, self._syncing_cuts = None, None
        self._synced = (start, cuts)
        self.wake()

    def _moved(self, start: tuple[int, int], cuts: dict[LogStorage, int]) -> None:
        """The header moving the journal's start to `start` is durable (its round is done)."""
        assert self.journal is not None
        self.journal.moved(start)
        for storage, count in cuts.items():
            storage.covered(count)

    def _pending_replicas(self) -> list[Replica]:
        """The hosted replicas whose storage has planned writes or staged files (the others
        are forgotten from `_pending`, and report again when they have some)."""
        out = []
        for group in list(self._pending):
            replica = self.replica_of(group)
            if replica is None or not (replica.storage.planned or replica.storage.needs_sync):
                del self._pending[group]
            else:
                out.append(replica)
        return out

    def _step_inbox(self) -> None:
        inbox, self._inbox = self._inbox, []
        for message in inbox:
            self.step(message)

    def step(self, message: Message) -> None:
        """Step one message from a peer now, hosting its group first if a leader added this
        node to it (`_maybe_host_for`); `receive` is the same, deferred to the next round."""
        folded = message.type in (MT.HEARTBEATS, MT.HEARTBEATS_RESP)
        for part in message.batch if folded else (message,):
            if part.group not in self.multi.groups and not self._maybe_host_for(
                part.group, part.type
            ):
                self.counters["dropped_messages"] += 1
        self.multi.step(message)

    def _write(self, readies: dict[str, Ready], messages: list[Message]) -> Round:
        """Install every Ready's snapshot, plan writing its entries (`syncs` writes them off
        the event loop), and apply what committed and is stored here already (durable on a
        majority: its appends are answered now, not after this round's writes and fsync of
        newer entries); what committed among this round's entries waits for `stored`."""
        if readies:
            self.counters["ready_rounds"] += 1
        gone = {group for group in readies if self.replica_of(group) is None}
        steps = plan(readies, messages, gone)  # raft/round.py: the steps, in their order
        round_ = Round(readies, before=steps.before, after=steps.after)
        for group, ready in readies.items():
            replica = self.replica_of(group)
            if replica is None:
                continue
            storage = replica.storage
            if ready.snapshot is not None:
                storage.apply_snapshot(ready.snapshot)
                if replica is self.meta:
                    before = self.state
                    self._restore_metadata()
                    self._host_learned(before)
                elif replica.groups is not None:
                    replica.groups.reset()
            if ready.entries:
                storage.write_later(ready.entries)
                if replica.groups is not None:
                    replica.groups.applier.written(ready.entries)
        for group, ready in readies.items():
            if ready.committed is None:
                continue
            first, last = ready.committed
            replica = self.replica_of(group)
            stored_last = last if replica is None else replica.storage.last_index()
            if first <= min(last, stored_last):
                self._apply(group, first, min(last, stored_last))
            if last > stored_last:
                # committed entries are applied only once stored here (as etcd's raft does)
                round_.unstored[group] = (max(first, stored_last + 1), last)
        if (meta_ready := readies.get(METADATA_GROUP)) is not None and meta_ready.read_states:
            self.barriers.answered(meta_ready.read_states)
        if self.barriers.waiting:
            self.barriers.release(self.meta_applied_index, self.now_ms)
        return round_

    def stored(self, round_: Round) -> None:
        """The round's `syncs` ran (off the event loop): publish what they wrote, apply what
        committed among it, and list the saves the round needs (`saves`, run off the loop
        next); the answers and barriers this passes join the round's."""
        for flush in round_.syncs:
            flush.publish()
        if round_.journal_moved is not None:
            round_.journal_moved()
        for group, (first, last) in round_.unstored.items():
            self._apply(group, first, last)
        if self.barriers.waiting:
            self.barriers.release(self.meta_applied_index, self.now_ms)
        for group, ready in round_.readies.items():
            replica = self.replica_of(group)
            if replica is None or ready.hard_state is None:
                continue
            storage = replica.storage
            if storage.saves_durably(ready.hard_state):
                # term, vote or configuration changed: written and fsynced off the loop
                round_.saves.append(partial(storage.set_hard_state, ready.hard_state))
            else:
                storage.set_hard_state(ready.hard_state)  # memory, or the unsynced hint
        round_.answers += self._answers
        self._answers = []
        round_.barriers += self.barriers.passed
        self.barriers.passed = []

    def finish(self, round_: Round) -> None:
        """The round was carried out (synced, saved, sent): advance every group."""
        self.multi.advance(round_.readies)
        self._observe(round_.readies)

    def _observe(self, readies: dict[str, Ready]) -> None:
        """Count elections and leader changes; tell replicas about leadership."""
        for group in readies:
            raft = self.multi.groups.get(group)
            if raft is None:
                continue
            before = self._status.get(group)
            if (before is None or before.lead != raft.lead) and raft.lead is not None:
                self.counters["leader_changes"] += 1
            if raft.role is Role.CANDIDATE and (before is None or before.term != raft.term):
                self.counters["elections"] += 1
            self._status[group] = GroupStatus(raft.role, raft.lead, raft.term)
            replica = self.replica_of(group)
            if replica is not None:
                with contextlib.suppress(CorruptBatchError):
                    # a new leader reads its newest batch headers: damage there was reported
                    # (on_damage) and the replica reopens repaired next round
                    replica.on_leadership()

    # ---- applying committed entries --------------------------------------------------------

    def _apply(self, group: str, first: int, last: int) -> None:
        replica = self.replica_of(group)
        # committed entries are applied only once stored here (`_write`, `stored`): what a
        # write in flight holds is not in the log yet, and reading past it would skip it
        assert replica is None or last <= replica.storage.last_index(), (
            f"{group}: committed entries up to {last} applied before they are stored "
            f"(the log ends at {replica.storage.last_index()})"
        )
        try:
            if group == METADATA_GROUP:
                self._apply_metadata(first, last)
            if replica is not None:
                replica.on_committed(first, last)
        except (CorruptBatchError, StorageUnavailable):
            # a committed entry its state machine must read is damaged: the replica reopens
            # with its log cut there (an only voter loses what follows), then applies again
            if replica is None or replica.damaged_at is None:
                raise
            self._repair_later(replica, replica.damaged_at)

    def _apply_metadata(self, first: int, last: int) -> None:
        assert self.meta is not None
        storage = self.meta.storage
        first = max(first, storage.first_index(), self.meta_applied_index + 1)
        if first > last:
            return
        for entry in stored_entries(storage, first, last):
            self.meta_applied_index = entry.last_index
            if entry.index <= self.state.applied_index:
                continue
            if entry.kind is not EntryKind.NORMAL:
                continue
            (record,) = decode_batch(entry.data)
            assert record.value is not None
            command = decode_command(record.value)
            result = self.state.apply(entry.index, command)
            if entry.index in self._meta_waiting:
                self._meta_waiting.discard(entry.index)
                self._answers.append((entry.index, entry.term, result))
            if result is None:
                self._after_metadata(command)
        self.meta_applied_index = max(self.meta_applied_index, last)
        self._control_due = True

    def _after_metadata(self, command: Command) -> None:
        """Host a created topic's partitions; a deleted topic's replicas go in `_control`."""
        if not isinstance(command, CreateTopic | AlterTopic):
            return
        topic = self.state.topics[command.name]
        for replica in self.replicas.values():
            if replica.topic == command.name:
                self._adopt(replica, topic)
        if self._replaying:
            return
        made = len(command.assignment) if isinstance(command, AlterTopic) else topic.partitions
        self._host_initial(topic, topic.partitions - made)

    def _host_initial(self, topic: Topic, first: int) -> None:
        """Host the partitions of `topic` from `first` on that this node is an initial voter
        of and has just learned of, from the command that made them or from a snapshot that
        holds them (replicas placed later are created when their leader first reaches this
        node). Only those: a partition this node left since has a group without it, and a
        replica made again from its initial voters would be a voter with an empty log, which
        could elect another such member beside the group's real leader."""
        for partition in range(first, topic.partitions):  # (the assignment lists them all)
            voters = topic.assignment[partition]
            group = f"{topic.name}/{partition}"
            if self.id in voters and group not in self.replicas and not self.stopping:
                self._host(topic.name, partition, ConfState(tuple(sorted(voters))))

    def _host_learned(self, before: ClusterState) -> None:
        """The metadata snapshot just installed made `before` the state it holds: host the
        partitions it holds that `before` did not, as applying the commands that made them
        would have. A member that learned a topic from a snapshot, never from its command,
        would otherwise never host its partitions, and two such voters of a partition leave
        it without a leader for good."""
        for topic in self.state.topics.values():
            known = before.topics.get(topic.name)
            if known is not None and known.created_index == topic.created_index:
                self._host_initial(topic, known.partitions)
            else:
                self._host_initial(topic, 0)

    # ---- metadata commands -----------------------------------------------------------------

    @property
    def metadata_leader(self) -> str | None:
        return self.meta.raft.lead if self.meta is not None else None

    def propose_metadata(self, command: Command) -> tuple[int, int]:
        """Propose an admin command to the metadata group (leader only): its (index, term);
        its result comes in a round's `answers` once applied. Raises MetadataError (invalid),
        NotLeader or ReplicaClosed."""
        meta = self.meta
        if meta is not None and (meta.closed or meta.closing):
            raise ReplicaClosed(f"{meta.group} is closed")
        if meta is None or meta.raft.role is not Role.LEADER:
            raise NotLeader(self.metadata_leader)
        if (
            isinstance(command, CreateTopic)
            and not command.assignment
            and _valid_int(command.partitions, MAX_PARTITIONS)
            and _valid_int(command.replication_factor, MAX_REPLICATION_FACTOR)
        ):
            command = replace(command, assignment=self._assign(command.name, 0, command))
        if isinstance(command, AlterTopic) and _valid_int(command.partitions, MAX_PARTITIONS):
            topic = self.state.topics.get(command.name)
            assert command.partitions is not None
            if topic is not None and command.partitions > topic.partitions:
                extra = self._assign(command.name, topic.partitions, command)
                command = replace(command, assignment=extra)
        validate_proposal(command)
        batch = encode_batch([Record(value=encode_command(command))])
        try:
            index = meta.raft.propose(batch, 1)
        except ProposalDropped as e:
            raise NotLeader(meta.raft.lead) from e
        self._meta_waiting.add(index)
        return index, meta.raft.term

    def forget_proposal(self, index: int) -> None:
        """The proposer stopped waiting for metadata entry `index`."""
        self._meta_waiting.discard(index)

    def _assign(
        self, topic: str, first: int, command: CreateTopic | AlterTopic
    ) -> tuple[tuple[str, ...], ...]:
        if isinstance(command, CreateTopic):
            partitions, rf = command.partitions, command.replication_factor
        else:
            assert command.partitions is not None
            partitions, rf = command.partitions, self.state.topics[topic].replication_factor
        candidates = self.candidates()
        eligible = [c for c in candidates if c.eligible]
        if len(eligible) < rf:
            raise MetadataError(
                "invalid",
                f"replication_factor={rf} but only {len(eligible)} brokers can host replicas",
            )
        # Initial voters create their replicas as they learn of this command (from the log,
        # or from a snapshot: `_host_learned`); a worker yet to receive any metadata would
        # only do so later. Such a broker's partitions go to its workers that hold the
        # metadata log, and placement control moves them on once the others have it.
        assert self.meta is not None
        progress = self.meta.raft.progress
        ready = {self.id} | {n for n, p in progress.items() if p.match >= 0}
        candidates = [
            replace(c, workers=tuple(w for w in c.workers if w in ready) or c.workers[:1])
            for c in candidates
        ]
        # A broker that left keeps its place (`counts_for_placement`), so new partitions are
        # placed on it too, and are under-replicated until it is back; but one whose
        # replicas would be mostly on such brokers could not elect a leader before: it goes
        # to brokers that are up instead, when there are enough (once the others are back,
        # placement may move it to them, as it does to a new broker).
        members = self.members()
        left = {
            node
            for node, (status, _, _) in members.items()
            if status is MemberStatus.LEFT and node == broker_of(node)
        }
        up = [replace(c, alive=False) if c.id in left else c for c in candidates]
        out = []
        for partition in range(first, partitions):
            key = f"{topic}/{partition}"
            voters = hosts(key, candidates, rf)
            away = sum(1 for v in voters if broker_of(v) in left)
            if away > (len(voters) - 1) // 2 and len(instead := hosts(key, up, rf)) == rf:
                voters = instead
            out.append(tuple(voters))
        return tuple(out)

    # ---- control: placement, hosting, compaction -------------------------------------------

    def _control(self) -> None:
        if self.stopping:
            return
        self.counters["control_passes"] += 1
        candidates = self.candidates()
        alive = self.alive()
        leaving = frozenset(n for n in alive if not self.takes_leadership(n))
        meta = self.meta
        if meta is not None:
            if meta.raft.role is Role.LEADER:
                target = metadata_voters(candidates)
                self._reconcile(meta, target, alive, leaving, followers=alive)
                progress = meta.raft.progress
                if any(p.match < 0 for n, p in progress.items() if n != self.id):
                    # a member with nothing yet learns the metadata from a snapshot, never
                    # from a log that starts before its bootstrap
                    self._compact_metadata(force=True)
            self._compact_metadata()
        strictly_alive = self._wake_quiesced()
        ready = frozenset(
            n for n in self.balance.observe(alive, self._ticks) if self.takes_leadership(n)
        )
        budget = self.balance.transfers_per_pass
        plans: dict[str, TopicPlan] = {}
        for replica, swept in self._control_visits():
            raft = replica.raft
            if self._collect_unowned(replica):
                continue
            if swept and self._sweep_retains:
                self._apply_retention(replica)
            topic_state = self.state.topics.get(replica.topic)
            if topic_state is None:
                continue
            plan = plans.get(topic_state.name)
            if plan is None:
                plan = plans[topic_state.name] = self._plan(topic_state, candidates)
            partition = replica.partition
            if partition >= len(plan.targets):
                continue  # (the topic's assignment lists every partition it has)
            preferred = plan.preferred[partition]
            if raft.role is Role.LEADER:
                settled = not raft.conf.learners and raft.conf.voters == plan.voters[partition]
                if not settled:  # (a settled group has no step to take)
                    target = list(plan.targets[partition])
                    self._reconcile(replica, target, alive, leaving, followers=frozenset())
                if self._has_queue_duties(replica, topic_state):
                    self._queue_duties(replica, topic_state)
                if settled and budget > 0 and self._rebalance(replica, preferred, ready):
                    budget -= 1
            else:
                self._prefer(replica, preferred, strictly_alive)
        self.balance.forget(self.replicas.keys())
        for group in self.movers_wanted:
            # a round hands the wanted movers over: a quiesced group's leader makes one at
            # its next tick (its quiesce request again), however idle the node is
            if (wanting := self.replicas.get(group)) is not None:
                wanting.raft.wake()
        # A replica whose own configuration no longer counts it is not dropped here: a
        # member removed and added again passes through its removal while it catches up
        # (its leader already counts its acknowledgements). Only its leader's word removes
        # it (`collect_removed`).

    def _plan(self, topic: Topic, candidates: list[Candidate]) -> TopicPlan:
        """`topic`'s targets and preferred leaders for `candidates` (computed once per view
        of the members)."""
        key = (topic.partitions, topic.replication_factor, tuple(candidates))
        plan = self._plans.get(topic.name)
        if plan is None or plan.key != key:
            if len(self._plans) > 2 * len(self.state.topics) + 16:
                self._plans = {n: p for n, p in self._plans.items() if n in self.state.topics}
            plan = plan_topic(topic.name, topic.partitions, topic.replication_factor, candidates)
            self._plans[topic.name] = plan
        return plan

    def _rebalance(self, replica: Replica, preferred: str | None, ready: frozenset[str]) -> bool:
        """Hand a leadership to the group's preferred leader (`rebalance_to`), unless a move
        of this group was tried within the retry pause; True if a transfer started."""
        raft = replica.raft
        to = rebalance_to(raft, preferred, ready=ready, lag_indexes=CATCH_UP_LAG_INDEXES)
        if to is None or not self.balance.may_try(replica.group, self._ticks):
            return False
        try:
            raft.transfer_leadership(to)
        except ProposalDropped:
            return False
        self.counters["leader_rebalances"] += 1
        log.debug("%s hands %s to its preferred leader %s", self.id, replica.group, to)
        return True

    def _prefer(self, replica: Replica, preferred: str | None, strictly_alive: set[str]) -> None:
        """A follower: the group's preferred leader campaigns first when no leader is known
        (`Raft.eager`; once every voter is alive, else the view of the members, and so the
        preference, may be partial); on first sight of the group (new, or opened at start),
        the others defer their own elections to an alive preferred leader for a while (to
        anyone while this node has just started: SWIM may not know the others yet)."""
        raft = replica.raft
        raft.eager = (
            preferred == self.id
            and not self.leaving
            and strictly_alive.issuperset(raft.conf.voters)
        )
        if replica.group not in self._fresh or preferred == self.id:
            return
        leads_soon = preferred in strictly_alive and self.takes_leadership(preferred)
        if leads_soon or self._ticks < self.balance.defer_ticks:
            raft.defer_election(self.balance.defer_ticks)

    def _control_visits(self) -> list[tuple[Replica, bool]]:
        """The data replicas this control pass looks at, each with whether the sweep brings
        it: groups new since the last pass and the leaders with consumer groups, every time;
        the others in turn, a slice a pass, so that the sweep covers all of them every
        CONTROL_SWEEP_PASSES passes, or in slices of CONTROL_VISITS_PER_PASS (the work of a
        pass does not grow with the groups)."""
        replicas = self.replicas
        if len(self._seen) != len(replicas) or not self._seen.issuperset(replicas):
            self._fresh = replicas.keys() - self._seen
            self._seen = set(replicas)
        else:
            self._fresh = set()
        if self._swept >= len(self._sweep):
            self._sweep = list(replicas)
            self._swept = 0
            self._sweep_retains = self.now_ms - self._retained_at_ms >= RETENTION_INTERVAL_MS
            if self._sweep_retains:
                self._retained_at_ms = self.now_ms
        size = min(-(-len(self._sweep) // CONTROL_SWEEP_PASSES), CONTROL_VISITS_PER_PASS)
        chosen = self._sweep[self._swept : self._swept + size]
        self._swept += size
        visits: dict[str, tuple[Replica, bool]] = {}
        for group in sorted(self._fresh | self._queue_leaders):
            replica = replicas.get(group)
            if replica is not None and (group in self._fresh or replica.raft.role is Role.LEADER):
                visits[group] = (replica, False)
            else:
                self._queue_leaders.discard(group)
        for group in chosen:
            if (replica := replicas.get(group)) is not None:
                visits[group] = (replica, True)
        return list(visits.values())

    def _has_queue_duties(self, replica: Replica, topic: Topic) -> bool:
        """Does the leader `replica` have consumer-group duties (`_queue_duties`): consumer
        groups (leases to expire, dead letters), or settings to propose? Those with groups
        are visited every pass."""
        groups = replica.groups
        if groups is None:
            return False
        if groups.state.groups:
            self._queue_leaders.add(replica.group)
            return True
        self._queue_leaders.discard(replica.group)
        wanted = int(topic.config.get("max_deliveries", DEFAULT_MAX_DELIVERIES))
        return groups.state.config.max_deliveries != wanted

    def _alive_strictly(self) -> set[str]:
        """The members SWIM counts alive and not suspected, this node included."""
        alive = {n for n, (status, _, _) in self.membership().items() if status is ALIVE}
        return alive | {self.id}

    def _counts_alive(self, node: str) -> bool:
        """Does SWIM count `node` alive (a quiescing leader does not wait for members it
        does not)? Read once a tick."""
        if self._alive_now is None:
            self._alive_now = self.alive()
        return node in self._alive_now

    def _wake_quiesced(self) -> set[str]:
        """Wake the quiesced followers whose leader SWIM no longer counts alive (suspected
        included: their election timeout runs again), and the quiesced leaders of groups a
        node back alive belongs to; when who is alive changed, and every WAKE_SWEEP_TICKS in
        case a group quiesced under a leader already suspected. Returns the members alive."""
        alive = self._alive_strictly()
        changed = alive != self._alive_seen
        if changed or self._ticks - self._swept_at >= WAKE_SWEEP_TICKS:
            back = alive - self._alive_seen
            self._alive_seen = frozenset(alive)
            self._swept_at = self._ticks
            woken = self.multi.wake_orphans(alive)
            if back:
                woken += self.multi.wake_leaders_of(back)
            self.counters["quiesce_wakes"] += len(woken)
        return alive

    def _collect_unowned(self, replica: Replica) -> bool:
        """Drop `replica` if its topic's deletion is applied here; move it aside if it has no
        recorded topic and the metadata, caught up since it was hosted, does not know its
        topic. True if it went."""
        created = replica.topic_created_index
        if created is not None:
            if not self._topic_deleted(replica.topic, created):
                return False
            log.info("%s: %s: its topic was deleted", self.id, replica.group)
            self._drop(replica)
            return True
        if replica.topic in self.state.topics:
            return False  # hosted before its topic was known: _adopt records it
        if self.barriers.passed_ms <= self._hosted_at_ms.get(replica.group, 0):
            self.request_barrier()  # is the metadata behind, or is the topic unknown?
            return False
        self._quarantine(replica)
        return True

    def _quarantine(self, replica: Replica) -> None:
        """Move a replica of a topic the cluster does not know out of the way, keeping it."""
        self._unhost(replica)
        replica.close()
        target = self.storage.quarantine(replica.topic, replica.partition, self.wall_ms)
        self.counters["quarantined_replicas"] += 1
        log.error(
            "%s: %s belongs to no topic the cluster knows and recorded none itself: moved "
            "to %s (kept, not deleted)",
            self.id,
            replica.group,
            target,
        )

    def _queue_duties(self, replica: Replica, topic: Topic) -> None:
        """A partition leader's part in its consumer groups: settings, lease expiry, and
        asking for a mover of dead letters to `<topic>.dlq`."""
        groups = replica.groups
        assert groups is not None
        try:
            groups.configure(int(topic.config.get("max_deliveries", DEFAULT_MAX_DELIVERIES)))
            groups.expire_due(self.wall_ms)
        except (NotLeader, Overloaded):
            return
        if groups.dead_letters():
            self.movers_wanted.add(replica.group)

    def _apply_retention(self, replica: Replica) -> None:
        """Remove whole committed segments past the topic's retention: first record the
        snapshot point at their end (replicas needing older entries get a snapshot)."""
        config = replica.log.config
        if config.retention_bytes is None and config.retention_ms is None:
            return
        groups = replica.groups
        assert groups is not None
        # the snapshot carries the consumer groups as applied (at or after the point)
        applied = min(replica.commit_index, groups.applier.applied_index)
        point = replica.log.retention_point(limit_index=applied)
        if point is None or point < replica.log.start_index:
            return
        replica.storage.compact(point, groups.applier.snapshot_data())
        report = replica.log.remove_through(point)
        groups.applier.trim()
        self.hosted_changes += 1  # its log start, without an input to its group
        removed = len(report.removed_base_indexes)
        log.info("%s: retention removed %d segments", replica.group, removed)

    def _reconcile(
        self,
        replica: Replica,
        target: list[str],
        alive: set[str],
        leaving: frozenset[str],
        *,
        followers: Iterable[str],
    ) -> None:
        raft = replica.raft
        step = leader_step(
            raft,
            target,
            alive=alive,
            followers=frozenset(followers),
            leaving=leaving,
            lag_indexes=CATCH_UP_LAG_INDEXES,
        )
        if step is None:
            return
        try:
            if step.kind is StepKind.TRANSFER_LEADERSHIP:
                raft.transfer_leadership(step.node)
            else:
                if step.kind is StepKind.ADD_LEARNER and replica is self.meta:
                    # a joining node learns the metadata (and the group's configuration)
                    # from a snapshot, never from a log that starts before its bootstrap
                    self._compact_metadata(force=True)
                raft.propose_conf_change(step.conf_change())
        except ProposalDropped:
            return
        log.info("%s %s: %s %s", self.id, replica.group, step.kind.value, step.node)

    def _compact_metadata(self, *, force: bool = False) -> None:
        meta = self.meta
        if meta is None:
            return
        storage = meta.storage
        commit = min(meta.raft.log.committed, self.meta_applied_index)
        if commit < storage.first_index() or commit > storage.last_index():
            return
        if self.state.applied_index > commit:
            return  # the state is ahead of the log (kept through a repair): not a snapshot
        if not force and commit - storage.first_index() < METADATA_COMPACT_ENTRIES:
            return
        if storage.log.batch_range(commit)[1] - 1 != commit:
            return
        storage.compact(commit, self.state.snapshot())
        storage.log.remove_through(commit)

    def transfer_leaderships(self, alive: set[str]) -> bool:
        """Hand each leadership to a caught-up voter in `alive` that takes leaderships (one
        pass: a broker about to stop calls it until it returns False, nothing left to move):
        the partition's preferred leader among the others (so that what this node led
        spreads evenly), else the first caught up. Never to a broker that is stopping too:
        brokers stopped together would hand their groups back and forth until the last one
        went (a cluster's deletion, `local-cluster down`)."""
        moved = False
        without_me = [
            replace(c, draining=True) if c.id == broker_of(self.id) else c
            for c in self.candidates()
        ]
        plans: dict[str, TopicPlan] = {}
        takers = {n for n in alive if n != self.id and self.takes_leadership(n)}
        for replica in self.all_replicas():
            raft = replica.raft
            if raft.role is not Role.LEADER:
                continue
            if raft.transferee is not None:
                moved = True
                continue
            last = raft.log.last_index()
            successors = [
                n for n in raft.conf.voters if n in takers and raft.progress[n].match >= last - 1
            ] or [n for n in raft.conf.voters if n in takers]
            topic = self.state.topics.get(replica.topic) if replica is not self.meta else None
            if topic is not None and replica.partition < topic.partitions:
                plan = plans.get(topic.name)
                if plan is None:
                    plan = plans[topic.name] = plan_topic(
                        topic.name, topic.partitions, topic.replication_factor, without_me
                    )
                preferred = plan.preferred[replica.partition]
                if preferred in successors:
                    successors.insert(0, preferred)
            if successors:
                with contextlib.suppress(ProposalDropped):
                    raft.transfer_leadership(successors[0])
                    moved = True
                    log.info("%s hands %s to %s", self.id, replica.group, successors[0])
        return moved

    def leading(self) -> int:
        return sum(1 for r in self.all_replicas() if r.raft.role is Role.LEADER)

    # ---- views -----------------------------------------------------------------------------

    def in_sync(self, raft: Raft, alive: set[str]) -> list[str]:
        """A leader's voters within CATCH_UP_LAG_INDEXES of its log (itself included); a
        follower reports only itself."""
        if raft.role is not Role.LEADER:
            return [self.id]
        return sorted(
            n
            for n in raft.progress
            if n in raft.conf.voters
            and (n == self.id or (n in alive and raft.caught_up(n, CATCH_UP_LAG_INDEXES)))
        )

    def group_status(self, replica: Replica, alive: set[str]) -> HostedPartition:
        """What this node reports of `replica` (`alive`: the members SWIM counts alive)."""
        raft: Raft = replica.raft
        return HostedPartition(
            topic=replica.topic,
            partition=replica.partition,
            role=raft.role.name.lower(),
            leader=raft.lead,
            term=raft.term,
            voters=raft.conf.voters,
            learners=raft.conf.learners,
            in_sync=tuple(self.in_sync(raft, alive)),
            log_start=replica.log_start,
            commit_index=replica.commit_index,
            log_end=replica.log_end,
            bytes=replica.log.size_bytes,
        )

    def hosted_partitions(self) -> list[HostedPartition]:
        alive = self.alive()
        ordered = sorted(self.replicas.values(), key=lambda r: (r.topic, r.partition))
        return [self.group_status(r, alive) for r in ordered]

    def hosted(self) -> list[dict[str, Any]]:
        """`hosted_partitions` as the status table's rows."""
        return [p.to_json() for p in self.hosted_partitions()]

    def hosted_structure(self) -> int:
        """The version of what a change of is published at once (status_gossip): the
        replicas hosted, with each one's role, leader, term, configuration and (leaders)
        in-sync set; not the indexes, which move with every write. It grows whenever that
        changes. Only the groups that took an input since the last call are looked at (the
        others cannot have changed), all of them when the members alive changed."""
        alive = self.alive()
        rows = self._shape_rows
        changed = self.multi.take_changed()
        if alive != self._shape_alive:
            self._shape_alive = alive
            changed = set(self.replicas)
            changed.update(rows)
        if not changed.isdisjoint(self.replicas) or len(rows) != len(self.replicas):
            self.hosted_changes += 1  # (indexes move with inputs: a write, an apply)
        for group in changed:
            replica = self.replicas.get(group)
            if replica is None:
                if rows.pop(group, None) is not None:
                    self._shape_version += 1
            elif rows.get(group) != (row := self._shape_row(replica, alive)):
                rows[group] = row
                self._shape_version += 1
        if len(rows) != len(self.replicas):
            # a group removed (its inputs are forgotten with it) or, should one be hosted
            # without an input, added: bring the rows to the groups hosted
            for group in [g for g in rows if g not in self.replicas]:
                del rows[group]
            for group in self.replicas.keys() - rows.keys():
                rows[group] = self._shape_row(self.replicas[group], alive)
            self._shape_version += 1
        return self._shape_version

    def _shape_row(self, replica: Replica, alive: set[str]) -> tuple[object, ...]:
        """`replica`'s row of `hosted_structure`."""
        raft = replica.raft
        in_sync = tuple(self.in_sync(raft, alive)) if raft.role is Role.LEADER else ()
        return (raft.role, raft.lead, raft.term, raft.conf, in_sync)

    def readiness(self) -> str | None:
        """Why this node cannot serve yet, before a metadata barrier (None: it may)."""
        if self.meta is None:
            return "waiting to join the metadata group"
        if self.meta.raft.lead is None:
            return "no metadata leader known"
        return None

    # ---- metadata barriers -----------------------------------------------------------------

    def request_barrier(self) -> int:
        """A ticket, listed in a round's `barriers` once this node has applied every metadata
        entry committed before now (`laminar.node.barriers`)."""
        ticket = self.barriers.request()
        self.wake()
        return ticket

    def cancel_barrier(self, ticket: int) -> None:
        self.barriers.cancel(ticket)


def counts_for_placement(status: MemberStatus, away_ms: int, dead_grace_ms: int) -> bool:
    """Does a broker in SWIM state `status` (gone for `away_ms`, if gone) keep its place
    in placement, and so its replicas? As in Kafka, where a stopped broker keeps its replica
    assignments and only a reassignment moves them: a broker that is up, and one that left
    (a graceful stop: a restart, an upgrade) for as long as it is away; its partitions are
    under-replicated meanwhile, and a drain (`SetDraining`) is what moves data off it. One
    that died (a crash, kill -9, a machine or network lost) keeps it for `dead_grace_ms`,
    long enough to restart; past that placement replaces it, so that a machine that never
    comes back does not leave its partitions under-replicated for good."""
    if status in (MemberStatus.ALIVE, MemberStatus.SUSPECT, MemberStatus.LEFT):
        return True
    return away_ms < dead_grace_ms


def _valid_int(value: object, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= high


def _nothing() -> None:
    pass
