"""The transaction coordinator's state, part of the cluster metadata (docs/transactions.md).

Its commands are entries of the `__cluster` Raft group, applied in log order on every node
(`ClusterState.apply`), so every partition leader can check a transactional write against its
own copy. Deterministic and all-or-nothing: a command that cannot apply raises MetadataError
and changes nothing. Time is never read here: commands carry the proposer's `now_ms`.

A transactional id moves through EMPTY → ONGOING → PREPARE_COMMIT or PREPARE_ABORT → EMPTY.
The epoch e of an ONGOING transaction is the one its batches carry; ending it (`EndTxn`, or
`InitTxn` of the same id, which fences the old instance) prepares markers of epoch e + 1, and
`CompleteTxn` (once every partition's marker is committed) leaves the id EMPTY at e + 1. An id
whose next epoch would be MAX_EPOCH gets a new producer number instead: markers of MAX_EPOCH
end the old one, and no write ever uses it.

One `EndTxn` may end several ids' transactions together (`also`): one entry decides them all,
so they commit all or none (the Spark sink's tasks each write as an id of their own, and the
driver commits them as one). It may carry a `tag`, kept with how the id's last transaction
ended, so that work run again can see it was committed already. An id left EMPTY for its
`expiry_ms` is forgotten (`ForgetIdleTxns`): its producer number is never given out again,
so nothing it wrote can be taken for another's.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field, replace
from typing import Any

from ..contract import MAX_TXN_TIMEOUT_MS
from .producer import MAX_EPOCH, MAX_PRODUCER_NUMBER, TxnProducer

#: A transactional id: what the application names its producer by.
TRANSACTIONAL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")
DEFAULT_TIMEOUT_MS = 60_000
#: How long an id with no transaction open is kept (Kafka's transactional.id.expiration.ms).
DEFAULT_EXPIRY_MS = 7 * 24 * 3600 * 1000
MIN_EXPIRY_MS = 60_000
MAX_EXPIRY_MS = 90 * 24 * 3600 * 1000
#: Partitions one transaction may write to, and transactional ids the cluster keeps.
MAX_TXN_PARTITIONS = 10_000
MAX_TRANSACTIONAL_IDS = 100_000
#: Other ids one EndTxn may end with its own, and the longest tag.
MAX_ENDED_TOGETHER = 1_000
MAX_TAG_CHARS = 200


class TxnError(ValueError):
    """A command that cannot apply. `code`: invalid, not_found, fenced (an older epoch or
    number than the id's), or busy (the id's transaction is ending: retry)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Phase(enum.Enum):
    EMPTY = "empty"
    ONGOING = "ongoing"
    PREPARE_COMMIT = "prepare_commit"
    PREPARE_ABORT = "prepare_abort"


ENDING = (Phase.PREPARE_COMMIT, Phase.PREPARE_ABORT)
TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class TxnRecord:
    txn_id: str
    number: int
    #: the epoch writes carry (EMPTY, ONGOING); while PREPARE, the ending transaction's
    epoch: int
    phase: Phase = Phase.EMPTY
    partitions: tuple[TopicPartition, ...] = ()
    started_ms: int = 0
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    #: the metadata index of the InitTxn that gave out `epoch` (its proposer answers with
    #: it only if no later InitTxn took the id)
    init_index: int = -1
    #: how the last transaction ended (True: committed; set once decided), for an EndTxn
    #: sent again
    last_commit: bool | None = None
    #: the tag of the EndTxn that ended it
    last_tag: str | None = None
    #: when the id was last inited, added to or ended (the proposers' clocks)
    used_ms: int = 0
    #: how long it is kept once EMPTY and unused
    expiry_ms: int = DEFAULT_EXPIRY_MS

    @property
    def producer(self) -> TxnProducer:
        return TxnProducer(self.number, self.epoch)

    @property
    def marker_producer(self) -> TxnProducer:
        """The producer (number, epoch + 1) a PREPARE transaction's markers carry."""
        return TxnProducer(self.number, self.epoch + 1)

    def expired(self, now_ms: int) -> bool:
        return self.phase is Phase.ONGOING and now_ms - self.started_ms > self.timeout_ms

    def idle(self, now_ms: int) -> bool:
        """EMPTY and unused past its expiry: to be forgotten."""
        return self.phase is Phase.EMPTY and now_ms - self.used_ms > self.expiry_ms


@dataclass(frozen=True, slots=True)
class InitTxn:
    """Start (or restart) the transactional producer `txn_id`: a new epoch, fencing every
    older one; an ONGOING transaction of the id is aborted."""

    txn_id: str
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    now_ms: int = 0
    expiry_ms: int = DEFAULT_EXPIRY_MS


