"""Topics and partitions in JSON (docs/api.md, "Topics"): listings, descriptions, the status
table's rows, and the requests that create and alter a topic."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from .checks import (
    JsonObject,
    ModelError,
    integer,
    json_object,
    objects,
    only_fields,
    optional_integer,
    optional_string,
    string,
    strings,
)


def is_under_replicated(in_sync: Sequence[str], replication_factor: int) -> bool:
    """Is a partition under-replicated: fewer of its replicas in sync than its topic's
    replication factor? Counted against the replication factor, not against the replica set
    the partition has now, so that a partition whose replica set shrank (a broker away, not
    yet replaced) counts too, and so does one without a leader (nothing known in sync).
    `laminar cluster status`, the `laminar_partition_under_replicated` metric, the console
    and the Kubernetes status all count with this."""
    return len(in_sync) < replication_factor


def _config(obj: JsonObject) -> dict[str, Any]:
    return dict(json_object(obj.get("config") or {}, "config must be an object"))


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic: its partition count, replication factor and config."""

    SCHEMA: ClassVar[str] = "#/components/schemas/TopicSummary"

    name: str
    partitions: int
    replication_factor: int
    config: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "partitions": self.partitions,
            "replication_factor": self.replication_factor,
            "config": dict(self.config),
        }

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj, "a topic must be an object")
        return cls(
            string(obj, "name"),
            integer(obj, "partitions"),
            integer(obj, "replication_factor"),
            _config(obj),
        )


@dataclass(frozen=True, slots=True)
class TopicList:
    """`GET /v1/topics`: the topics (those in the caller's scope), by name."""

    SCHEMA: ClassVar[str] = "#/components/schemas/TopicList"

    topics: tuple[TopicInfo, ...]

    def to_json(self) -> dict[str, Any]:
        return {"topics": [topic.to_json() for topic in self.topics]}

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        return cls(tuple(TopicInfo.from_json(t) for t in objects(json_object(obj), "topics")))


@dataclass(frozen=True, slots=True)
class PartitionState:
    """A partition as the status table has it: its leader (None: none known), replicas,
    in-sync set and indexes; `topic` in `GET /v1/partitions` rows only."""

    SCHEMA: ClassVar[str] = "#/components/schemas/PartitionState"

    partition: int
    leader: str | None
    leader_url: str | None
    replicas: tuple[str, ...]
    learners: tuple[str, ...]
    in_sync: tuple[str, ...]
    log_start: int
    commit_index: int
    log_end: int
    #: the leader's term (None: no leader known)
    term: int | None = None
    #: the topic (`GET /v1/partitions`; None, and not in the JSON, in a topic's description)
    topic: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.topic is None else {"topic": self.topic}
        out.update(
            partition=self.partition,
            leader=self.leader,
            term=self.term,
            leader_url=self.leader_url,
            replicas=list(self.replicas),
            learners=list(self.learners),
            in_sync=list(self.in_sync),
            log_start=self.log_start,
            commit_index=self.commit_index,
            log_end=self.log_end,
        )
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj, "a partition state must be an object")
        return cls(
            partition=integer(obj, "partition"),
            leader=optional_string(obj, "leader"),
            leader_url=optional_string(obj, "leader_url"),
            replicas=strings(obj, "replicas"),
            learners=strings(obj, "learners"),
            in_sync=strings(obj, "in_sync"),
            log_start=integer(obj, "log_start"),
            commit_index=integer(obj, "commit_index"),
            log_end=integer(obj, "log_end"),
            term=optional_integer(obj, "term"),
            topic=optional_string(obj, "topic"),
        )


@dataclass(frozen=True, slots=True)
class PartitionList:
    """`GET /v1/partitions`: the status table's rows, each with its `topic`."""

    SCHEMA: ClassVar[str] = "#/components/schemas/PartitionList"

    partitions: tuple[PartitionState, ...]

    def to_json(self) -> dict[str, Any]:
        return {"partitions": [state.to_json() for state in self.partitions]}

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        rows = objects(json_object(obj), "partitions")
        return cls(tuple(PartitionState.from_json(row) for row in rows))


