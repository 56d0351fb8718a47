"""Transactions in JSON (docs/transactions.md, docs/api.md "Transactions"): starting a
transactional producer, adding partitions to its transaction, ending it, a transactional
id's state, and the markers brokers write."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Self

from ..contract import MAX_PARTITIONS, MAX_TXN_TIMEOUT_MS, TOPIC_NAME
from ..txn.coordinator import (
    MAX_ENDED_TOGETHER,
    MAX_EXPIRY_MS,
    MAX_TAG_CHARS,
    MIN_EXPIRY_MS,
    TRANSACTIONAL_ID,
)
from .checks import (
    JsonObject,
    ModelError,
    boolean,
    integer,
    json_object,
    objects,
    only_fields,
    optional_string,
    string,
)

TxnPartition = tuple[str, int]
MAX_PRODUCER_ID = 2**64 - 1


def _producer_id(obj: JsonObject) -> int:
    value = integer(obj, "producer_id")
    if not 1 <= value <= MAX_PRODUCER_ID:
        raise ModelError(f"producer_id must be in [1, {MAX_PRODUCER_ID}]")
    return value


def _partitions_to_json(partitions: tuple[TxnPartition, ...]) -> list[dict[str, Any]]:
    return [{"topic": topic, "partition": partition} for topic, partition in partitions]


def _partitions(obj: JsonObject) -> tuple[TxnPartition, ...]:
    out = []
    for item in objects(obj, "partitions"):
        only_fields(item, frozenset({"topic", "partition"}))
        topic, partition = string(item, "topic"), integer(item, "partition")
        if not TOPIC_NAME.fullmatch(topic) or not 0 <= partition < MAX_PARTITIONS:
            raise ModelError(f"{topic[:50]!r}/{partition} is not a topic partition")
        out.append((topic, partition))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class TxnInitRequest:
    """Start a transactional producer: how long its transactions may stay open, and how long
    the id is kept once unused (None: the broker's defaults)."""

    SCHEMA: ClassVar[str] = "#/components/schemas/TxnInitRequest"

    timeout_ms: int | None = None
    expiry_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        out = {} if self.timeout_ms is None else {"timeout_ms": self.timeout_ms}
        if self.expiry_ms is not None:
            out["expiry_ms"] = self.expiry_ms
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        only_fields(obj, frozenset({"timeout_ms", "expiry_ms"}))
        # (present, a field must be an integer: null is refused, as the spec says)
        timeout_ms = integer(obj, "timeout_ms") if "timeout_ms" in obj else None
        if timeout_ms is not None and not 1 <= timeout_ms <= MAX_TXN_TIMEOUT_MS:
            raise ModelError(f"timeout_ms must be in [1, {MAX_TXN_TIMEOUT_MS}]")
        expiry_ms = integer(obj, "expiry_ms") if "expiry_ms" in obj else None
        if expiry_ms is not None and not MIN_EXPIRY_MS <= expiry_ms <= MAX_EXPIRY_MS:
            raise ModelError(f"expiry_ms must be in [{MIN_EXPIRY_MS}, {MAX_EXPIRY_MS}]")
        return cls(timeout_ms, expiry_ms)


@dataclass(frozen=True, slots=True)
class TxnProducerInfo:
    """A transactional producer's identity: the `producer_id` its batches carry (producer
    number and epoch, laminar.txn.producer)."""

    SCHEMA: ClassVar[str] = "#/components/schemas/TxnProducerInfo"

    transactional_id: str
    producer_id: int
    timeout_ms: int

    def to_json(self) -> dict[str, Any]:
        return {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "timeout_ms": self.timeout_ms,
        }

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        return cls(string(obj, "transactional_id"), _producer_id(obj), integer(obj, "timeout_ms"))


@dataclass(frozen=True, slots=True)
class TxnPartitionsRequest:
    """The producer's transaction writes to these partitions."""

    SCHEMA: ClassVar[str] = "#/components/schemas/TxnPartitionsRequest"

    producer_id: int
    partitions: tuple[TxnPartition, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "producer_id": self.producer_id,
            "partitions": _partitions_to_json(self.partitions),
        }

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        only_fields(obj, frozenset({"producer_id", "partitions"}))
        partitions = _partitions(obj)
        if not partitions:
            raise ModelError("partitions must not be empty")
        return cls(_producer_id(obj), partitions)


@dataclass(frozen=True, slots=True)
class TxnEndRequest:
    """End the producer's transaction: commit it, or abort it; and with it, all or none, the
    transactions of `also`'s (transactional id, producer id). `tag` is kept with how they
    ended (`TxnDescription.last_tag`)."""

    SCHEMA: ClassVar[str] = "#/components/schemas/TxnEndRequest"

    producer_id: int
    commit: bool
    also: tuple[tuple[str, int], ...] = ()
    tag: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"producer_id": self.producer_id, "commit": self.commit}
        if self.also:
            out["also"] = [
                {"transactional_id": txn_id, "producer_id": producer_id}
                for txn_id, producer_id in self.also
            ]
        if self.tag is not None:
            out["tag"] = self.tag
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        only_fields(obj, frozenset({"producer_id", "commit", "also", "tag"}))
        also = []
        for item in objects(obj, "also") if "also" in obj else ():
            only_fields(item, frozenset({"transactional_id", "producer_id"}))
            txn_id = string(item, "transactional_id")
            if not TRANSACTIONAL_ID.fullmatch(txn_id):
                raise ModelError(
                    f"transactional id {txn_id[:50]!r} must match {TRANSACTIONAL_ID.pattern}"
                )
            also.append((txn_id, _producer_id(item)))
        if len(also) > MAX_ENDED_TOGETHER:
            raise ModelError(f"also: at most {MAX_ENDED_TOGETHER} other transactions")
        tag = string(obj, "tag") if "tag" in obj else None
        if tag is not None and not (1 <= len(tag) <= MAX_TAG_CHARS and tag.isprintable()):
            raise ModelError(f"tag: 1 to {MAX_TAG_CHARS} printable characters")
        return cls(_producer_id(obj), boolean(obj, "commit"), tuple(also), tag)