@dataclass(frozen=True, slots=True)
class AddTxnPartitions:
    """The transaction of (number, epoch) writes to `partitions` (and starts, if EMPTY)."""

    txn_id: str
    number: int
    epoch: int
    partitions: tuple[TopicPartition, ...]
    now_ms: int


@dataclass(frozen=True, slots=True)
class EndTxn:
    """Commit (`commit`) or abort the ONGOING transaction of (number, epoch), and with it
    those of `also`'s (txn_id, number, epoch): all or none."""

    txn_id: str
    number: int
    epoch: int
    commit: bool
    also: tuple[tuple[str, int, int], ...] = ()
    tag: str | None = None
    now_ms: int = 0

    def ends(self) -> tuple[tuple[str, int, int], ...]:
        """Every (txn_id, number, epoch) it ends, its own first."""
        return ((self.txn_id, self.number, self.epoch), *self.also)


@dataclass(frozen=True, slots=True)
class CompleteTxn:
    """Every partition of the PREPARE transaction of (number, epoch) has its marker."""

    txn_id: str
    number: int
    epoch: int


@dataclass(frozen=True, slots=True)
class ForgetIdleTxns:
    """Forget those of `txn_ids` still idle at `now_ms` (`TxnRecord.idle`); the others stay."""

    txn_ids: tuple[str, ...]
    now_ms: int


TxnCommand = InitTxn | AddTxnPartitions | EndTxn | CompleteTxn | ForgetIdleTxns


def _check_id(txn_id: object) -> str:
    if not isinstance(txn_id, str) or not TRANSACTIONAL_ID.fullmatch(txn_id):
        raise TxnError(
            "invalid", f"transactional id {txn_id!r} must match {TRANSACTIONAL_ID.pattern}"
        )
    return txn_id


def _check_producer(number: object, epoch: object) -> None:
    _check_int("number", number, 1, MAX_PRODUCER_NUMBER)
    _check_int("epoch", epoch, 0, MAX_EPOCH - 1)


def validate(command: TxnCommand) -> None:
    """Checks that need no state. TxnError("invalid")."""
    if isinstance(command, ForgetIdleTxns):
        ids = command.txn_ids
        if not isinstance(ids, tuple) or not 1 <= len(ids) <= MAX_TRANSACTIONAL_IDS:
            raise TxnError("invalid", f"txn_ids: 1 to {MAX_TRANSACTIONAL_IDS} ids")
        for txn_id in ids:
            _check_id(txn_id)
        _check_int("now_ms", command.now_ms, 0, 2**63 - 1)
        return
    _check_id(command.txn_id)
    if isinstance(command, InitTxn):
        _check_int("timeout_ms", command.timeout_ms, 1, MAX_TXN_TIMEOUT_MS)
        _check_int("now_ms", command.now_ms, 0, 2**63 - 1)
        _check_int("expiry_ms", command.expiry_ms, MIN_EXPIRY_MS, MAX_EXPIRY_MS)
        return
    _check_producer(command.number, command.epoch)
    if isinstance(command, EndTxn):
        _validate_end(command)
    elif isinstance(command, AddTxnPartitions):
        _check_int("now_ms", command.now_ms, 0, 2**63 - 1)
        parts = command.partitions
        if not isinstance(parts, tuple) or not 1 <= len(parts) <= MAX_TXN_PARTITIONS:
            raise TxnError("invalid", f"partitions: 1 to {MAX_TXN_PARTITIONS} (topic, partition)")
        for part in parts:
            if not (
                isinstance(part, tuple)
                and len(part) == 2
                and isinstance(part[0], str)
                and isinstance(part[1], int)
                and not isinstance(part[1], bool)
                and part[1] >= 0
            ):
                raise TxnError("invalid", f"{part!r} is not a (topic, partition)")


def _validate_end(command: EndTxn) -> None:
    if not isinstance(command.commit, bool):
        raise TxnError("invalid", "commit must be true or false")
    _check_int("now_ms", command.now_ms, 0, 2**63 - 1)
    tag = command.tag
    if tag is not None and (
        not isinstance(tag, str) or not 1 <= len(tag) <= MAX_TAG_CHARS or not tag.isprintable()
    ):
        raise TxnError("invalid", f"tag: 1 to {MAX_TAG_CHARS} printable characters")
    also = command.also
    if not isinstance(also, tuple) or len(also) > MAX_ENDED_TOGETHER:
        raise TxnError("invalid", f"also: at most {MAX_ENDED_TOGETHER} other transactions")
    for item in also:
        if not isinstance(item, tuple) or len(item) != 3:
            raise TxnError("invalid", f"{item!r} is not a (txn_id, number, epoch)")
        _check_id(item[0])
        _check_producer(item[1], item[2])
    ids = [txn_id for txn_id, _, _ in command.ends()]
    if len(set(ids)) != len(ids):
        raise TxnError("invalid", "a transactional id is named twice")


