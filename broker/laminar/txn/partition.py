"""A partition's transactions, as a deterministic state machine (docs/transactions.md).

Every replica applies the same committed entries in the same order: transactional record
batches (`on_batch`), the coordinator's COMMIT and ABORT markers (`on_marker`), and every other
entry (`on_other`). Nothing here reads a clock or does I/O; the replica and the simulator drive
it alike, and applying is idempotent by index (entries below `end_index` are skipped).

The rules, per producer number (a transactional id's producer; `laminar.txn.producer`). The
coordinator ends every transaction of epoch e with markers of epoch e + 1, and the producer's
next transaction writes with e + 1: so each epoch has one transaction, and a write that comes
late, after its transaction ended, is a lower epoch than the partition has seen.

* a partition remembers the highest epoch it has seen of each number (in batches and
  markers). A batch of a lower epoch is fenced (a zombie's, or a late one): aborted at once
  (`Verdict.FENCED`), never visible to `read_committed` readers;
* the first batch of an epoch opens its transaction here, from that batch's index; later
  batches of the same epoch join it. A batch of a higher epoch while an older one is open
  aborts the older one (defence in depth: the coordinator ends it first) and opens its own;
* a marker of epoch m ends the open transaction if that is of an epoch below m: a COMMIT
  marker of m = its epoch + 1 commits it (its batches become visible); any other marker
  aborts it (its batches, and only its producer's, in [first, last], are recorded as an
  aborted range). A marker below the highest epoch seen, or not above the open
  transaction's, is stale and changes nothing; one with nothing open changes nothing either
  (markers are written again after a coordinator failover).

`stable_end` is the first index a `read_committed` reader may not read yet: the first index
of the oldest open transaction, or the applied end. Below it, a batch is visible unless it
lies in an aborted range of its own producer (`aborted`). Aborted ranges and the epochs of
producers with nothing open are forgotten once retention has removed what they cover
(`trim`), so the state is bounded by the log it describes. `snapshot` is canonical JSON.
"""

from __future__ import annotations

import bisect
import enum
from dataclasses import dataclass
from typing import Any

import orjson

from .producer import TxnProducer

SNAPSHOT_VERSION = 1


class Verdict(enum.Enum):
    """What became of a transactional batch."""

    OPEN = "open"  # part of its producer's open transaction
    FENCED = "fenced"  # an older epoch than this partition has seen: aborted at once


class Outcome(enum.Enum):
    """What a marker did."""

    COMMITTED = "committed"
    ABORTED = "aborted"
    NOTHING = "nothing"  # no transaction of the producer was open here
    STALE = "stale"  # an older epoch than this partition has seen


@dataclass(slots=True)
class OpenTxn:
    epoch: int
    first_index: int
    last_index: int
    #: its batches here, [base, end) each (a consumer group drops them if it aborts)
    batches: list[tuple[int, int]]


@dataclass(frozen=True, slots=True)
class AbortedRange:
    """The batches of producer `number` in [first_index, last_index] are aborted."""

    number: int
    first_index: int
    last_index: int


