"""Consumer group admin and offsets for times in JSON (docs/api.md, "Consumer group admin" and
"Offsets for times"): list the groups of a topic, describe one across its partitions, reset
its cursor, and the index of the first record at or after a time.

The requests' `from_json` raise the broker's own messages (it answers them 400)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Self

from ..contract import MAX_INDEX, MAX_PARTITIONS
from ..log.records import MAX_TIMESTAMP_MS, MIN_TIMESTAMP_MS
from .checks import (
    ModelError,
    integer,
    integers,
    is_int,
    json_object,
    objects,
    only_fields,
    optional_integer,
    string,
)
from .queues import GroupDescription

#: Where a reset's `to` may move a cursor: the log start, or the end of the log.
RESET_POSITIONS = ("earliest", "latest")
RESET_FIELDS = frozenset({"to", "index", "timestamp_ms", "force", "partitions"})


def _timestamp(value: object, name: str) -> int:
    if not is_int(value) or not MIN_TIMESTAMP_MS <= value <= MAX_TIMESTAMP_MS:
        raise ModelError(f"{name} must be an integer in [{MIN_TIMESTAMP_MS}, {MAX_TIMESTAMP_MS}]")
    return int(value)


# ---- reset ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResetGroupRequest:
    """Where to move a group's cursor: exactly one of `to` ("earliest": the log start;
    "latest": the end of the log, only messages appended from now on), `index` (moved to the
    log start if below it, to the end if past it, as Kafka's tools do) and `timestamp_ms`
    (the first record at or after that time, else the end: Kafka's `--to-datetime`).
    `force`: also while messages are held or dead letters are moving (they are dropped).
    `partitions`: which partitions (a topic-wide reset only; None: every one)."""

    SCHEMA: ClassVar[str] = "#/components/schemas/ResetGroupRequest"

    to: str | None = None
    index: int | None = None
    timestamp_ms: int | None = None
    force: bool = False
    partitions: tuple[int, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "to": self.to,
            "index": self.index,
            "timestamp_ms": self.timestamp_ms,
            "partitions": None if self.partitions is None else list(self.partitions),
        }
        out = {key: value for key, value in wire.items() if value is not None}
        if self.force:
            out["force"] = True
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        only_fields(obj, RESET_FIELDS)
        given = [name for name in ("to", "index", "timestamp_ms") if name in obj]
        if len(given) != 1:
            raise ModelError(
                'give exactly one of "to" (earliest or latest), "index" and "timestamp_ms"'
            )
        to = obj.get("to")
        if "to" in obj and to not in RESET_POSITIONS:
            raise ModelError(f"to must be one of {list(RESET_POSITIONS)}")
        index = obj.get("index")
        if "index" in obj and (not is_int(index) or not 0 <= index <= MAX_INDEX):
            raise ModelError(f"index must be an integer in [0, {MAX_INDEX}]")
        timestamp = obj.get("timestamp_ms")
        if "timestamp_ms" in obj:
            timestamp = _timestamp(timestamp, "timestamp_ms")
        force = obj.get("force", False)
        if not isinstance(force, bool):
            raise ModelError("force must be true or false")
        partitions = None
        if "partitions" in obj:
            items = obj["partitions"]
            if (
                not isinstance(items, list)
                or not items
                or not all(is_int(p) and 0 <= p < MAX_PARTITIONS for p in items)
                or len(set(items)) != len(items)
            ):
                raise ModelError(
                    f"partitions must be a non-empty list of distinct partitions in "
                    f"[0, {MAX_PARTITIONS - 1}]"
                )
            partitions = tuple(items)
        return cls(to, index, timestamp, force, partitions)


@dataclass(frozen=True, slots=True)
class GroupReset:
    """A reset of a group on one partition: its cursor before (None: there was no group; the
    reset made it) and now, and the partition's end as the leader applied it."""

    SCHEMA: ClassVar[str] = "#/components/schemas/GroupReset"

    topic: str
    partition: int
    group: str
    previous_cursor: int | None
    cursor: int
    end_index: int

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "group": self.group,
            "previous_cursor": self.previous_cursor,
            "cursor": self.cursor,
            "end_index": self.end_index,
        }

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        return cls(
            string(obj, "topic"),
            integer(obj, "partition"),
            string(obj, "group"),
            optional_integer(obj, "previous_cursor"),
            integer(obj, "cursor"),
            integer(obj, "end_index"),
        )


@dataclass(frozen=True, slots=True)
class TopicGroupReset:
    """A reset of a group on the partitions of a topic it asked for, each one's outcome."""

    SCHEMA: ClassVar[str] = "#/components/schemas/TopicGroupReset"

    topic: str
    group: str
    partitions: tuple[GroupReset, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "group": self.group,
            "partitions": [p.to_json() for p in self.partitions],
        }

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        parts = tuple(GroupReset.from_json(p) for p in objects(obj, "partitions"))
        return cls(string(obj, "topic"), string(obj, "group"), parts)


# ---- list and describe ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionGroups:
    """The consumer groups on one partition, each described, by name."""

    SCHEMA: ClassVar[str] = "#/components/schemas/PartitionGroups"

    topic: str
    partition: int
    groups: tuple[GroupDescription, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "groups": [g.to_json() for g in self.groups],
        }

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        groups = tuple(GroupDescription.from_json(g) for g in objects(obj, "groups"))
        return cls(string(obj, "topic"), integer(obj, "partition"), groups)


@dataclass(frozen=True, slots=True)
class GroupSummary:
    """A consumer group of a topic: the partitions it is on and its lag over them all."""

    SCHEMA: ClassVar[str] = "#/components/schemas/TopicGroups/properties/groups/items"

    group: str
    partitions: tuple[int, ...]
    lag: int

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "partitions": list(self.partitions), "lag": self.lag}

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        return cls(string(obj, "group"), integers(obj, "partitions"), integer(obj, "lag"))