def _check_int(name: str, value: object, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise TxnError("invalid", f"{name}={value!r} must be an integer in [{low}, {high}]")
    return value


@dataclass
class Coordinator:
    """Every transactional id's record, and the next producer number to give out."""

    records: dict[str, TxnRecord] = field(default_factory=dict)
    next_number: int = 1
    #: producer number -> transactional id (derived from `records`)
    _ids: dict[int, str] = field(default_factory=dict)
    #: transactional id -> its partitions as a set, for `may_write` (derived)
    _partition_sets: dict[str, frozenset[TopicPartition]] = field(default_factory=dict)

    def _put(self, record: TxnRecord) -> None:
        old = self.records.get(record.txn_id)
        if old is not None and old.number != record.number:
            self._ids.pop(old.number, None)
        self.records[record.txn_id] = record
        self._ids[record.number] = record.txn_id
        if old is None or old.partitions is not record.partitions:
            self._partition_sets[record.txn_id] = frozenset(record.partitions)

    def apply(self, index: int, command: TxnCommand, partitions_of: dict[str, int]) -> None:
        """Apply `command`, committed at metadata `index` (`partitions_of`: each topic's
        partition count). Raises TxnError and changes nothing when it cannot apply."""
        validate(command)
        if isinstance(command, InitTxn):
            self._init(index, command)
        elif isinstance(command, ForgetIdleTxns):
            self._forget(command)
        elif isinstance(command, EndTxn):
            self._end_all(command)
        elif isinstance(command, CompleteTxn):
            self._complete(self._found(command.txn_id), command)
        else:
            record = self._found(command.txn_id)
            if not self._to_end(record, command.number, command.epoch, None):
                raise TxnError("busy", f"{command.txn_id}: its transaction is ending; retry")
            self._add(record, command, partitions_of)

    def _found(self, txn_id: str) -> TxnRecord:
        record = self.records.get(txn_id)
        if record is None:
            raise TxnError("not_found", f"no transactional id {txn_id!r}: init it first")
        return record

    def _to_end(self, record: TxnRecord, number: int, epoch: int, commit: bool | None) -> bool:
        """May the transaction of (number, epoch) be ended (`commit`: how; None: written to)?
        False: it has ended, or is ending, as asked (an end sent again). TxnError otherwise."""
        if (number, epoch) != (record.number, record.epoch):
            if commit is not None and self._ended_as(record, number, epoch, commit):
                return False
            raise TxnError(
                "fenced",
                f"{record.txn_id}: epoch {epoch} of producer {number} is fenced (the id is at "
                f"epoch {record.epoch} of producer {record.number})",
            )
        if record.phase in ENDING:
            if commit is not None and commit == (record.phase is Phase.PREPARE_COMMIT):
                return False
            raise TxnError("busy", f"{record.txn_id}: its transaction is ending; retry")
        return True

    def _end_all(self, command: EndTxn) -> None:
        """Every transaction `command` names ends, or (TxnError) none."""
        to_end = [
            record
            for txn_id, number, epoch in command.ends()
            if self._to_end(record := self._found(txn_id), number, epoch, command.commit)
        ]
        for record in to_end:
            self._end(record, command.commit, tag=command.tag, now_ms=command.now_ms)

    def _init(self, index: int, command: InitTxn) -> None:
        record = self.records.get(command.txn_id)
        if record is None:
            if len(self.records) >= MAX_TRANSACTIONAL_IDS:
                raise TxnError(
                    "invalid",
                    f"the cluster keeps {MAX_TRANSACTIONAL_IDS} ids at most (an id is "
                    "forgotten after its expiry_ms unused)",
                )
            record = TxnRecord(command.txn_id, self._new_number(), 0)  # (put below)
        elif record.phase is Phase.ONGOING:
            # the old instance's transaction is aborted (which fences it); the init gives out
            # no epoch (`init_index` unchanged): its proposer answers "busy", to retry
            self._end(record, commit=False, tag=None, now_ms=command.now_ms)
            return
        elif record.phase is not Phase.EMPTY:
            raise TxnError("busy", f"{command.txn_id}: its transaction is ending; retry")
        else:
            record = self._next_epoch(record)
        self._put(
            replace(
                record,
                timeout_ms=command.timeout_ms,
                init_index=index,
                used_ms=max(record.used_ms, command.now_ms),
                expiry_ms=command.expiry_ms,
            )
        )

    def _forget(self, command: ForgetIdleTxns) -> None:
        for txn_id in command.txn_ids:
            record = self.records.get(txn_id)
            if record is not None and record.idle(command.now_ms):
                del self.records[txn_id]
                del self._partition_sets[txn_id]
                self._ids.pop(record.number, None)

    def _add(
        self, record: TxnRecord, command: AddTxnPartitions, partitions_of: dict[str, int]
    ) -> None:
        for topic, partition in command.partitions:
            count = partitions_of.get(topic)
            if count is None:
                raise TxnError("not_found", f"topic {topic} does not exist")
            if partition >= count:
                raise TxnError("not_found", f"topic {topic} has partitions 0..{count - 1}")
        merged = tuple(sorted(set(record.partitions) | set(command.partitions)))
        if len(merged) > MAX_TXN_PARTITIONS:
            raise TxnError("invalid", f"a transaction writes to {MAX_TXN_PARTITIONS} at most")
        started = record.started_ms if record.phase is Phase.ONGOING else command.now_ms
        used = max(record.used_ms, command.now_ms)
        self._put(
            replace(
                record, phase=Phase.ONGOING, partitions=merged, started_ms=started, used_ms=used
            )
        )

    def _end(self, record: TxnRecord, commit: bool, *, tag: str | None, now_ms: int) -> None:
        decided = replace(
            record, last_commit=commit, last_tag=tag, used_ms=max(record.used_ms, now_ms)
        )
        if record.phase is Phase.EMPTY or not record.partitions:
            # nothing written: nothing to mark; the epoch moves on all the same
            self._put(replace(self._next_epoch(decided), phase=Phase.EMPTY, partitions=()))
            return
        phase = Phase.PREPARE_COMMIT if commit else Phase.PREPARE_ABORT
        self._put(replace(decided, phase=phase))

    def _complete(self, record: TxnRecord, command: CompleteTxn) -> None:
        if record.phase not in ENDING or (
            command.number,
            command.epoch,
        ) != (record.number, record.epoch):
            raise TxnError("invalid", f"{command.txn_id}: no such transaction is ending")
        commit = record.phase is Phase.PREPARE_COMMIT
        ended = self._next_epoch(record)
        self._put(replace(ended, phase=Phase.EMPTY, partitions=(), last_commit=commit))

    def _next_epoch(self, record: TxnRecord) -> TxnRecord:
        if record.epoch + 1 < MAX_EPOCH:
            return replace(record, epoch=record.epoch + 1)
        return replace(record, number=self._new_number(), epoch=0)

    def _new_number(self) -> int:
        number = self.next_number
        self.next_number += 1
        return number

    @staticmethod
    def _ended_as(record: TxnRecord, number: int, epoch: int, commit: bool) -> bool:
        """Was the transaction (number, epoch) the one that ended last, as `commit` says?"""
        return (
            record.phase is Phase.EMPTY
            and (record.number, record.epoch) == (number, epoch + 1)
            and record.last_commit == commit
        )

    # ---- questions and persistence ----------------------------------------------------------

    def may_write(self, producer: TxnProducer, topic: str, partition: int) -> TxnRecord | None:
        """The record whose ONGOING transaction `producer` may write `topic`/`partition` in,
        or None."""
        txn_id = self._ids.get(producer.number)
        record = None if txn_id is None else self.records[txn_id]
        if (
            record is not None
            and record.producer == producer
            and record.phase is Phase.ONGOING
            and (topic, partition) in self._partition_sets[record.txn_id]
        ):
            return record
        return None

    def ending(self) -> list[TxnRecord]:
        """The transactions whose markers are to be written, by id."""
        return sorted(
            (r for r in self.records.values() if r.phase in ENDING), key=lambda r: r.txn_id
        )

    def expired(self, now_ms: int) -> list[TxnRecord]:
        """The ONGOING transactions past their timeout at `now_ms`."""
        return sorted(
            (r for r in self.records.values() if r.expired(now_ms)), key=lambda r: r.txn_id
        )

    def idle(self, now_ms: int, limit: int = MAX_ENDED_TOGETHER) -> tuple[str, ...]:
        """Up to `limit` ids (by id) idle at `now_ms`: for a ForgetIdleTxns."""
        return tuple(sorted(r.txn_id for r in self.records.values() if r.idle(now_ms))[:limit])

    def document(self) -> dict[str, Any]:
        return {
            "next_number": self.next_number,
            "records": [
                [
                    r.txn_id, r.number, r.epoch, r.phase.value,
                    [list(p) for p in r.partitions], r.started_ms, r.timeout_ms,
                    r.init_index, r.last_commit, r.last_tag, r.used_ms, r.expiry_ms,
                ]
                for _, r in sorted(self.records.items())
            ],
        }  # fmt: skip

    @classmethod
    def from_document(cls, document: Any) -> Coordinator:
        coordinator = cls(next_number=int(document["next_number"]))
        for item in document["records"]:
            txn_id, number, epoch, phase, parts, *rest = item
            coordinator._put(TxnRecord(
                txn_id, number, epoch, Phase(phase), tuple((t, p) for t, p in parts), *rest
            ))  # fmt: skip
        return coordinator
