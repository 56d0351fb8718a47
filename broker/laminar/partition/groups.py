"""The consumer groups of one partition replica (shared queues, DESIGN §4), served by its leader.

Every request becomes a queue command in the partition's own Raft log (`laminar.queue`), and
is answered once that command is committed and applied here, so what a client was told holds
after any failover. Every replica applies the same commands (`QueueApplier`); only the leader
proposes them. The leader stamps commands with its clock (`now_ms`), picks the indexes an
Acquire asks for from its applied state minus those its own uncommitted Acquires ask for
(the state machine refuses any index that is no longer free when the command applies), then
from the records it proposed and has not applied yet (pipelined: an Acquire right behind
them commits with them; `laminar.queue.pending`), and bounds what waits for a commit.

Long-polling acquires park here, first come first served. When records are proposed, the
first parked acquires are handed them at once: their Acquire is proposed in the same call,
right behind the records and before the broker's driver starts its next round, so records
and Acquire are written, fdatasynced and replicated together and commit in one round (woken
as a task instead, the Acquire would miss that round, take one of its own, and hold back the
records' own commit behind its fdatasync).

Records it cannot hand out, those of a batch whose checksum holds but whose records are
malformed (stored before appends checked records), are never leased to a consumer: the
leader settles them for the group unseen, acquiring and accepting them as the consumer
SKIP_CONSUMER (two ordinary queue commands, so every replica agrees), and reports them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from ..log.batch import (
    BATCH_HEADER_BYTES,
    BatchHeader,
    StoredRecord,
    decode_batch,
    parse_header,
    records_bytes,
    verify_records,
)
from ..log.errors import IndexOutOfRangeError, MalformedRecordsError
from ..log.segmented_log import SegmentedLog
from ..queue import (
    Accept,
    Acquire,
    Configure,
    Expire,
    Granted,
    QueueCommand,
    QueueError,
    QueueState,
    Result,
)
from ..queue.applier import QueueApplier
from ..queue.entries import encode_entry
from ..queue.pending import pending_records, stamped
from ..queue.state import MAX_SCAN, DeadLetter, validate
from ..raft.raft import ProposalDropped, Raft, Role
from .errors import CommitLost, CommitUnknown, NotLeader, Overloaded, ReplicaClosed
from .futures import answer_future
from .signal import Signal

#: Queue commands that may wait for their commit on one replica at a time.
MAX_QUEUE_WAITERS = 10_000
#: Decoded record batches kept for acquires (consecutive acquires read the same batches).
BATCH_CACHE_SIZE = 16
#: An acquire whose every index was taken meanwhile tries again at most this often.
ACQUIRE_ATTEMPTS = 3
#: The consumer that settles malformed records for a group without handing them to anyone.
SKIP_CONSUMER = "laminar.malformed"
#: Its lease: long enough for the Accept that follows, short enough that records it failed
#: to accept (leadership lost in between) come back soon to be skipped again.
SKIP_LEASE_MS = 60_000

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Waiter:
    term: int
    future: asyncio.Future[Result]


@dataclass(slots=True)
class StoredBatch:
    """A user-data batch of the log as stored, its records decoded on first use. `malformed`:
    why its records cannot be decoded (checked when it is read from the log), or None."""

    header: BatchHeader
    data: bytes
    malformed: MalformedRecordsError | None = None
    _records: list[StoredRecord] | None = None

    @property
    def record_bytes(self) -> int:
        """The average size of its records (what an acquire counts against max_bytes): as an
        answer carries them, decompressed."""
        header = self.header
        size = records_bytes(self.data) if header.is_compressed else header.payload_bytes
        return size // header.record_count

    def record(self, index: int) -> StoredRecord:
        """The record at `index`; raises MalformedRecordsError for a malformed batch."""
        if self.malformed is not None:
            raise self.malformed
        if self._records is None:
            self._records = decode_batch(self.data)
        return self._records[index - self.header.base_index]


#: What a parked acquire is handed: the records its Acquire names, and that Acquire's result.
Handed = tuple[dict[int, StoredBatch], asyncio.Future[Result]]


@dataclass(slots=True)
class _Parked:
    """A long-polling acquire waiting for records: its future resolves to what it was handed
    (None: something changed, look again)."""

    group: str
    consumer: str
    max_messages: int
    lease_ms: int
    max_bytes: int
    handed: asyncio.Future[Handed | None]


@dataclass(slots=True)
class Delivery:
    granted: Granted
    batch: StoredBatch

    @property
    def record(self) -> StoredRecord:
        return self.batch.record(self.granted.index)


def now_ms() -> int:
    return int(time.time() * 1000)


class ConsumerGroups:
    def __init__(self, raft: Raft, log: SegmentedLog, applier: QueueApplier) -> None:
        self.raft = raft
        self.log = log
        self.applier = applier
        self._waiters: dict[int, _Waiter] = {}  # log index of a proposed command -> waiter
        self._tentative: dict[str, dict[int, str]] = {}  # group -> index -> consumer
        self._changed = Signal()  # wait_change waits on it
        self._parked: list[_Parked] = []  # long-polling acquires, first come first served
        self._expiring: set[str] = set()
        self._configuring = False
        self._batches: OrderedDict[int, StoredBatch] = OrderedDict()
        self._last_batch: StoredBatch | None = None
        #: called after each proposal (the broker wakes its driver to persist it)
        self.on_propose: Callable[[], None] = _nothing
        #: called with (path, first, end, reason) for malformed records [first, end) skipped
        #: (the broker logs and counts them: `Broker.report_malformed`)
        self.on_malformed: Callable[[str, int, int, str], None] = self._log_malformed
        #: the broker is stopping: nothing proposed now would be persisted
        self.closing = False
        self.closed = False

    @property
    def state(self) -> QueueState:
        return self.applier.state

    # ---- proposing and applying ------------------------------------------------------------

    def propose(self, command: QueueCommand) -> asyncio.Future[Result]:
        """Propose `command` (leader only): a future for its result once applied here."""
        if self.closed or self.closing:
            raise ReplicaClosed(f"{self.raft.group} is closed")
        raft = self.raft
        if raft.role is not Role.LEADER:
            raise NotLeader(raft.lead)
        validate(command)  # a committed command must apply on every replica
        entry = encode_entry(command)
        limit = self.log.config.batch_limit_bytes
        if len(entry) > limit:
            # the log refuses a batch over its limit, Raft entries included: an entry proposed
            # anyway would fail every persist of the broker's driver
            raise QueueError(
                "invalid",
                f"{raft.group}: the queue command takes {len(entry)} bytes, over the topic's "
                f"max_batch_bytes={limit}: name fewer indexes (or ask for fewer messages)",
            )
        if len(self._waiters) >= MAX_QUEUE_WAITERS:
            raise Overloaded(f"{raft.group}: {len(self._waiters)} queue commands await commit")
        try:
            index = raft.propose(entry, 1)
        except ProposalDropped as e:
            raise NotLeader(raft.lead) from e
        future: asyncio.Future[Result] = answer_future(asyncio.get_running_loop())
        self._waiters[index] = _Waiter(raft.term, future)
        self.on_propose()
        return future

    def on_committed(self, last: int) -> None:
        """Entries up to `last` are committed here: apply them, answer their proposers."""
        for applied in self.applier.catch_up(last):
            waiter = self._waiters.pop(applied.index, None)
            if waiter is not None and not waiter.future.done():
                if self.log.term_at(applied.index) == waiter.term:
                    waiter.future.set_result(applied.result)
                else:
                    waiter.future.set_exception(
                        CommitLost(
                            f"{self.raft.group}: another leader's entry took index {applied.index}"
                        )
                    )
        if self._waiters:
            # a proposal whose index now holds another (committed) entry was lost
            for index in [i for i in self._waiters if i <= self.applier.applied_index]:
                waiter = self._waiters.pop(index)
                if not waiter.future.done():
                    waiter.future.set_exception(
                        CommitLost(f"{self.raft.group}: another leader's entry took index {index}")
                    )
        self._changed.notify()
        self._serve_parked(propose=False)

    def fail_all(self, why: str) -> None:
        """Leadership changed (or the replica closes): nothing proposed here will be answered
        (the next leader may still commit and apply it)."""
        waiters, self._waiters = self._waiters, {}
        for index, waiter in waiters.items():
            if not waiter.future.done():
                waiter.future.set_exception(
                    CommitUnknown(f"{self.raft.group}: {why} before entry {index} was committed")
                )
        self._tentative.clear()
        self._notify()

    def close(self) -> None:
        """The replica closes: waiting commands fail, long-polling acquires end."""
        self.closed = True
        self.fail_all("the replica is closing")

    def reset(self) -> None:
        """A snapshot was installed."""
        self.applier.reset()
        self._batches.clear()
        self._last_batch = None
        self._notify()

    async def wait_change(self, timeout_s: float) -> None:
        """Return after the next applied commit (or `timeout_s`)."""
        await self._changed.wait(timeout_s)

    def _notify(self) -> None:
        """Something changed for every waiter (leadership, closing, a snapshot installed):
        wake them all; parked acquires look again."""
        self._changed.notify()
        parked, self._parked = self._parked, []
        for waiter in parked:
            if not waiter.handed.done():
                waiter.handed.set_result(None)

    def _wake(self, parked: _Parked) -> None:
        """Wake one parked acquire: it looks again."""
        self._parked.remove(parked)
        parked.handed.set_result(None)

    # ---- serving ---------------------------------------------------------------------------

    async def acquire(
        self,
        group: str,
        consumer: str,
        max_messages: int,
        lease_ms: int,
        wait_s: float,
        max_bytes: int,
    ) -> list[Delivery]:
        """Up to `max_messages` messages nobody holds, oldest first, held for `lease_ms`;
        long-polls up to `wait_s` while there are none (or flow control allows none)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        attempts = 0
        while True:
            if self.closed:
                raise ReplicaClosed(f"{self.raft.group} is closed")
            if self.raft.role is not Role.LEADER:
                raise NotLeader(self.raft.lead)
            now = now_ms()
            records, malformed = self._pick(group, consumer, max_messages, max_bytes, now)
            if malformed and await self._skip_malformed(group, malformed):
                continue  # settled unseen: pick again
            handed: Handed | None = None
            if records:
                handed = records, self._propose_acquire(group, consumer, records, lease_ms, now)
            else:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return []
                parked = _Parked(
                    group, consumer, max_messages, lease_ms, max_bytes, answer_future(loop)
                )
                handed = await self._park(parked, remaining)
                if handed is None:
                    continue  # something changed (or time is up): look again
            records, proposed = handed
            result = await proposed
            if result.granted:
                return [Delivery(g, records[g.index]) for g in result.granted]
            attempts += 1
            if attempts >= ACQUIRE_ATTEMPTS:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return []
                await self.wait_change(remaining)

    def _propose_acquire(
        self, group: str, consumer: str, records: dict[int, StoredBatch], lease_ms: int, now: int
    ) -> asyncio.Future[Result]:
        """Propose the Acquire of `records` for `consumer`: they stay out of other picks (held
        tentatively) until it is applied or fails."""
        held = self._tentative.setdefault(group, {})
        for index in records:
            held[index] = consumer

        def release(_: object = None) -> None:
            for index in records:
                if held.get(index) == consumer:
                    del held[index]

        try:
            future = self.propose(Acquire(group, consumer, tuple(records), lease_ms, now))
        except BaseException:
            release()
            raise
        future.add_done_callback(release)
        return future

    async def _park(self, parked: _Parked, timeout_s: float) -> Handed | None:
        """Wait up to `timeout_s` for records to be handed to `parked` (None: something
        changed, or the time is up)."""
        self._parked.append(parked)
        try:
            return await asyncio.wait_for(parked.handed, timeout_s)
        except TimeoutError:
            return None
        finally:
            if parked in self._parked:
                self._parked.remove(parked)

    def _serve_parked(self, *, propose: bool) -> None:
        """Look for each parked acquire, oldest first, at what a pick finds now. With
        `propose` (records were just proposed), propose its Acquire of them at once and hand
        it that, so that the Acquire joins the records' round; else (commits were applied:
        records released, leases ended, room freed by settlements) wake it to take them
        itself. Those that find nothing (no room, or nothing left) stay parked: on a busy
        partition, waking every parked acquire at every commit had each pick nothing and park
        again. Those that meet malformed records are woken, to skip them themselves; one whose
        pick or proposal fails is handed the error, as its acquire would have raised it. A
        replica closing or no longer leading wakes them all."""
        if self.closed or self.closing or self.raft.role is not Role.LEADER:
            self._notify()
            return
        now = now_ms()
        for parked in list(self._parked):
            if parked.handed.done():
                continue  # woken already, or gone (its request ended)
            try:
                records, malformed = self._pick(
                    parked.group, parked.consumer, parked.max_messages, parked.max_bytes, now
                )
                if malformed or (records and not propose):
                    self._wake(parked)
                    continue
                if not records:
                    continue
                proposed = self._propose_acquire(
                    parked.group, parked.consumer, records, parked.lease_ms, now
                )
            except Exception as e:
                parked.handed.set_exception(e)
                continue
            self._parked.remove(parked)
            parked.handed.set_result((records, proposed))

    def _pick(
        self, group: str, consumer: str, limit: int, max_bytes: int, now: int
    ) -> tuple[dict[int, StoredBatch], dict[int, StoredBatch]]:
        """The records an Acquire should ask for (index -> its batch), oldest first, within
        flow control and `max_bytes` (at least one record; sizes are their batch's average);
        and the malformed batches met among them (base index -> batch), to skip."""
        held = self._tentative.get(group, {})
        mine = sum(1 for c in held.values() if c == consumer)
        config = self.state.config
        in_group = len(held) + (len(g.acquired) if (g := self.state.groups.get(group)) else 0)
        limit = min(
            limit,
            self.state.room(group, consumer) - mine,
            config.max_acquired_per_group - in_group,
        )
        if limit <= 0:
            return {}, {}
        indexes = [i for i in self.state.available(group, limit + len(held), now) if i not in held]
        pending: dict[int, StoredBatch] = {}
        if len(indexes) < limit:
            # pipelined: records proposed here and not applied yet (laminar.queue.pending)
            wanted = limit - len(indexes) + len(held)
            for index, entry in pending_records(self.raft.log, self.state.end_index, wanted):
                if index not in held and len(indexes) < limit:
                    indexes.append(index)
                    if entry.index not in pending:
                        data = stamped(entry)
                        pending[entry.index] = StoredBatch(parse_header(data), data)
        picked: dict[int, StoredBatch] = {}
        malformed: dict[int, StoredBatch] = {}
        size = 0
        for index in indexes[:limit]:
            batch = self._pending_batch(pending, index) if pending else None
            batch = batch or self.batch(index)
            if batch is None:
                continue
            if batch.malformed is not None:
                malformed[batch.header.base_index] = batch
                continue
            size += batch.record_bytes
            if picked and size > max_bytes:
                break
            picked[index] = batch
        return picked, malformed

    async def _skip_malformed(self, group: str, batches: dict[int, StoredBatch]) -> int:
        """Settle the records of malformed `batches` for `group` without handing them to any
        consumer: SKIP_CONSUMER acquires what is free of them and accepts it (ordinary queue
        commands: every replica agrees, and the group's cursor moves past them). Reports each
        range skipped; returns how many records were."""
        held = self._tentative.setdefault(group, {})
        skipped = 0
        for batch in batches.values():
            header = batch.header
            room = min(self.state.room(group, SKIP_CONSUMER), MAX_SCAN)
            wanted = [i for i in range(header.base_index, header.next_index) if i not in held]
            wanted = wanted[:room]
            if not wanted:
                continue
            for index in wanted:
                held[index] = SKIP_CONSUMER
            try:
                command = Acquire(group, SKIP_CONSUMER, tuple(wanted), SKIP_LEASE_MS, now_ms())
                granted = tuple(g.index for g in (await self.propose(command)).granted)
                if not granted:
                    continue
                done = (await self.propose(Accept(group, SKIP_CONSUMER, granted, now_ms()))).done
            finally:
                for index in wanted:
                    held.pop(index, None)
            skipped += len(done)
            reason = f"consumer group {group}: {batch.malformed}"
            for first, end in _runs(sorted(done)):
                self.on_malformed("acquire", first, end, reason)
        return skipped

    def _log_malformed(self, path: str, first: int, end: int, reason: str) -> None:
        log.warning(
            "%s: records %d..%d are malformed and skipped (%s): %s",
            self.raft.group,
            first,
            end - 1,
            path,
            reason,
        )

    def record(self, index: int) -> StoredRecord | None:
        if self.closed:
            raise ReplicaClosed(f"{self.raft.group} is closed")
        batch = self.batch(index)
        return None if batch is None else batch.record(index)

    @staticmethod
    def _pending_batch(pending: dict[int, StoredBatch], index: int) -> StoredBatch | None:
        for base, batch in pending.items():
            if base <= index < batch.header.next_index:
                return batch
        return None

    def on_records_proposed(self) -> None:
        """This leader proposed records: parked acquires take them at once (`_serve_parked`)."""
        self._changed.notify()
        self._serve_parked(propose=True)

    def batch(self, index: int) -> StoredBatch | None:
        """The user-data batch holding `index` (None once retention removed it)."""
        last = self._last_batch
        if last is not None and last.header.base_index <= index < last.header.next_index:
            return last
        for base, batch in self._batches.items():
            if base <= index < batch.header.next_index:
                self._last_batch = batch
                return batch
        try:
            data = self.log.read(index).data
        except IndexOutOfRangeError:
            return None  # removed by retention; the state forgets it at the next trim
        header = parse_header(data)
        if header.is_control or not header.base_index <= index < header.next_index:
            return None
        batch = StoredBatch(header, data[: header.batch_bytes])
        try:  # one C walk: what cannot be decoded is never leased
            if header.is_compressed:  # (decoded now: one decompression checks and decodes)
                batch.record(index)
            else:
                verify_records(header, memoryview(batch.data)[BATCH_HEADER_BYTES:])
        except MalformedRecordsError as e:
            batch.malformed = e
        self._batches[header.base_index] = batch
        self._last_batch = batch
        while len(self._batches) > BATCH_CACHE_SIZE:
            self._batches.popitem(last=False)
        return batch

    # ---- the leader's own duties (the broker's control loop calls these) -------------------

    def expire_due(self, now: int) -> list[asyncio.Future[Result]]:
        """Propose Expire for every group with a lease that ran out (one at a time)."""
        proposed = []
        for name, group in sorted(self.state.groups.items()):
            if name in self._expiring or not group.acquired:
                continue
            if min(h.deadline_ms for h in group.acquired.values()) > now:
                continue
            future = self.propose(Expire(name, now))
            self._expiring.add(name)
            future.add_done_callback(partial(self._settled, name))
            proposed.append(future)
        return proposed

    def configure(self, max_deliveries: int) -> None:
        """Propose the topic's max_deliveries when the applied state has another."""
        if self._configuring or self.state.config.max_deliveries == max_deliveries:
            return
        future = self.propose(Configure(max_deliveries))
        self._configuring = True

        def done(_: asyncio.Future[Result]) -> None:
            self._configuring = False

        future.add_done_callback(done)

    def _settled(self, group: str, _: asyncio.Future[Result]) -> None:
        self._expiring.discard(group)

    def dead_letters(self) -> list[tuple[str, int, DeadLetter, int]]:
        """(group, index, dead letter, the group's incarnation) waiting for their dead-letter
        append, by group, then in the order of their sequence numbers."""
        out: list[tuple[str, int, DeadLetter, int]] = []
        for name, group in sorted(self.state.groups.items()):
            ordered = sorted(group.dead_pending.items(), key=lambda item: item[1].sequence)
            out.extend((name, index, letter, group.incarnation) for index, letter in ordered)
        return out


def _nothing() -> None:
    pass


def _runs(indexes: list[int]) -> list[tuple[int, int]]:
    """Sorted `indexes` as [first, end) runs of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for index in indexes:
        if runs and runs[-1][1] == index:
            runs[-1] = (runs[-1][0], index + 1)
        else:
            runs.append((index, index + 1))
    return runs