@dataclass(frozen=True, slots=True)
class TopicDescription:
    """`GET /v1/topics/{topic}` (and the answer to creating or altering one): the topic and
    the state of each of its partitions."""

    SCHEMA: ClassVar[str] = "#/components/schemas/TopicDescription"

    name: str
    partitions: int
    replication_factor: int
    config: Mapping[str, Any]
    partition_states: tuple[PartitionState, ...]
    #: the JSON object this was read from (empty when made here): fields a newer broker adds
    raw: JsonObject = field(default_factory=dict, repr=False, compare=False)

    def partition(self, partition: int) -> PartitionState | None:
        return next((p for p in self.partition_states if p.partition == partition), None)

    def under_replicated(self) -> list[PartitionState]:
        """The partitions with fewer replicas in sync than the topic's replication factor
        (`is_under_replicated`)."""
        rf = self.replication_factor
        return [p for p in self.partition_states if is_under_replicated(p.in_sync, rf)]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "partitions": self.partitions,
            "replication_factor": self.replication_factor,
            "config": dict(self.config),
            "partition_states": [state.to_json() for state in self.partition_states],
        }

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        states = objects(obj, "partition_states")
        return cls(
            name=string(obj, "name"),
            partitions=integer(obj, "partitions"),
            replication_factor=integer(obj, "replication_factor"),
            config=_config(obj),
            partition_states=tuple(PartitionState.from_json(s) for s in states),
            raw=obj,
        )


# ---- requests ------------------------------------------------------------------------------
#
# Their values are judged by the metadata command they become (laminar.metadata.validate, whose
# messages are the API's), and only by the metadata leader: any other broker redirects such a
# request to it. So `from_json` checks the body's shape alone, and the fields hold the JSON
# values as they came.


class Absent(enum.Enum):
    """A field the JSON leaves out (where that differs from null, which the broker refuses)."""

    ABSENT = "absent"


ABSENT = Absent.ABSENT
CREATE_FIELDS = frozenset({"name", "partitions", "replication_factor", "config"})
ALTER_FIELDS = frozenset({"partitions", "config"})


@dataclass(frozen=True, slots=True)
class CreateTopicRequest:
    """`POST /v1/topics`. Left out (ABSENT): 1 partition, no config, and the broker's default
    replication factor (min(3, brokers that may host replicas))."""

    SCHEMA: ClassVar[str] = "#/components/schemas/CreateTopicRequest"

    name: Any
    partitions: Any = ABSENT
    replication_factor: Any = ABSENT
    config: Any = ABSENT

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        for key in ("partitions", "replication_factor", "config"):
            value = getattr(self, key)
            if value is not ABSENT:
                out[key] = dict(value) if isinstance(value, Mapping) else value
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        only_fields(obj, CREATE_FIELDS)
        return cls(
            obj.get("name"),
            obj.get("partitions", ABSENT),
            obj.get("replication_factor", ABSENT),
            obj.get("config", ABSENT),
        )


@dataclass(frozen=True, slots=True)
class AlterTopicRequest:
    """`PATCH /v1/topics/{topic}`: a new (greater) partition count and/or the config keys to
    change; None (or left out): unchanged."""

    SCHEMA: ClassVar[str] = "#/components/schemas/AlterTopicRequest"

    partitions: Any = None
    config: Any = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.partitions is not None:
            out["partitions"] = self.partitions
        if self.config is not None:
            out["config"] = dict(self.config) if isinstance(self.config, Mapping) else self.config
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        if not isinstance(obj, dict) or not obj or set(obj) - ALTER_FIELDS:
            raise ModelError('send an object with "partitions" and/or "config"')
        return cls(obj.get("partitions"), obj.get("config"))
