"""One partition replica on a broker: its Raft group over its segmented log, the appends
waiting for their commit, long-polling readers, and the idempotent-producer table.

The broker's driver persists what the Raft core asks and calls `on_committed` and
`on_leadership`; HTTP handlers call `propose` and `read`. Appends are bounded: at most
`max_pending_bytes` of this replica's proposals may wait for their commit (more is refused
with `Overloaded`, never queued without bound).

Damage: a replica opens repaired (`laminar.raft.repair`: the log cut at damage it may have
acknowledged, with a repair floor until the leader has refilled it); a damaged batch that a
read meets later is reported through `on_damage`, and the broker reopens the replica with
`repair_at` (a leader so steps down).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..log.batch import BatchHeader, parse_header, split_batches
from ..log.config import LogConfig
from ..log.errors import CorruptBatchError, LogClosedError
from ..log.journal import Section
from ..log.segment import ReadResult
from ..log.segmented_log import SegmentedLog
from ..log.storage import Directory
from ..node.store import TOPIC_FILE, parse_identity
from ..queue.applier import QueueApplier
from ..raft.config import RaftConfig
from ..raft.log_storage import COMMIT_SAVE_INDEXES, LogStorage
from ..raft.messages import ConfState
from ..raft.raft import ProposalDropped, Role
from ..raft.repair import Damage, last_entry, open_raft
from ..txn.partition import PartitionTxns
from ..txn.producer import TxnProducer
from .errors import (
    CommitLost,
    CommitUnknown,
    NotLeader,
    Overloaded,
    ReplicaClosed,
    SequenceConflict,
)
from .futures import answer_future
from .groups import ConsumerGroups
from .signal import Signal

#: Batches remembered per producer id for deduplication (as Kafka does).
PRODUCER_WINDOW = 5
#: Producer state is rebuilt from at most this many of the newest segments on a leader change.
PRODUCER_SCAN_SEGMENTS = 2
#: A follower wants each commit told at once for this long after it served a read.
READ_WANT_S = 1.0
#: A read waits at most this long for its leader's answer to an ask, then is served as is.
ASK_WAIT_S = 0.25


def topic_identity(storage: LogStorage) -> int | None:
    """The created_index of the topic the replica belongs to (None: not recorded, a replica
    from before it was recorded)."""
    return parse_identity(storage.load_file(TOPIC_FILE))


@dataclass(slots=True)
class ProducerBatch:
    sequence: int
    count: int
    base_index: int


class ProducerTable:
    """The last PRODUCER_WINDOW batches of each idempotent producer in this leader's log."""

    def __init__(self) -> None:
        self._batches: dict[int, deque[ProducerBatch]] = {}

    def clear(self) -> None:
        self._batches.clear()

    def __len__(self) -> int:
        return len(self._batches)

    def check(self, producer_id: int, sequence: int) -> int | None:
        """The base index of a duplicate, None for a new batch; raises SequenceConflict."""
        batches = self._batches.get(producer_id)
        if not batches:
            return None
        for batch in batches:
            if batch.sequence == sequence:
                return batch.base_index
        last = batches[-1]
        if sequence >= last.sequence + last.count:
            return None
        raise SequenceConflict(
            f"producer {producer_id}: sequence {sequence} is out of order "
            f"(next expected {last.sequence + last.count})"
        )

    def record(self, producer_id: int, sequence: int, count: int, base_index: int) -> None:
        batches = self._batches.setdefault(producer_id, deque(maxlen=PRODUCER_WINDOW))
        batches.append(ProducerBatch(sequence, count, base_index))

    def record_header(self, header: BatchHeader, base_index: int) -> None:
        if header.producer_id and not header.is_control:
            self.record(header.producer_id, header.producer_seq, header.record_count, base_index)


@dataclass(slots=True)
class PendingAppend:
    term: int
    last_index: int
    size_bytes: int
    future: asyncio.Future[int]