class PartitionTxns:
    def __init__(self, start_index: int = 0) -> None:
        #: the next index to apply
        self.end_index = start_index
        self._epochs: dict[int, int] = {}
        self._last_seen: dict[int, int] = {}  # number -> its last batch's or marker's index
        self._open: dict[int, OpenTxn] = {}
        self._aborted: list[AbortedRange] = []  # ordered by last_index
        self._aborted_lasts: list[int] = []  # their last_index, for bisect
        self._dropped: list[tuple[int, int]] = []  # batches aborted since `take_aborted`

    # ---- applying ---------------------------------------------------------------------------

    def on_other(self, index: int, count: int) -> None:
        """A non-transactional entry [index, index + count)."""
        if index >= self.end_index:
            self.end_index = index + count

    def on_batch(self, index: int, count: int, producer: TxnProducer) -> Verdict | None:
        """A transactional batch [index, index + count) of `producer` (None: applied before)."""
        if index < self.end_index:
            return None
        self.end_index = index + count
        last = index + count - 1
        number, epoch = producer
        self._last_seen[number] = last
        known = self._epochs.get(number, -1)
        if epoch < known:
            self._add_aborted(AbortedRange(number, index, last))
            self._dropped.append((index, index + count))
            return Verdict.FENCED
        self._epochs[number] = epoch
        txn = self._open.get(number)
        if txn is not None and txn.epoch == epoch:
            txn.last_index = last
            txn.batches.append((index, index + count))
            return Verdict.OPEN
        if txn is not None:  # an older epoch still open: its successor aborts it
            self._abort(number, txn)
        self._open[number] = OpenTxn(epoch, index, last, [(index, index + count)])
        return Verdict.OPEN

    def on_marker(self, index: int, producer: TxnProducer, *, commit: bool) -> Outcome | None:
        """The coordinator's COMMIT (`commit`) or ABORT marker at `index`, `producer` naming
        the epoch the marker carries (None: applied before)."""
        if index < self.end_index:
            return None
        self.end_index = index + 1
        number, epoch = producer
        txn = self._open.get(number)
        if epoch < self._epochs.get(number, -1) or (txn is not None and epoch <= txn.epoch):
            return Outcome.STALE
        self._epochs[number] = epoch
        self._last_seen[number] = index
        if txn is None:
            return Outcome.NOTHING
        del self._open[number]
        if commit and txn.epoch == epoch - 1:
            return Outcome.COMMITTED
        self._abort(number, txn)
        return Outcome.ABORTED

    def _abort(self, number: int, txn: OpenTxn) -> None:
        self._add_aborted(AbortedRange(number, txn.first_index, txn.last_index))
        self._dropped.extend(txn.batches)

    def take_aborted(self) -> list[tuple[int, int]]:
        """The batches, [base, end) each, aborted (or fenced) since the last call, in the
        order they were: a partition's consumer groups drop them."""
        dropped, self._dropped = self._dropped, []
        return dropped

    def _add_aborted(self, aborted: AbortedRange) -> None:
        at = bisect.bisect_right(self._aborted_lasts, aborted.last_index)
        self._aborted.insert(at, aborted)
        self._aborted_lasts.insert(at, aborted.last_index)

    # ---- reading ----------------------------------------------------------------------------

    @property
    def stable_end(self) -> int:
        """The first index a read_committed reader may not read yet."""
        first = self.first_open
        return self.end_index if first is None else min(self.end_index, first)

    @property
    def first_open(self) -> int | None:
        """The first index of the oldest open transaction (None: none is open)."""
        if not self._open:
            return None
        return min(txn.first_index for txn in self._open.values())

    def epoch_of(self, number: int) -> int:
        """The highest epoch of producer `number` seen here (-1: none, or forgotten)."""
        return self._epochs.get(number, -1)

    @property
    def open_count(self) -> int:
        return len(self._open)

    def open_transactions(self) -> dict[TxnProducer, tuple[int, int]]:
        """Each open transaction's producer and [first, last] index here."""
        return {
            TxnProducer(number, txn.epoch): (txn.first_index, txn.last_index)
            for number, txn in self._open.items()
        }

    def aborted_between(self, low: int, high: int) -> list[AbortedRange]:
        """The aborted ranges that overlap [low, high), in order of their last index."""
        start = bisect.bisect_left(self._aborted_lasts, low)
        return [r for r in self._aborted[start:] if r.first_index < high]

    def aborted(self, number: int, index: int) -> bool:
        """Whether the transactional batch of producer `number` at `index` is aborted."""
        return any(r.number == number for r in self.aborted_between(index, index + 1))

    # ---- bounds and persistence ---------------------------------------------------------------

    def trim(self, start_index: int) -> None:
        """Retention removed the log below `start_index`: forget what only it concerned."""
        cut = bisect.bisect_left(self._aborted_lasts, start_index)
        if cut:
            del self._aborted[:cut]
            del self._aborted_lasts[:cut]
        for number in [n for n, last in self._last_seen.items() if last < start_index]:
            if number not in self._open:
                del self._last_seen[number]
                self._epochs.pop(number, None)
        self.end_index = max(self.end_index, start_index)

    def document(self) -> dict[str, Any]:
        """The state as a JSON value (canonical: the same state gives the same value)."""
        return {
            "version": SNAPSHOT_VERSION,
            "end_index": self.end_index,
            "producers": sorted(
                [n, self._epochs[n], self._last_seen.get(n, -1)] for n in self._epochs
            ),
            "open": sorted(
                [n, t.epoch, t.first_index, t.last_index, [list(b) for b in t.batches]]
                for n, t in self._open.items()
            ),
            "aborted": [[r.number, r.first_index, r.last_index] for r in self._aborted],
        }

    def snapshot(self) -> bytes:
        return orjson.dumps(self.document())

    @classmethod
    def restore(cls, data: bytes) -> PartitionTxns:
        return cls.from_document(orjson.loads(data))

    @classmethod
    def from_document(cls, document: Any) -> PartitionTxns:
        if document.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"transaction snapshot version {document.get('version')!r}")
        state = cls(int(document["end_index"]))
        for number, epoch, last in document["producers"]:
            state._epochs[int(number)] = int(epoch)
            if last >= 0:
                state._last_seen[int(number)] = int(last)
        for number, epoch, first, last, batches in document["open"]:
            state._open[int(number)] = OpenTxn(
                int(epoch), int(first), int(last), [(int(b), int(e)) for b, e in batches]
            )
        for number, first, last in document["aborted"]:
            state._add_aborted(AbortedRange(int(number), int(first), int(last)))
        return state
