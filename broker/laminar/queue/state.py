"""Shared-queue consumer groups on one partition, as a deterministic state machine.

Every replica of the partition applies the same committed entries in the same order: the
record batches of the log (`on_records`) and the queue commands (`apply`). Time is never read
from a clock: commands carry the leader's `now_ms`, so lease expiry is decided identically
everywhere. The Qpid guarantees, per group:

* an acquired message is not given to anyone else while its lease holds;
* a released or expired message (its consumer gone) is given out again, delivery count + 1;
* an accepted message is never given out again;
* only the consumer holding a message under a lease that has not ended settles it (accept,
  release, reject): settle commands carry the leader's `now_ms` too, and a lease whose
  deadline is at or before it has ended, whether or not an Expire said so yet. A settle is
  answered `done` only if it took effect, or repeats the very settlement (same consumer, same
  action) that was the message's last since it was last handed out; the group remembers its
  recent settlements for that (two generations of at most SETTLED_GENERATION each);
* a rejected message, or one whose delivery count reached `max_deliveries` when it came back,
  is dead-lettered exactly once: it waits in `dead_pending` with a sequence number of its own
  (the broker appends it to `<topic>.dlq` as an idempotent producer with that sequence) until
  `DeadLettered` confirms the append; then the group forgets it;
* messages are handed out oldest first, so one producer's messages come in order except for
  redeliveries.

A group's `cursor` is the first record index it has not finished; indexes below it need no
memory (but its last settlements, a bounded number), and record ranges below every group's
cursor are forgotten, so the state does not grow with history (`snapshot` is canonical JSON).
A new group starts at `start_index`: the log start, or where the slowest existing group is.

Two admin commands act on a group as a whole (docs/api.md, "Consumer group admin"):

* `Reset` starts the group over at another cursor: everything below it counts as finished,
  everything from it on as never handed out (delivery counts start again at 1). It is refused
  while the group is busy (a message held under a lease that has not ended at the command's
  `now_ms`, accepted in a transaction not ended yet, or dead-lettered and not yet in the
  dead-letter topic), as Kafka refuses to reset a group with active members, unless `force`:
  then what is held is dropped (its consumers' settles are refused, as after a lease ran out)
  and so are the dead letters not yet moved. A rewind below `start_index` (whose record ranges
  were forgotten) carries the record ranges it needs from the leader's log (`ranges`, down
  from `known_from`): every replica learns the same ones.
* `DeleteGroup` forgets the group (refused while busy unless `force`, as a reset). A group
  made again later by the same name is a new incarnation (`Group.incarnation`, the log index
  that made it), so that its dead letters are a new idempotent producer's.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from itertools import filterfalse, islice
from typing import Any

import orjson

from ..contract import CONSUMER_ID as CONSUMER_ID
from ..contract import GROUP_NAME as GROUP_NAME
from ..txn.partition import Outcome, PartitionTxns
from ..txn.producer import TxnProducer

SNAPSHOT_VERSION = 2
#: Snapshots this code restores: 1 had no settlement memory (restored as empty).
READABLE_SNAPSHOT_VERSIONS = (1, 2)
#: An acquire looks at most this many record indexes past the cursor (bounded work).
MAX_SCAN = 100_000
#: A group remembers who settled which index how (so that a repeated settle is answered
#: `done` and anyone else's `refused`) in two generations: when a settle command could take
#: the current one past this many, the older one is forgotten whole. So it remembers at most
#: 2 * SETTLED_GENERATION, and every settlement of at least the last settle command.
SETTLED_GENERATION = MAX_SCAN


class QueueError(ValueError):
    """A command that cannot apply. `code`: invalid or not_found."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class QueueConfig:
    max_deliveries: int = 10
    max_acquired_per_consumer: int = 10_000
    max_acquired_per_group: int = 100_000
    max_lease_ms: int = 3_600_000

    def __post_init__(self) -> None:
        for name in ("max_deliveries", "max_acquired_per_consumer", "max_acquired_per_group"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.max_lease_ms < 1:
            raise ValueError("max_lease_ms must be positive")


# ---- commands ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Acquire:
    """Hold `indexes` (chosen by the leader from `available`) for `lease_ms`; those not free
    when this applies are skipped (the result says which were granted)."""

    group: str
    consumer: str
    indexes: tuple[int, ...]
    lease_ms: int
    now_ms: int


# Settle commands: `now_ms` is the leader's clock when it proposed one (leases ending at or
# before it have ended). None in entries written before settles carried it: a lease still
# held then counts as current, as it did when they were applied first.


@dataclass(frozen=True, slots=True)
class Accept:
    """`txn_producer_id` (not 0): accepted as part of that transactional producer's
    transaction (docs/transactions.md): the messages stay held, past their leases, until its
    marker here finishes them (COMMIT) or gives them back (ABORT)."""

    group: str
    consumer: str
    indexes: tuple[int, ...]
    now_ms: int | None = None
    txn_producer_id: int = 0


@dataclass(frozen=True, slots=True)
class Release:
    group: str
    consumer: str
    indexes: tuple[int, ...]
    now_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Reject:
    group: str
    consumer: str
    indexes: tuple[int, ...]
    reason: str = "rejected"
    now_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Renew:
    """Extend the leases `consumer` still holds on `indexes` to `now_ms + lease_ms`."""

    group: str
    consumer: str
    indexes: tuple[int, ...]
    lease_ms: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class Configure:
    """The topic's queue settings changed (the leader proposes this when it sees the change,
    so every replica switches at the same log index)."""

    max_deliveries: int
    group: str = ""  # unused: settings apply to every group


@dataclass(frozen=True, slots=True)
class Expire:
    """End every lease of the group whose deadline is at or before `now_ms`."""

    group: str
    now_ms: int


@dataclass(frozen=True, slots=True)
class DeadLettered:
    """The dead-letter appends of these indexes are committed: forget them. `sequences` (one
    per index) and `incarnation` name the very dead letters appended, so that a confirmation
    that comes after a forced reset or a delete (the group dropped them, and may have
    dead-lettered the same index again since) forgets nothing else; entries written before
    they were carried have neither, and match any."""

    group: str
    indexes: tuple[int, ...]
    sequences: tuple[int, ...] = ()
    incarnation: int | None = None


@dataclass(frozen=True, slots=True)
class Reset:
    """Start the group over at `cursor` (see the module doc); made if it does not exist.

    `ranges`: the record ranges [base, end) of the log in [cursor, known_from), ascending, as
    the proposing leader's log holds them (control batches and aborted transactions left
    out). A replica that forgot ranges at or above `known_from` meanwhile (its groups moved
    on) refuses the reset (`moved`): the leader asks again. Indexes below the replica's log
    start are gone, for this group as for any."""

    group: str
    cursor: int
    now_ms: int
    force: bool = False
    ranges: tuple[tuple[int, int], ...] = ()
    known_from: int = 0


@dataclass(frozen=True, slots=True)
class DeleteGroup:
    """Forget the group (refused while busy unless `force`; `not_found` if there is none)."""

    group: str
    now_ms: int
    force: bool = False


QueueCommand = (
    Acquire | Accept | Release | Reject | Renew | Expire | DeadLettered | Configure | Reset
    | DeleteGroup
)  # fmt: skip
_KINDS: dict[str, type[QueueCommand]] = {
    "acquire": Acquire,
    "renew": Renew,
    "configure": Configure,
    "accept": Accept,
    "release": Release,
    "reject": Reject,
    "expire": Expire,
    "dead_lettered": DeadLettered,
    "reset": Reset,
    "delete_group": DeleteGroup,
}
_NAMES = {kind: name for name, kind in _KINDS.items()}
Settle = Accept | Release | Reject


def encode_command(command: QueueCommand) -> bytes:
    fields = {name: getattr(command, name) for name in command.__slots__}
    return orjson.dumps({"kind": _NAMES[type(command)], **fields}, option=orjson.OPT_SORT_KEYS)


def decode_command(data: bytes) -> QueueCommand:
    """Parse a command (`apply` validates it: a malformed one raises QueueError either way)."""
    try:
        document = orjson.loads(data)
        kind = _KINDS[document.pop("kind")]
        for key in ("indexes", "sequences"):
            if key in document:
                document[key] = tuple(document[key])
        if "ranges" in document:
            document["ranges"] = tuple(map(tuple, document["ranges"]))
        command = kind(**document)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise QueueError("invalid", f"malformed queue command: {e}") from e
    return command


def _check_indexes(indexes: object) -> None:
    if not isinstance(indexes, tuple) or not indexes or len(indexes) > MAX_SCAN:
        raise QueueError("invalid", f"indexes must be a non-empty list of at most {MAX_SCAN}")
    if set(map(type, indexes)) != {int}:
        bad = next(i for i in indexes if type(i) is not int)
        raise QueueError("invalid", f"index {bad!r} is not a record index")
    if min(indexes) < 0 or max(indexes) >= 2**63:
        raise QueueError("invalid", f"index {min(indexes)}..{max(indexes)} out of range")


def validate(command: QueueCommand) -> None:
    """Raise QueueError for a command no state could apply (names, types, ranges)."""
    if isinstance(command, Configure):
        if not isinstance(command.max_deliveries, int) or command.max_deliveries < 1:
            raise QueueError("invalid", "max_deliveries must be a positive integer")
        return
    if not isinstance(command.group, str) or not GROUP_NAME.fullmatch(command.group):
        raise QueueError("invalid", f"group name {command.group!r} must match {GROUP_NAME.pattern}")
    if isinstance(command, Acquire | Accept | Release | Reject | Renew) and (
        not isinstance(command.consumer, str) or not CONSUMER_ID.fullmatch(command.consumer)
    ):
        raise QueueError(
            "invalid", f"consumer id {command.consumer!r} must match {CONSUMER_ID.pattern}"
        )
    if isinstance(command, Reset | DeleteGroup):
        _check_admin(command)
        return
    if isinstance(command, Acquire | Accept | Release | Reject | Renew | DeadLettered):
        _check_indexes(command.indexes)
    if isinstance(command, DeadLettered) and (
        not isinstance(command.sequences, tuple)
        or (command.sequences and len(command.sequences) != len(command.indexes))
        or not all(map(_is_index, command.sequences))
        or not (command.incarnation is None or _is_index(command.incarnation))
    ):
        raise QueueError(
            "invalid", "sequences must be one per index, and incarnation a log index or null"
        )
    if isinstance(command, Acquire | Renew) and (
        not isinstance(command.lease_ms, int) or command.lease_ms < 1
    ):
        raise QueueError("invalid", "lease_ms must be a positive integer")
    if isinstance(command, Reject) and (
        not isinstance(command.reason, str) or not 1 <= len(command.reason) <= 200
    ):
        raise QueueError("invalid", "reason must be 1..200 characters")
    if isinstance(command, Settle) and not (
        command.now_ms is None or (type(command.now_ms) is int and command.now_ms >= 0)
    ):
        raise QueueError("invalid", "now_ms must be a non-negative integer")
    if isinstance(command, Accept) and not (
        type(command.txn_producer_id) is int and 0 <= command.txn_producer_id < 2**64
    ):
        raise QueueError("invalid", "txn_producer_id must be an unsigned 64-bit integer")


def _is_index(value: object) -> bool:
    return type(value) is int and 0 <= value < 2**63


def _check_admin(command: Reset | DeleteGroup) -> None:
    if not _is_index(command.now_ms):
        raise QueueError("invalid", "now_ms must be a non-negative integer")
    if type(command.force) is not bool:
        raise QueueError("invalid", "force must be a boolean")
    if isinstance(command, DeleteGroup):
        return
    if not _is_index(command.cursor) or not _is_index(command.known_from):
        raise QueueError("invalid", "cursor and known_from must be record indexes")
    ranges = command.ranges
    if not isinstance(ranges, tuple) or len(ranges) > MAX_SCAN:
        raise QueueError("invalid", f"ranges must be a list of at most {MAX_SCAN}")
    low = command.cursor
    for pair in ranges:
        if (
            not isinstance(pair, tuple)
            or len(pair) != 2
            or not all(map(_is_index, pair))
            or not low <= pair[0] < pair[1] <= command.known_from
        ):
            raise QueueError(
                "invalid",
                f"ranges must be ascending [base, end) pairs in [cursor, known_from): {pair!r}",
            )
        low = pair[1]


# ---- state ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Holding:
    """Never changed once made: one is shared by every index an acquire granted alike."""

    consumer: str
    deadline_ms: int
    deliveries: int


#: The lease deadline of a message accepted in a transaction not ended yet: never.
PINNED_MS = 2**63 - 1

#: Who settled a message, and how: (consumer, `accept` | `release` | `reject`); one is shared
#: by every index a command settled.
Settlement = tuple[str, str]


@dataclass(slots=True)
class DeadLetter:
    sequence: int  # the dead-letter producer's sequence number for this message
    reason: str
    deliveries: int


@dataclass(slots=True)
class Group:
    cursor: int
    acquired: dict[int, Holding] = field(default_factory=dict)
    #: finished (accepted or dead-lettered) indexes at or above the cursor
    done: set[int] = field(default_factory=set)
    #: the last settlement of an index since it was last handed out (below the cursor too: a
    #: repeated accept is recognised there), in two generations (see SETTLED_GENERATION)
    settled: dict[int, Settlement] = field(default_factory=dict)
    settled_before: dict[int, Settlement] = field(default_factory=dict)
    #: free messages below `frontier`: given out before and back (their delivery counts), or
    #: passed over by an acquire (0)
    deliveries: dict[int, int] = field(default_factory=dict)
    #: every record index from here on has never been handed out
    frontier: int = -1
    dead_pending: dict[int, DeadLetter] = field(default_factory=dict)
    #: held messages accepted in a transaction, until its marker: index -> (producer number,
    #: epoch); their holdings never expire meanwhile (PINNED_MS)
    txn_pending: dict[int, tuple[int, int]] = field(default_factory=dict)
    next_dead_sequence: int = 0
    accepted_total: int = 0
    dead_lettered_total: int = 0
    #: the log index of the command that made the group (0: made before groups had one), so
    #: that a group deleted and made again is told apart (its dead-letter producer)
    incarnation: int = 0
    #: derived from `acquired` (not in snapshots): messages held per consumer, and a lower
    #: bound of the lease deadlines (expiry scans only once it has passed)
    held: dict[str, int] = field(default_factory=dict, compare=False)
    next_deadline_ms: float = field(default=float("inf"), compare=False)

    def held_by(self, consumer: str) -> int:
        return self.held.get(consumer, 0)

    def hold(self, index: int, holding: Holding) -> None:
        self.acquired[index] = holding
        self.held[holding.consumer] = self.held.get(holding.consumer, 0) + 1
        if holding.deadline_ms < self.next_deadline_ms:
            self.next_deadline_ms = holding.deadline_ms

    def settlement(self, index: int) -> Settlement | None:
        """The settlement that took effect on `index` last, if still remembered."""
        return self.settled.get(index) or self.settled_before.get(index)

    def settling(self, count: int) -> dict[int, Settlement]:
        """Where a settle command of `count` indexes records what took effect: the current
        generation, the older one forgotten first if it could grow past SETTLED_GENERATION."""
        if len(self.settled) + count > SETTLED_GENERATION:
            self.settled_before, self.settled = self.settled, {}
        return self.settled

    def unhold(self, index: int) -> Holding:
        holding = self.acquired.pop(index)
        left = self.held[holding.consumer] - 1
        if left:
            self.held[holding.consumer] = left
        else:
            del self.held[holding.consumer]
        return holding


@dataclass(slots=True)
class Granted:
    index: int
    deliveries: int
    deadline_ms: int


@dataclass(slots=True)
class Result:
    """What a command did: granted acquisitions, indexes it settled (or whose settlement by
    the same consumer it repeats), newly dead-lettered indexes, and indexes it could not act
    on (held by someone else, not held under a current lease, unknown)."""

    done: list[int] = field(default_factory=list)
    dead_lettered: list[int] = field(default_factory=list)
    refused: list[int] = field(default_factory=list)
    #: a Reset or DeleteGroup that changed nothing: why (`busy: ...`, `moved`, `not_found`)
    refusal: str | None = None
    #: a Reset or DeleteGroup: the group's cursor before it, and after (a delete: where a
    #: group made again by the name would start); None when there was no group before
    previous_cursor: int | None = None
    cursor: int | None = None
    _granted: list[Granted] = field(default_factory=list)
    #: a run of new records granted (first, stop, deadline_ms), made Granted only if asked:
    #: the replicas that answer nobody never need them
    _granted_run: tuple[int, int, int] | None = None

    @property
    def granted(self) -> list[Granted]:
        if self._granted_run is not None:
            first, stop, deadline = self._granted_run
            self._granted_run = None
            self._granted[:0] = [Granted(i, 1, deadline) for i in range(first, stop)]
        return self._granted


class QueueState:
    """The consumer groups of one partition and the record ranges they consume."""

    def __init__(self, config: QueueConfig | None = None, *, start_index: int = 0) -> None:
        self.config = config or QueueConfig()
        #: record batches [base, end) at or after `start_index`, in log order (control
        #: batches are not records and never appear here)
        self._bases: list[int] = []
        self._ends: list[int] = []
        self._slot = 0  # the range the last record lookup found
        self.start_index = start_index
        self.end_index = start_index  # one past the last applied log index
        #: the log start as retention told this replica (`trim`): indexes below it are gone
        self.log_start = start_index
        self.groups: dict[str, Group] = {}
        #: the partition's transactions: records of one still open are not handed out, and
        #: those of one aborted are dropped (`drop_records`)
        self.txns = PartitionTxns(start_index)

    # ---- the log ---------------------------------------------------------------------------

    def on_records(self, base: int, count: int) -> None:
        """A committed record batch [base, base + count)."""
        if base < self.end_index or count < 1:
            raise ValueError(f"records at {base} (+{count}) do not follow {self.end_index}")
        if self._ends and self._ends[-1] == base:
            self._ends[-1] = base + count
        else:
            self._bases.append(base)
            self._ends.append(base + count)
        self.end_index = base + count
        for group in self.groups.values():
            self._advance(group)

    def on_other(self, base: int, count: int) -> None:
        """A committed entry that is not records (control, queue command)."""
        self.end_index = max(self.end_index, base + count)

    @property
    def stable_end(self) -> int:
        """Records from here on are not handed out yet: those of the oldest open transaction,
        and all after them (so a group's cursor never passes one)."""
        first = self.txns.first_open
        return self.end_index if first is None else min(self.end_index, first)

    def drop_records(self, base: int, end: int) -> None:
        """The records [base, end) are not messages after all (their transaction aborted):
        never handed out. They were never handed out before either (at or past the stable
        end of `txns` while it was open), so no group holds or finished any of them."""
        slot = bisect_right(self._bases, base) - 1
        if slot < 0 or base >= self._ends[slot]:
            return  # gone already (retention)
        first, last = self._bases[slot], self._ends[slot]
        pieces = [(b, e) for b, e in ((first, base), (min(end, last), last)) if b < e]
        self._bases[slot : slot + 1] = [b for b, _ in pieces]
        self._ends[slot : slot + 1] = [e for _, e in pieces]
        self._slot = 0
        for group in self.groups.values():
            self._advance(group)

    def trim(self, start_index: int) -> None:
        """Retention removed everything below `start_index`: those messages are gone."""
        self.log_start = max(self.log_start, start_index)
        if start_index <= self.start_index:
            return
        self.start_index = start_index
        keep = bisect_right(self._ends, start_index)
        del self._bases[:keep]
        del self._ends[:keep]
        if self._bases and self._bases[0] < start_index:
            self._bases[0] = start_index
        self.txns.trim(start_index)
        for group in self.groups.values():
            if group.cursor < start_index:
                group.cursor = start_index
                group.done = {i for i in group.done if i >= start_index}
                group.deliveries = {i: n for i, n in group.deliveries.items() if i >= start_index}
                group.frontier = max(group.frontier, start_index)
                for index in [i for i in group.acquired if i < start_index]:
                    group.unhold(index)
                    group.txn_pending.pop(index, None)
            self._advance(group)

    @property
    def known_from(self) -> int:
        """Every record range at or after this index is known here (`_prune` keeps the range
        that holds `start_index` whole, so this may lie below it)."""
        if self._bases and self._bases[0] < self.start_index:
            return self._bases[0]
        return self.start_index

    def record_ranges(self, first: int, end: int, limit: int) -> list[tuple[int, int]]:
        """Up to `limit` of the known record ranges within [first, end), clipped to it."""
        slot = max(0, bisect_right(self._bases, first) - 1)
        out: list[tuple[int, int]] = []
        for base, stop in zip(self._bases[slot:], self._ends[slot:], strict=True):
            if base >= end or len(out) >= limit:
                break
            if stop > first:
                out.append((max(base, first), min(stop, end)))
        return out

    def is_record(self, index: int) -> bool:
        slot = self._slot
        if slot < len(self._bases) and self._bases[slot] <= index < self._ends[slot]:
            return True  # most lookups fall in the range of the one before
        slot = bisect_right(self._bases, index) - 1
        if slot >= 0 and index < self._ends[slot]:
            self._slot = slot
            return True
        return False

    def records_from(self, index: int) -> Iterator[int]:
        """Record indexes at or after `index` that may be handed out, in order: below the
        stable end (those of an open transaction, and all after them, wait)."""
        slot = max(0, bisect_right(self._bases, index) - 1)
        stop = self.stable_end
        for base, end in zip(self._bases[slot:], self._ends[slot:], strict=True):
            if base >= stop:
                return
            yield from range(max(base, index), min(end, stop))

    # ---- groups ----------------------------------------------------------------------------

    def group(self, name: str) -> Group:
        """The group (created at the log start on first use)."""
        found = self.groups.get(name)
        if found is None:
            found = self.groups[name] = Group(
                self.start_index, frontier=self.start_index, incarnation=self.end_index - 1
            )
            self._advance(found)
        return found

    def _advance(self, group: Group) -> None:
        """Move the cursor over finished indexes and non-record gaps."""
        cursor = group.cursor
        done = group.done
        while cursor < self.end_index:
            slot = bisect_right(self._bases, cursor) - 1
            if slot < 0 or cursor >= self._ends[slot]:  # a gap: on to the next range
                slot += 1
                cursor = self._bases[slot] if slot < len(self._bases) else self.end_index
                continue
            end = self._ends[slot]
            if cursor in done:  # finished ones of this range, found and dropped in C
                stop = next(filterfalse(done.__contains__, range(cursor, end)), end)
                done.difference_update(range(cursor, stop))
                cursor = stop
            if cursor < end:
                break
        group.cursor = cursor

    def _free(self, group: Group, index: int, now_ms: int) -> bool:
        if index in group.done or index in group.dead_pending or index < group.cursor:
            return False
        holding = group.acquired.get(index)
        return holding is None or holding.deadline_ms <= now_ms

    def available(self, name: str, limit: int, now_ms: int) -> list[int]:
        """Up to `limit` record indexes the group could hand out at `now_ms`, oldest first
        (the leader proposes an Acquire of these; flow control applies at the leader): those
        free again below the frontier (and leases run out by `now_ms`), then new ones."""
        limit = min(limit, MAX_SCAN)
        group = self.groups.get(name)
        if group is None:
            return list(islice(self.records_from(self.start_index), limit))
        back = list(group.deliveries)
        if now_ms >= group.next_deadline_ms:
            back += [i for i, h in group.acquired.items() if h.deadline_ms <= now_ms]
        back.sort()
        out = back[:limit]
        if len(out) < limit:
            out += islice(self.records_from(max(group.frontier, group.cursor)), limit - len(out))
        return out

    def room(self, name: str, consumer: str) -> int:
        """How many more messages flow control lets `consumer` acquire in the group."""
        group = self.groups.get(name)
        if group is None:
            return min(self.config.max_acquired_per_consumer, self.config.max_acquired_per_group)
        return max(
            0,
            min(
                self.config.max_acquired_per_consumer - group.held_by(consumer),
                self.config.max_acquired_per_group - len(group.acquired),
            ),
        )

    # ---- commands --------------------------------------------------------------------------

    def apply(self, command: QueueCommand) -> Result:
        """Apply a committed command; deterministic, and a command that cannot act on an
        index (not held, held by another, already done) leaves it alone and says so."""
        validate(command)
        result = Result()
        if isinstance(command, Configure):
            self.config = replace(self.config, max_deliveries=command.max_deliveries)
            for group in self.groups.values():  # free ones already past a lowered limit
                for index in sorted(group.deliveries):
                    if group.deliveries[index] >= command.max_deliveries:
                        count = group.deliveries[index]
                        self._dead_letter(group, index, "max_deliveries", count, result)
            return result
        if isinstance(command, Reset):
            self._reset(command, result)
            self._prune()
            return result
        if isinstance(command, DeleteGroup):
            self._delete(command, result)
            self._prune()
            return result
        if isinstance(command, DeadLettered | Expire) and command.group not in self.groups:
            return result  # (late: the group was deleted) nothing to confirm or expire
        group = self.group(command.group)
        if isinstance(command, Accept) and command.txn_producer_id:
            self._txn_accept(group, command, result)
            return result
        if group.txn_pending and isinstance(command, Accept | Release | Reject | Renew):
            # what a transaction accepted waits for its marker: no other settlement
            pending = group.txn_pending
            result.refused.extend(i for i in command.indexes if i in pending)
            kept = tuple(i for i in command.indexes if i not in pending)
            if not kept:
                return result
            command = replace(command, indexes=kept)
        if isinstance(command, Acquire):
            self._expire(group, command.now_ms, result)
            lease = min(command.lease_ms, self.config.max_lease_ms)
            room = self.room(command.group, command.consumer)
            now, consumer = command.now_ms, command.consumer
            deadline = now + lease
            if self._fresh_run(group, command.indexes, room):
                # the usual case: new records in a row, none handed out before (so none is
                # held, finished or dead-lettered): no per-index checks, one shared Holding
                run = range(command.indexes[0], command.indexes[-1] + 1)
                group.acquired.update(dict.fromkeys(run, Holding(consumer, deadline, 1)))
                group.held[consumer] = group.held.get(consumer, 0) + len(run)
                group.next_deadline_ms = min(group.next_deadline_ms, deadline)
                result._granted_run = (run.start, run.stop, deadline)
                group.frontier = run.stop
            else:
                granted, refused = result.granted, result.refused
                stable = self.stable_end
                for index in command.indexes:
                    if (
                        room <= 0
                        or index >= stable
                        or not self._free(group, index, now)
                        or not self.is_record(index)
                    ):
                        refused.append(index)
                        continue
                    room -= 1
                    deliveries = group.deliveries.pop(index, 0) + 1
                    group.settled.pop(index, None)  # a new delivery: settlements are past
                    group.settled_before.pop(index, None)
                    group.hold(index, Holding(consumer, deadline, deliveries))
                    granted.append(Granted(index, deliveries, deadline))
                self._move_frontier(group, granted)
        elif isinstance(command, Accept):
            if command.now_ms is not None:
                self._expire(group, command.now_ms, result)  # leases ended by now: not held
            consumer = command.consumer
            acquired, done, finished = group.acquired, group.done, result.done
            indexes = command.indexes
            settlement = (consumer, "accept")
            settled = group.settling(len(indexes))
            mine = 0
            if self._all_held_by(group, consumer, indexes):
                # the usual case: every index held by this consumer (each once)
                deque(map(acquired.__delitem__, indexes), maxlen=0)
                done.update(indexes)
                finished.extend(indexes)
                settled.update(dict.fromkeys(indexes, settlement))
                mine = len(indexes)
            else:
                for index in indexes:
                    holding = acquired.get(index)
                    if holding is not None and holding.consumer == consumer:
                        del acquired[index]  # (held: never finished or dead-lettered too)
                        done.add(index)
                        finished.append(index)
                        settled[index] = settlement
                        mine += 1
                    elif group.settlement(index) == settlement:
                        finished.append(index)  # this consumer's accept, repeated
                    else:
                        result.refused.append(index)
            if mine:
                group.accepted_total += mine
                left = group.held[consumer] - mine
                if left:
                    group.held[consumer] = left
                else:
                    del group.held[consumer]
        elif isinstance(command, Release | Reject):
            if command.now_ms is not None:
                self._expire(group, command.now_ms, result)
            action = "reject" if isinstance(command, Reject) else "release"
            settlement = (command.consumer, action)
            settled = group.settling(len(command.indexes))
            for index in command.indexes:
                holding = group.acquired.get(index)
                if holding is None or holding.consumer != command.consumer:
                    # only a repeat of this very settlement is done; free again after its
                    # lease ended, held by another, or settled otherwise is refused
                    repeat = group.settlement(index) == settlement
                    (result.done if repeat else result.refused).append(index)
                    continue
                group.unhold(index)
                if isinstance(command, Reject):
                    self._dead_letter(group, index, command.reason, holding.deliveries, result)
                else:
                    self._returned(group, index, holding.deliveries, "max_deliveries", result)
                result.done.append(index)
                settled[index] = settlement
        elif isinstance(command, Renew):
            deadline = command.now_ms + min(command.lease_ms, self.config.max_lease_ms)
            renewed: dict[int, Holding] = {}  # deliveries -> the new (shared) holding
            for index in command.indexes:
                holding = group.acquired.get(index)
                if (
                    holding is None
                    or holding.consumer != command.consumer
                    or holding.deadline_ms <= command.now_ms
                ):
                    result.refused.append(index)  # not yours, or your lease already ran out
                else:
                    new = renewed.get(holding.deliveries)
                    if new is None:  # may shorten the lease too
                        new = renewed[holding.deliveries] = replace(holding, deadline_ms=deadline)
                    group.acquired[index] = new
                    result.done.append(index)
            if renewed:
                group.next_deadline_ms = min(group.next_deadline_ms, deadline)
        elif isinstance(command, Expire):
            self._expire(group, command.now_ms, result)
        else:
            if command.incarnation not in (None, group.incarnation):
                return result  # another incarnation's: this group has none of them
            sequences = command.sequences or (None,) * len(command.indexes)
            for index, sequence in zip(command.indexes, sequences, strict=True):
                letter = group.dead_pending.get(index)
                if letter is not None and sequence in (None, letter.sequence):
                    del group.dead_pending[index]
                    group.done.add(index)
                    group.dead_lettered_total += 1
                    result.done.append(index)
        self._advance(group)
        self._prune()
        return result

    def busy(self, name: str, now_ms: int) -> str | None:
        """Why a reset or delete of the group at `now_ms` needs `force` (None: it does not):
        messages held under leases not ended by then, accepted in an open transaction, or
        dead-lettered and not yet in the dead-letter topic."""
        group = self.groups.get(name)
        if group is None:
            return None
        held = sum(1 for h in group.acquired.values() if h.deadline_ms > now_ms)
        pinned, dead = len(group.txn_pending), len(group.dead_pending)
        parts = []
        if held:
            parts.append(
                "1 message held under a lease"
                if held == 1
                else f"{held} messages held under leases"
            )
        if pinned:
            parts.append(
                "1 message accepted in an open transaction"
                if pinned == 1
                else f"{pinned} messages accepted in open transactions"
            )
        if dead:
            parts.append(
                "1 dead letter not yet moved" if dead == 1 else f"{dead} dead letters not yet moved"
            )
        return ", ".join(parts) or None

    def _reset(self, command: Reset, result: Result) -> None:
        name = command.group
        old = self.groups.get(name)
        result.previous_cursor = None if old is None else old.cursor
        if not command.force and (why := self.busy(name, command.now_ms)) is not None:
            result.refusal = f"busy: {why}"
            return
        target = max(min(command.cursor, self.end_index), self.log_start)
        low = self.known_from
        if target < low:
            # the ranges below were forgotten: the command brings them, unless more were
            # forgotten since it was proposed (below the log start they are gone anyway)
            if max(command.known_from, self.log_start) < low:
                result.refusal = "moved"
                return
            learned = [(max(b, target), min(e, low)) for b, e in command.ranges]
            learned = [(b, e) for b, e in learned if b < e]
            if learned and self._bases and learned[-1][1] == self._bases[0]:
                self._bases[0] = learned.pop()[0]  # one range, as appending makes it
            self._bases[:0] = [b for b, _ in learned]
            self._ends[:0] = [e for _, e in learned]
            self._slot = 0
        self.start_index = min(self.start_index, target)
        fresh = Group(target, frontier=target)
        if old is not None:
            fresh.next_dead_sequence = old.next_dead_sequence  # (the producer's sequences)
            fresh.accepted_total = old.accepted_total
            fresh.dead_lettered_total = old.dead_lettered_total
            fresh.incarnation = old.incarnation
        else:
            fresh.incarnation = self.end_index - 1
        self.groups[name] = fresh
        self._advance(fresh)
        result.cursor = fresh.cursor

    def _delete(self, command: DeleteGroup, result: Result) -> None:
        group = self.groups.get(command.group)
        if group is None:
            result.refusal = "not_found"
            return
        result.previous_cursor = group.cursor
        if not command.force and (why := self.busy(command.group, command.now_ms)) is not None:
            result.refusal = f"busy: {why}"
            return
        del self.groups[command.group]
        result.cursor = self.start_index

    def _prune(self) -> None:
        """Forget record ranges below every group's cursor: memory follows the backlog, not
        the history (a group created later starts at `start_index`)."""
        if not self.groups or not self._ends:
            return
        floor = min(group.cursor for group in self.groups.values())
        if self._ends[0] > floor:
            return
        keep = bisect_right(self._ends, floor)
        del self._bases[:keep]
        del self._ends[:keep]
        self.start_index = max(self.start_index, floor)

    def _fresh_run(self, group: Group, indexes: tuple[int, ...], room: int) -> bool:
        """Are `indexes` the next new records, consecutive, within `room`?"""
        first, last = indexes[0], indexes[-1]
        return (
            last - first + 1 == len(indexes) <= room
            # the first new record: none is passed over
            and next(self.records_from(max(group.frontier, group.cursor)), None) == first
            and self._same_range(first, last)
            and last < self.stable_end
            and indexes == tuple(range(first, last + 1))
        )

    @staticmethod
    def _all_held_by(group: Group, consumer: str, indexes: tuple[int, ...]) -> bool:
        """Does `consumer` hold every one of `indexes`, each listed once?"""
        holdings = list(map(group.acquired.get, indexes))
        distinct = dict(zip(map(id, holdings), holdings, strict=True)).values()  # few: shared
        if any(h is None or h.consumer != consumer for h in distinct):
            return False
        return len(indexes) == 1 or len(set(indexes)) == len(indexes)

    def _same_range(self, first: int, last: int) -> bool:
        slot = bisect_right(self._bases, first) - 1
        return slot >= 0 and last < self._ends[slot]

    def _move_frontier(self, group: Group, granted: list[Granted]) -> None:
        """Past the new ones granted; new ones passed over are free below it (count 0)."""
        start = max(group.frontier, group.cursor)
        fresh = {g.index for g in granted if g.index >= start}
        if not fresh:
            return
        end = max(fresh) + 1
        for index in self.records_from(start):
            if index >= end:
                break
            if index not in fresh:
                group.deliveries[index] = 0
        group.frontier = end

    def _expire(self, group: Group, now_ms: int, result: Result) -> None:
        if now_ms < group.next_deadline_ms:
            return
        expired = sorted(i for i, h in group.acquired.items() if h.deadline_ms <= now_ms)
        for index in expired:
            holding = group.unhold(index)
            self._returned(group, index, holding.deliveries, "max_deliveries", result)
        group.next_deadline_ms = min(
            (h.deadline_ms for h in group.acquired.values()), default=float("inf")
        )

    def _txn_accept(self, group: Group, command: Accept, result: Result) -> None:
        """Pin what `command.consumer` holds of `command.indexes` for the transaction of
        `command.txn_producer_id`; a fenced epoch's accept is refused whole."""
        number, epoch = TxnProducer.of(command.txn_producer_id)
        if epoch < self.txns.epoch_of(number):
            result.refused.extend(command.indexes)
            return
        if command.now_ms is not None:
            self._expire(group, command.now_ms, result)
        mine = (number, epoch)
        for index in command.indexes:
            holding = group.acquired.get(index)
            if holding is None or holding.consumer != command.consumer:
                result.refused.append(index)
            elif index in group.txn_pending:  # pinned already: by this transaction, a repeat
                (result.done if group.txn_pending[index] == mine else result.refused).append(index)
            else:
                group.acquired[index] = replace(holding, deadline_ms=PINNED_MS)
                group.txn_pending[index] = mine
                result.done.append(index)

    def on_txn_marker(self, index: int, producer: TxnProducer, *, commit: bool) -> None:
        """A transaction marker at `index` (laminar.txn.markers): the partition's transactions
        take it, and what the ended transaction accepted here is finished (COMMIT) or given
        back (ABORT; and so are the accepts of any older epoch of the producer)."""
        outcome = self.txns.on_marker(index, producer, commit=commit)
        if outcome is None or outcome is Outcome.STALE:
            return
        number, epoch = producer
        for name, group in self.groups.items():
            ended: dict[tuple[bool, str], list[int]] = {}
            for held, (n, e) in list(group.txn_pending.items()):
                if n != number or e >= epoch:
                    continue
                del group.txn_pending[held]
                consumer = group.acquired[held].consumer
                ended.setdefault((commit and e == epoch - 1, consumer), []).append(held)
            for (accepted, consumer), indexes in sorted(ended.items()):
                kind = Accept if accepted else Release
                self.apply(kind(name, consumer, tuple(sorted(indexes))))

    def _returned(
        self, group: Group, index: int, deliveries: int, reason: str, result: Result
    ) -> None:
        """A message came back unfinished: free again, or dead-lettered past the limit."""
        if deliveries >= self.config.max_deliveries:
            self._dead_letter(group, index, reason, deliveries, result)
        else:
            group.deliveries[index] = deliveries

    def _dead_letter(
        self, group: Group, index: int, reason: str, deliveries: int, result: Result
    ) -> None:
        group.deliveries.pop(index, None)
        group.dead_pending[index] = DeadLetter(group.next_dead_sequence, reason, deliveries)
        group.next_dead_sequence += 1
        result.dead_lettered.append(index)

    # ---- views -----------------------------------------------------------------------------

    def describe(self, name: str) -> dict[str, int]:
        group = self.groups.get(name) or Group(self.start_index)
        records = sum(
            max(0, end - max(base, group.cursor))
            for base, end in zip(self._bases, self._ends, strict=True)
        )
        in_flight = len(group.done) + len(group.acquired) + len(group.dead_pending)
        return {
            "cursor": group.cursor,
            # (Kafka's consumer lag, in records: what the metric laminar_group_lag says)
            "lag": max(0, records - in_flight) + len(group.acquired) + len(group.dead_pending),
            "acquired": len(group.acquired),
            "pending": max(0, records - in_flight),
            "dead_letter_pending": len(group.dead_pending),
            "accepted": group.accepted_total,
            "dead_lettered": group.dead_lettered_total,
        }

    # ---- snapshots -------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        groups = {}
        for name, g in sorted(self.groups.items()):
            groups[name] = {
                "cursor": g.cursor,
                "acquired": [
                    [i, h.consumer, h.deadline_ms, h.deliveries]
                    for i, h in sorted(g.acquired.items())
                ],
                "done": sorted(g.done),
                "settled": _settled_runs(g.settled),
                "settled_before": _settled_runs(g.settled_before),
                "deliveries": sorted([i, n] for i, n in g.deliveries.items()),
                "dead_pending": [
                    [i, d.sequence, d.reason, d.deliveries]
                    for i, d in sorted(g.dead_pending.items())
                ],
                "next_dead_sequence": g.next_dead_sequence,
                "frontier": g.frontier,
                "accepted_total": g.accepted_total,
                "dead_lettered_total": g.dead_lettered_total,
            }
            if g.incarnation:
                groups[name]["incarnation"] = g.incarnation
            if g.txn_pending:
                groups[name]["txn_pending"] = sorted(
                    [i, n, e] for i, (n, e) in g.txn_pending.items()
                )
        document = {
            "version": SNAPSHOT_VERSION,
            "start_index": self.start_index,
            "end_index": self.end_index,
            "log_start": self.log_start,
            "max_deliveries": self.config.max_deliveries,
            "ranges": [[b, e] for b, e in zip(self._bases, self._ends, strict=True)],
            "groups": groups,
            "transactions": self.txns.document(),
        }
        return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def restore(cls, data: bytes, config: QueueConfig | None = None) -> QueueState:
        document = json.loads(data)
        if document.get("version") not in READABLE_SNAPSHOT_VERSIONS:
            raise ValueError(f"unknown queue snapshot version {document.get('version')!r}")
        config = replace(config or QueueConfig(), max_deliveries=document["max_deliveries"])
        state = cls(config, start_index=document["start_index"])
        state.end_index = document["end_index"]
        state.log_start = document.get("log_start", state.start_index)
        if "transactions" in document:  # (none before transactions: a fresh state)
            state.txns = PartitionTxns.from_document(document["transactions"])
        else:
            state.txns = PartitionTxns(state.end_index)
        for base, end in document["ranges"]:
            state._bases.append(base)
            state._ends.append(end)
        for name, g in document["groups"].items():
            group = state.groups[name] = Group(
                cursor=g["cursor"],
                done=set(g["done"]),
                settled=_settled_from_runs(g.get("settled", [])),
                settled_before=_settled_from_runs(g.get("settled_before", [])),
                deliveries={i: n for i, n in g["deliveries"]},
                dead_pending={i: DeadLetter(s, r, n) for i, s, r, n in g["dead_pending"]},
                next_dead_sequence=g["next_dead_sequence"],
                frontier=g["frontier"],
                accepted_total=g["accepted_total"],
                dead_lettered_total=g["dead_lettered_total"],
                txn_pending={i: (n, e) for i, n, e in g.get("txn_pending", [])},
                incarnation=g.get("incarnation", 0),
            )
            for index, consumer, deadline, deliveries in g["acquired"]:
                group.hold(index, Holding(consumer, deadline, deliveries))
        return state


def _settled_runs(settled: dict[int, Settlement]) -> list[list[Any]]:
    """A generation of settlements in the order they were made (the same on every replica),
    as runs [first index, count, consumer, action] of consecutive indexes settled alike: an
    accept of a run of records is one."""
    runs: list[list[Any]] = []
    stop, last = -1, None
    for index, settlement in settled.items():
        if index == stop and settlement == last:
            runs[-1][1] += 1
        else:
            runs.append([index, 1, *settlement])
            last = settlement
        stop = index + 1
    return runs


def _settled_from_runs(runs: list[list[Any]]) -> dict[int, Settlement]:
    settled: dict[int, Settlement] = {}
    for first, count, consumer, action in runs:
        settled.update(dict.fromkeys(range(first, first + count), (consumer, action)))
    return settled