class Replica:
    def __init__(
        self,
        topic: str,
        partition: int,
        node_id: str,
        directory: Directory,
        log_config: LogConfig,
        raft_config: RaftConfig,
        bootstrap: ConfState,
        *,
        group: str | None = None,
        max_pending_bytes: int = 64 << 20,
        queues: bool = True,
        commit_save_indexes: int = COMMIT_SAVE_INDEXES,
        repair_at: int | None = None,
        joining: bool = False,
        seed: int | None = None,
        replay: Sequence[Section] = (),
    ) -> None:
        """`group`: the Raft group name (default "topic/partition"); `queues`: serve consumer
        groups (data partitions do; the metadata group does not); `repair_at`: the index of
        a damaged batch found while the replica ran (its log is cut and repaired there);
        `joining`: created by a leader's message, not as an initial voter (a new replica
        neither campaigns nor votes until a leader's entries reached it); `seed`: of its
        election jitter (None: the system's randomness); `replay`: what the node's journal
        holds of its log (redone before anything reads it)."""
        self.topic = topic
        self.partition = partition
        self.group = group or f"{topic}/{partition}"
        self.node_id = node_id
        self.max_pending_bytes = max_pending_bytes
        self.log = SegmentedLog.open(directory, log_config)
        self.storage = LogStorage(
            directory,
            self.log,
            conf=bootstrap,
            joining=joining,
            commit_save_indexes=commit_save_indexes,
            replay=replay,
        )
        damage = None
        if repair_at is not None:
            reason = f"damaged batch at {repair_at} met by a read"
            damage = Damage(repair_at, last_entry(self.storage), reason)
        self.raft, applier, self.repairs = open_raft(
            self.group,
            node_id,
            self.storage,
            raft_config,
            random.Random(seed),
            lambda: QueueApplier(self.storage) if queues else None,
            damage,
        )
        #: told (once per index) of each damaged batch a read meets: the broker repairs
        self.on_damage: Callable[[Replica, int], None] = _ignore_damage
        self.damaged_at: int | None = None
        self.log.on_corrupt = self._corrupt
        self.topic_created_index = topic_identity(self.storage) if queues else None
        self.producers = ProducerTable()
        self.pending: dict[int, PendingAppend] = {}  # base index -> waiting append
        self.pending_bytes = 0
        self._committed = Signal()  # long-polling readers wait on it
        self._readers = 0  # readers in `wait_for`: while any, the leader tells each commit
        self._read_until_s = 0.0  # and until then (monotonic), after a read (`fresh`)
        self.raft.commit_wanted = self._wants_commits
        self.raft.on_commit_heard = self._committed.notify
        #: wakes the node's driver, to send what `Raft.ask_for_commits` queued
        self.on_commit_wanted: Callable[[], None] = _nothing
        self._led_term = -1  # the term this replica last led in (its producer table's)
        self.groups = ConsumerGroups(self.raft, self.log, applier) if applier else None
        self.closed = False
        self.closing = False  # see `refuse_proposals`

    # ---- state -----------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.raft.role is Role.LEADER

    @property
    def repairable(self) -> bool:
        """Damage can be fetched again from another voter (this is not the only one)."""
        return self.raft.conf.voters != (self.node_id,)

    @property
    def repairing(self) -> bool:
        """The log lacks entries it had (cut at damage) until the leader has refilled it."""
        return self.raft.repair_floor is not None

    def bind_topic(self, created_index: int) -> None:
        """Record the identity of the topic this replica belongs to (durable at the next
        group-commit round)."""
        document = {
            "topic": self.topic,
            "partition": self.partition,
            "created_index": created_index,
        }
        self.storage.stage_file(TOPIC_FILE, json.dumps(document, sort_keys=True).encode())
        self.topic_created_index = created_index

    def _corrupt(self, error: CorruptBatchError) -> None:
        if self.damaged_at is None or error.index < self.damaged_at:
            self.damaged_at = error.index
            self.on_damage(self, error.index)

    @property
    def commit_index(self) -> int:
        return self.raft.log.committed

    @property
    def log_start(self) -> int:
        return self.log.start_index

    @property
    def log_end(self) -> int:
        return self.log.next_index

    # ---- appends ---------------------------------------------------------------------------

    def propose(
        self, batch: bytes, header: BatchHeader, digest: int | None = None
    ) -> tuple[asyncio.Future[int], bool]:
        """Propose a verified batch: a future resolving to its base index once committed, and
        whether it is a duplicate (then the future gives the original's base index). With
        `digest`, the payload digest `verify_batch` gave with `header`, the log does not check
        the batch again when it writes it."""
        if self.closed or self.closing:
            raise ReplicaClosed(f"{self.group} is closed")
        raft = self.raft
        if raft.role is not Role.LEADER:
            raise NotLeader(raft.lead)
        if self._led_term != raft.term:
            # leader since this round (the driver has not called on_leadership yet): the
            # producer table must know the log before it judges a retry
            self._take_leadership()
        loop = asyncio.get_running_loop()
        if header.producer_id and not header.is_control:  # (a marker names a producer too)
            duplicate = self.producers.check(header.producer_id, header.producer_seq)
            if duplicate is not None:
                return self._wait_committed(duplicate, loop), True
        if self.pending_bytes + len(batch) > self.max_pending_bytes:
            raise Overloaded(f"{self.group}: {self.pending_bytes} bytes already await their commit")
        try:
            base = raft.propose(batch, header.record_count)
        except ProposalDropped as e:
            raise NotLeader(raft.lead) from e
        self.producers.record_header(header, base)
        if digest is not None:
            self.storage.checked(base, batch, header, digest)
        future: asyncio.Future[int] = answer_future(loop)
        self.pending[base] = PendingAppend(
            raft.term, base + header.record_count - 1, len(batch), future
        )
        self.pending_bytes += len(batch)
        if self.groups is not None:
            self.groups.on_records_proposed()
        return future, False

    def _wait_committed(self, base: int, loop: asyncio.AbstractEventLoop) -> asyncio.Future[int]:
        """A future for an existing entry at `base`: resolved now if committed."""
        pending = self.pending.get(base)
        if pending is not None:
            return pending.future
        future: asyncio.Future[int] = answer_future(loop)
        if base <= self.commit_index:
            future.set_result(base)
        else:
            # In the log from an earlier term: committed once this leader commits its no-op.
            end = self.raft.log.last_index()
            self.pending[base] = PendingAppend(self.raft.term, min(base, end), 0, future)
        return future

    def on_committed(self, first: int, last: int) -> None:
        """Entries [first, last] are committed (and persisted here)."""
        if self.pending:
            done = [base for base, p in self.pending.items() if p.last_index <= last]
            for base in sorted(done):
                pending = self.pending.pop(base)
                self.pending_bytes -= pending.size_bytes
                if pending.future.done():
                    continue
                if self.log.term_at(base) == pending.term or pending.size_bytes == 0:
                    pending.future.set_result(base)
                else:
                    pending.future.set_exception(
                        CommitLost(f"{self.group}: another leader's entry took index {base}")
                    )
        if self.groups is not None:
            self.groups.on_committed(last)
        self._committed.notify()

    def on_leadership(self) -> None:
        """Called after each persisted Ready: rebuild the producer table for a new leadership,
        fail the queue commands of a lost one. Appends waiting for their commit keep waiting
        across a leadership change: whichever leader commits their index answers them (their
        entry: done; another: CommitLost), so a leadership transfer needs no 504; a request
        that times out first answers 504 as ever."""
        raft = self.raft
        if raft.role is Role.LEADER:
            if self._led_term != raft.term:
                self._take_leadership()
        elif self._led_term != -1:
            self._led_term = -1
            self.producers.clear()
            self._fail_queue_commands(f"no longer the leader (leader: {raft.lead})")

    def _take_leadership(self) -> None:
        """A new term as leader: the queue commands of the old one fail, and the producer
        table is rebuilt from the log (before any proposal of the new term)."""
        self._led_term = self.raft.term
        self._fail_queue_commands("leadership changed")
        self._rebuild_producers()

    def _fail_queue_commands(self, why: str) -> None:
        if self.groups is not None:
            self.groups.fail_all(why)

    def _fail_pending(self, why: str) -> None:
        """No waiting append will learn its commit here any more (the replica closes; its
        entry may be in other replicas' logs and be committed by the next leader)."""
        self._fail_queue_commands(why)
        for base, pending in self.pending.items():
            if not pending.future.done():
                pending.future.set_exception(
                    CommitUnknown(f"{self.group}: {why} before entry {base} was committed")
                )
        self.pending.clear()
        self.pending_bytes = 0

    def _rebuild_producers(self) -> None:
        """Producer batches from the headers in the newest segments (only headers are read)
        and the unstable tail of our log."""
        self.producers.clear()
        bases = self.log.segment_base_indexes
        start = max(bases[max(0, len(bases) - PRODUCER_SCAN_SEGMENTS)], self.log.start_index)
        for header in self.log.batch_headers(start):
            self.producers.record_header(header, header.base_index)
        for entry in self.raft.log.unstable:
            self.producers.record_header(parse_header(entry.data), entry.index)

    # ---- reads -----------------------------------------------------------------------------

    def readable_end(self, *, committed: bool = False) -> int:
        """The first index not readable yet: past the commit index; for a `committed`
        (read_committed) reader, at the stable end too (an open transaction's first index:
        laminar.txn.partition)."""
        end = self.commit_index + 1
        if committed and self.groups is not None:
            end = min(end, self.groups.state.stable_end)
        return end

    def read(self, from_index: int, max_bytes: int, *, committed: bool = False) -> ReadResult:
        """Whole committed batches from the one holding `from_index` (empty at the end).
        `committed` (read_committed): only below the stable end, and without the batches of
        aborted transactions. Raises ReplicaClosed once closed (an empty answer would say
        "nothing new yet")."""
        if self.closed:
            raise ReplicaClosed(f"{self.group} is closed")
        end = self.readable_end(committed=committed)
        if from_index >= end:
            return ReadResult(b"", from_index, from_index, 0)
        try:
            result = self.log.read_range(from_index, max_bytes, end)
        except LogClosedError as e:
            raise ReplicaClosed(f"{self.group} is closed") from e
        if committed and self.groups is not None:
            return without_aborted(result, self.groups.state.txns)
        return result

    async def wait_for(self, index: int, timeout_s: float, *, committed: bool = False) -> None:
        """Return once `index` is readable here (`readable_end`), after `timeout_s`, or once
        the replica is closed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self._readers += 1
        try:
            while index >= self.readable_end(committed=committed) and not self.closed:
                remaining = deadline - loop.time()
                if self.raft.ask_for_commits():  # a follower told of commits lazily so far
                    self.on_commit_wanted()
                if remaining <= 0 or not await self._committed.wait(remaining):
                    return
        finally:
            self._readers -= 1

    def _wants_commits(self) -> bool:
        return self._readers > 0 or time.monotonic() < self._read_until_s

    async def fresh(self) -> None:
        """Call before serving a read. A follower that told its leader it does not want each
        commit told at once asks it for its commit index, and waits until it has committed
        that far (a round trip; at most `ASK_WAIT_S`, then the read is served as is): the read
        then sees what it would on a follower told of each commit (`laminar.raft.raft`,
        "Commit notices on demand"). It wants them told at once for `READ_WANT_S` after."""
        self._read_until_s = time.monotonic() + READ_WANT_S
        raft = self.raft
        if raft.ask_for_commits():
            self.on_commit_wanted()
        elif not raft.commit_asked:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ASK_WAIT_S
        while not self.closed and (raft.commit_asked or self.commit_index < raft.commit_told):
            remaining = deadline - loop.time()
            if remaining <= 0 or not await self._committed.wait(remaining):
                return

    # ---- lifecycle -------------------------------------------------------------------------

    def refuse_proposals(self) -> None:
        """The broker is stopping (its driver will persist nothing more): appends and queue
        commands are refused as closed (503: nothing was done) instead of being proposed and
        then answered "outcome unknown"."""
        self.closing = True
        if self.groups is not None:
            self.groups.closing = True

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.groups is not None:
            self.groups.close()
        self._fail_pending("the replica is closing")
        self._committed.notify()
        self.storage.close()
        self.log.close()


def _ignore_damage(replica: Replica, index: int) -> None:
    pass


def _nothing() -> None:
    pass


def without_aborted(result: ReadResult, txns: PartitionTxns) -> ReadResult:
    """`result` less the batches of aborted transactions (and of fenced epochs) in it; the
    same object when it holds none (the usual case: one lookup)."""
    if not txns.aborted_between(result.first_index, result.next_index):
        return result
    kept: list[memoryview] = []
    dropped = 0
    for batch in split_batches(result.data):
        header = parse_header(batch)
        if header.is_transactional and txns.aborted(
            TxnProducer.of(header.producer_id).number, header.base_index
        ):
            dropped += 1
        else:
            kept.append(batch)
    data = b"".join(kept)
    return ReadResult(data, result.first_index, result.next_index, result.batch_count - dropped)