@dataclass(frozen=True, slots=True)
class TopicGroups:
    """The consumer groups of a topic (Kafka's list groups), by name."""

    SCHEMA: ClassVar[str] = "#/components/schemas/TopicGroups"

    topic: str
    groups: tuple[GroupSummary, ...]

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "groups": [g.to_json() for g in self.groups]}

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        groups = tuple(GroupSummary.from_json(g) for g in objects(obj, "groups"))
        return cls(string(obj, "topic"), groups)


@dataclass(frozen=True, slots=True)
class TopicGroupDescription:
    """A consumer group on every partition of a topic it is on: each partition's description
    (`GroupDescription`) and the lag over them all."""

    SCHEMA: ClassVar[str] = "#/components/schemas/TopicGroupDescription"

    topic: str
    group: str
    lag: int
    partitions: tuple[GroupDescription, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "group": self.group,
            "lag": self.lag,
            "partitions": [p.to_json() for p in self.partitions],
        }

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        parts = tuple(GroupDescription.from_json(p) for p in objects(obj, "partitions"))
        return cls(string(obj, "topic"), string(obj, "group"), integer(obj, "lag"), parts)


# ---- offsets for times ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """A partition's offsets: its log start and end (what a read may ask for), and, when a
    time was asked for (`timestamp_ms`), the index of the first record whose timestamp is at
    or after it with that record's timestamp (Kafka's offsetsForTimes), both None when no
    record below the end is that late."""

    SCHEMA: ClassVar[str] = "#/components/schemas/PartitionOffsets"

    topic: str
    partition: int
    log_start: int
    end_index: int
    timestamp_ms: int | None = None
    index: int | None = None
    record_timestamp_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "topic": self.topic,
            "partition": self.partition,
            "log_start": self.log_start,
            "end_index": self.end_index,
        }
        if self.timestamp_ms is not None:
            out["timestamp_ms"] = self.timestamp_ms
            out["index"] = self.index
            out["record_timestamp_ms"] = self.record_timestamp_ms
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        return cls(
            string(obj, "topic"),
            integer(obj, "partition"),
            integer(obj, "log_start"),
            integer(obj, "end_index"),
            optional_integer(obj, "timestamp_ms"),
            optional_integer(obj, "index"),
            optional_integer(obj, "record_timestamp_ms"),
        )


@dataclass(frozen=True, slots=True)
class TopicOffsets:
    """Every partition's offsets (`PartitionOffsets`), for one time or none."""

    SCHEMA: ClassVar[str] = "#/components/schemas/TopicOffsets"

    topic: str
    partitions: tuple[PartitionOffsets, ...]

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "partitions": [p.to_json() for p in self.partitions]}

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        parts = tuple(PartitionOffsets.from_json(p) for p in objects(obj, "partitions"))
        return cls(string(obj, "topic"), parts)


def query_timestamp(text: str) -> int:
    """A `timestamp_ms` query parameter (ModelError: the broker's 400 message)."""
    if not text.isascii() or not text.isdigit() or len(text) > 15:
        raise ModelError(
            f"timestamp_ms must be an integer in [{MIN_TIMESTAMP_MS}, {MAX_TIMESTAMP_MS}]"
        )
    return _timestamp(int(text), "timestamp_ms")
