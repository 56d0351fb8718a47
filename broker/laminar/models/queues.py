"""Shared queues in JSON (docs/api.md, "Shared queues"): acquire, accept, release, reject and
renew, their answers, and a group's description.

The requests' `from_json` raise the broker's own messages (it answers them 400): a field left
out is None here, and the broker's default applies (`laminar.contract`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from ..contract import (
    CONSUMER_ID,
    MAX_ACQUIRE,
    MAX_ACQUIRE_BYTES,
    MAX_INDEX,
    MAX_LEASE_MS,
    MAX_REASON_CHARS,
    MAX_SETTLE_INDEXES,
    MAX_WAIT_MS,
)
from ..log.batch import StoredRecord
from .checks import (
    JsonObject,
    ModelError,
    boolean,
    integer,
    integers,
    is_int,
    json_object,
    objects,
    only_fields,
    optional_integer,
    string,
)
from .records import record_from_json, record_to_json

#: The dead-letter reason of a reject that gives none.
DEFAULT_REJECT_REASON = "rejected"
ACQUIRE_FIELDS = frozenset({"consumer", "max", "lease_ms", "wait_ms", "max_bytes"})
SETTLE_FIELDS = frozenset({"consumer", "indexes"})


def _body(value: Any, allowed: frozenset[str]) -> JsonObject:
    obj = json_object(value)
    only_fields(obj, allowed)
    return obj


def _consumer(value: object) -> str:
    if not isinstance(value, str) or not CONSUMER_ID.fullmatch(value):
        raise ModelError(f"consumer must match {CONSUMER_ID.pattern}")
    return value


def _bounded(obj: JsonObject, name: str, low: int, high: int) -> int | None:
    """The integer `name` in [low, high]; None when left out (null is refused)."""
    if name not in obj:
        return None
    value = obj[name]
    if not is_int(value) or not low <= value <= high:
        raise ModelError(f"{name} must be an integer in [{low}, {high}]")
    return int(value)


def _settled(obj: JsonObject) -> tuple[str, tuple[int, ...]]:
    """The consumer and indexes of an accept, release, reject or renew."""
    if "consumer" not in obj:
        raise ModelError("consumer is required (the id acquire returned)")
    consumer = _consumer(obj["consumer"])
    indexes = obj.get("indexes")
    if (
        not isinstance(indexes, list)
        or not indexes
        or len(indexes) > MAX_SETTLE_INDEXES
        or not all(is_int(i) and 0 <= i <= MAX_INDEX for i in indexes)
    ):
        raise ModelError(f"indexes must be a list of 1..{MAX_SETTLE_INDEXES} record indexes")
    return consumer, tuple(indexes)


# ---- acquire -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AcquireRequest:
    """Acquire up to `max_messages` (JSON: `max`) free messages, each held for `lease_ms`,
    at most `max_bytes` of records, long-polling up to `wait_ms` while none is free. Without
    a consumer id the broker makes one up."""

    SCHEMA: ClassVar[str] = "#/components/schemas/AcquireRequest"

    consumer: str | None = None
    max_messages: int | None = None
    lease_ms: int | None = None
    wait_ms: int | None = None
    max_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        wire = {
            "consumer": self.consumer,
            "max": self.max_messages,
            "lease_ms": self.lease_ms,
            "wait_ms": self.wait_ms,
            "max_bytes": self.max_bytes,
        }
        return {key: value for key, value in wire.items() if value is not None}

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = _body(obj, ACQUIRE_FIELDS)
        consumer = obj.get("consumer")
        return cls(
            consumer=None if consumer is None else _consumer(consumer),
            max_messages=_bounded(obj, "max", 1, MAX_ACQUIRE),
            lease_ms=_bounded(obj, "lease_ms", 1, MAX_LEASE_MS),
            wait_ms=_bounded(obj, "wait_ms", 0, MAX_WAIT_MS),
            max_bytes=_bounded(obj, "max_bytes", 1, MAX_ACQUIRE_BYTES),
        )


@dataclass(frozen=True, slots=True)
class AcquiredMessage:
    """A message an acquire handed out: its record, its delivery count (1 on the first) and
    the end of its lease (broker clock, ms since the epoch). The JSON is the record's, as a
    read shows it, with `deliveries` and `lease_deadline_ms`."""

    SCHEMA: ClassVar[str] = "#/components/schemas/QueueMessage"

    record: StoredRecord
    deliveries: int
    lease_deadline_ms: int

    def to_json(self) -> dict[str, Any]:
        out = record_to_json(self.record)
        out["deliveries"] = self.deliveries
        out["lease_deadline_ms"] = self.lease_deadline_ms
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        record = record_from_json(obj)
        return cls(record, integer(obj, "deliveries"), integer(obj, "lease_deadline_ms"))


@dataclass(frozen=True, slots=True)
class AcquireResult:
    """An acquire's JSON answer: the consumer id holding the messages (the one sent, or the
    one the broker made up) and the messages, oldest first (possibly none)."""

    SCHEMA: ClassVar[str] = "#/components/schemas/AcquireResult"

    consumer: str
    messages: tuple[AcquiredMessage, ...]

    def to_json(self) -> dict[str, Any]:
        return {"consumer": self.consumer, "messages": [m.to_json() for m in self.messages]}

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        messages = objects(obj, "messages")
        return cls(string(obj, "consumer"), tuple(AcquiredMessage.from_json(m) for m in messages))


# ---- settling ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SettleRequest:
    """Accept or release held messages (`indexes`) of `consumer`; an accept may be part of
    the transaction of `txn_producer_id` (docs/transactions.md)."""

    SCHEMA: ClassVar[str] = "#/components/schemas/SettleRequest"

    consumer: str
    indexes: tuple[int, ...]
    txn_producer_id: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"consumer": self.consumer, "indexes": list(self.indexes)}
        if self.txn_producer_id is not None:
            out["txn_producer_id"] = self.txn_producer_id
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        body = _body(obj, SETTLE_FIELDS | {"txn_producer_id"})
        txn = _bounded(body, "txn_producer_id", 1, 2**64 - 1)
        return cls(*_settled(body), txn)


@dataclass(frozen=True, slots=True)
class RejectRequest:
    """Dead-letter held messages, with `reason` (None: DEFAULT_REJECT_REASON)."""

    SCHEMA: ClassVar[str] = "#/components/schemas/RejectRequest"

    consumer: str
    indexes: tuple[int, ...]
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"consumer": self.consumer, "indexes": list(self.indexes)}
        if self.reason is not None:
            out["reason"] = self.reason
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = _body(obj, SETTLE_FIELDS | {"reason"})
        consumer, indexes = _settled(obj)
        reason = obj.get("reason", DEFAULT_REJECT_REASON)
        if not isinstance(reason, str) or not 1 <= len(reason) <= MAX_REASON_CHARS:
            raise ModelError(f"reason must be a string of 1..{MAX_REASON_CHARS} characters")
        return cls(consumer, indexes, obj.get("reason"))


@dataclass(frozen=True, slots=True)
class RenewRequest:
    """Extend the leases of held messages to `lease_ms` from now."""

    SCHEMA: ClassVar[str] = "#/components/schemas/RenewRequest"

    consumer: str
    indexes: tuple[int, ...]
    lease_ms: int

    def to_json(self) -> dict[str, Any]:
        return {"consumer": self.consumer, "indexes": list(self.indexes), "lease_ms": self.lease_ms}

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = _body(obj, SETTLE_FIELDS | {"lease_ms"})
        consumer, indexes = _settled(obj)
        lease_ms = _bounded(obj, "lease_ms", 1, MAX_LEASE_MS)
        if lease_ms is None:  # (the spec requires it: no default lease on a renew)
            raise ModelError("lease_ms is required (the new lease)")
        return cls(consumer, indexes, lease_ms)


@dataclass(frozen=True, slots=True)
class Settled:
    """An accept/release/reject/renew answer. `done`: settled (or renewed) now, or a repeat of
    this consumer's own settlement; `refused`: nothing changed (not held by this consumer under
    a current lease). `lease_deadline_ms`: the new deadline (renew only)."""

    SCHEMA: ClassVar[str] = "#/components/schemas/SettleResult"

    done: tuple[int, ...]
    refused: tuple[int, ...]
    lease_deadline_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"done": list(self.done), "refused": list(self.refused)}
        if self.lease_deadline_ms is not None:
            out["lease_deadline_ms"] = self.lease_deadline_ms
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        return cls(
            integers(obj, "done"),
            integers(obj, "refused"),
            optional_integer(obj, "lease_deadline_ms"),
        )


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """A consumer group on one partition. `cursor`: the first index the group has not
    finished; `acquired`: held now; `pending`: not handed out yet or free again;
    `dead_letter_pending`: rejected, not yet in the dead-letter topic; `accepted` and
    `dead_lettered`: totals; `end_index`: one past the last log index the leader's group state
    has applied (the counts are of the messages below it); `lag`: the messages at or above
    the cursor the group has not finished (pending + acquired + dead_letter_pending, Kafka's
    consumer lag in records); `exists`: whether the group is there at all (a group nobody
    used on this partition is described as it would start). `lag` and `exists` are None from
    brokers older than them."""

    SCHEMA: ClassVar[str] = "#/components/schemas/GroupDescription"

    topic: str
    partition: int
    group: str
    cursor: int
    acquired: int
    pending: int
    dead_letter_pending: int
    accepted: int
    dead_lettered: int
    end_index: int
    lag: int | None = None
    exists: bool | None = None
    #: the JSON object this was read from (empty when made here): fields a newer broker adds
    raw: JsonObject = field(default_factory=dict, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "topic": self.topic,
            "partition": self.partition,
            "group": self.group,
            "cursor": self.cursor,
            "acquired": self.acquired,
            "pending": self.pending,
            "dead_letter_pending": self.dead_letter_pending,
            "accepted": self.accepted,
            "dead_lettered": self.dead_lettered,
            "end_index": self.end_index,
        }
        if self.lag is not None:
            out["lag"] = self.lag
        if self.exists is not None:
            out["exists"] = self.exists
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        return cls(
            topic=string(obj, "topic"),
            partition=integer(obj, "partition"),
            group=string(obj, "group"),
            cursor=integer(obj, "cursor"),
            acquired=integer(obj, "acquired"),
            pending=integer(obj, "pending"),
            dead_letter_pending=integer(obj, "dead_letter_pending"),
            accepted=integer(obj, "accepted"),
            dead_lettered=integer(obj, "dead_lettered"),
            end_index=integer(obj, "end_index"),
            lag=optional_integer(obj, "lag"),
            exists=None if obj.get("exists") is None else boolean(obj, "exists"),
            raw=obj,
        )