@dataclass(frozen=True, slots=True)
class TxnDescription:
    """A transactional id's state: its producer (the epoch writes carry, or, while it ends,
    the ending transaction's), phase, the partitions of its transaction, and how the last
    transaction ended (once decided: `last_committed`, None before any, and its end's
    `last_tag`)."""

    SCHEMA: ClassVar[str] = "#/components/schemas/TxnDescription"

    transactional_id: str
    producer_id: int
    phase: str
    partitions: tuple[TxnPartition, ...]
    timeout_ms: int
    expiry_ms: int
    last_committed: bool | None = None
    last_tag: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "phase": self.phase,
            "partitions": _partitions_to_json(self.partitions),
            "timeout_ms": self.timeout_ms,
            "expiry_ms": self.expiry_ms,
            "last_committed": self.last_committed,
            "last_tag": self.last_tag,
        }

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        last = obj.get("last_committed")
        if last is not None and not isinstance(last, bool):
            raise ModelError("last_committed must be true, false or null")
        return cls(
            string(obj, "transactional_id"),
            _producer_id(obj),
            string(obj, "phase"),
            _partitions(obj),
            integer(obj, "timeout_ms"),
            integer(obj, "expiry_ms"),
            last,
            optional_string(obj, "last_tag"),
        )


@dataclass(frozen=True, slots=True)
class TxnEnded:
    """How a transaction ended (`committed`), whether every partition has its marker yet
    (`complete`: its records are then readable everywhere), and the producer id of the
    producer's next transaction."""

    SCHEMA: ClassVar[str] = "#/components/schemas/TxnEnded"

    transactional_id: str
    committed: bool
    complete: bool
    producer_id: int

    def to_json(self) -> dict[str, Any]:
        return {
            "transactional_id": self.transactional_id,
            "committed": self.committed,
            "complete": self.complete,
            "producer_id": self.producer_id,
        }

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        return cls(
            string(obj, "transactional_id"),
            boolean(obj, "committed"),
            boolean(obj, "complete"),
            _producer_id(obj),
        )


@dataclass(frozen=True, slots=True)
class TxnMarkerRequest:
    """(Brokers only) write a COMMIT or ABORT marker carrying `producer_id` into a
    partition."""

    SCHEMA: ClassVar[str] = "#/components/schemas/TxnMarkerRequest"

    producer_id: int
    commit: bool

    def to_json(self) -> dict[str, Any]:
        return {"producer_id": self.producer_id, "commit": self.commit}

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        only_fields(obj, frozenset({"producer_id", "commit"}))
        return cls(_producer_id(obj), boolean(obj, "commit"))
