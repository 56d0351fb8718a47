"""Typed views of the API's JSON answers and the client's results.

Each `from_json` reads the fields the contract (docs/api.md) names and tolerates extra ones; the
whole answer stays available as `raw` for fields a newer broker adds.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from laminar.log.batch import StoredRecord, iter_records, split_batches
from laminar.log.errors import BatchFramingError
from laminar.queue.wire import decode_acquired

JSON = Mapping[str, Any]


def _strs(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list | tuple) else ()


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True, slots=True)
class AppendResult:
    """A committed append: the batch's first index, its record count, and whether the broker
    had already written it (an idempotent retry: then `base_index` is the original one)."""

    base_index: int
    count: int
    duplicate: bool = False

    @classmethod
    def from_json(cls, data: JSON) -> AppendResult:
        return cls(int(data["base_index"]), int(data["count"]), bool(data.get("duplicate", False)))


class ReadResult(NamedTuple):
    """Records read from one partition, in index order, and where to read next."""

    records: list[StoredRecord]
    next_index: int
    commit_index: int
    log_start: int


class RawRead(NamedTuple):
    """A binary read answer as it came: whole stored batches back to back (the first may start
    before the index asked for), and the broker's positions."""

    body: bytes
    next_index: int | None
    commit_index: int
    log_start: int


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a produced record was written."""

    partition: int
    index: int


@dataclass(frozen=True, slots=True)
class Member:
    id: str
    api_url: str
    state: str
    weight: int = 1
    draining: bool = False
    peer_addr: str | None = None

    @classmethod
    def from_json(cls, data: JSON) -> Member:
        return cls(
            id=str(data["id"]),
            api_url=str(data.get("api_url", "")),
            state=str(data.get("state", "alive")),
            weight=int(data.get("weight", 1)),
            draining=bool(data.get("draining", False)),
            peer_addr=_opt_str(data.get("peer_addr")),
        )


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    cluster_id: str
    node_id: str
    metadata_leader: str | None
    members: tuple[Member, ...]
    raw: JSON = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: JSON) -> ClusterInfo:
        return cls(
            cluster_id=str(data.get("cluster_id", "")),
            node_id=str(data.get("node_id", "")),
            metadata_leader=_opt_str(data.get("metadata_leader")),
            members=tuple(Member.from_json(m) for m in data.get("members", ())),
            raw=data,
        )

    def member(self, node_id: str) -> Member | None:
        return next((m for m in self.members if m.id == node_id), None)


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    partitions: int
    replication_factor: int
    config: Mapping[str, Any]

    @classmethod
    def from_json(cls, data: JSON) -> TopicInfo:
        return cls(
            name=str(data["name"]),
            partitions=int(data["partitions"]),
            replication_factor=int(data.get("replication_factor", 0)),
            config=dict(data.get("config") or {}),
        )


@dataclass(frozen=True, slots=True)
class PartitionState:
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
    #: the topic (`AsyncClient.partitions`; None in a topic's description)
    topic: str | None = None

    @classmethod
    def from_json(cls, data: JSON) -> PartitionState:
        term = data.get("term")
        return cls(
            topic=_opt_str(data.get("topic")),
            term=None if term is None else int(term),
            partition=int(data["partition"]),
            leader=_opt_str(data.get("leader")),
            leader_url=_opt_str(data.get("leader_url")),
            replicas=_strs(data.get("replicas")),
            learners=_strs(data.get("learners")),
            in_sync=_strs(data.get("in_sync")),
            log_start=int(data.get("log_start", 0)),
            commit_index=int(data.get("commit_index", -1)),
            log_end=int(data.get("log_end", 0)),
        )


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    partitions: int
    replication_factor: int
    config: Mapping[str, Any]
    partition_states: tuple[PartitionState, ...]
    raw: JSON = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: JSON) -> TopicDescription:
        return cls(
            name=str(data["name"]),
            partitions=int(data["partitions"]),
            replication_factor=int(data.get("replication_factor", 0)),
            config=dict(data.get("config") or {}),
            partition_states=tuple(
                PartitionState.from_json(p) for p in data.get("partition_states", ())
            ),
            raw=data,
        )

    def partition(self, partition: int) -> PartitionState | None:
        return next((p for p in self.partition_states if p.partition == partition), None)


@dataclass(frozen=True, slots=True)
class HostedPartition:
    topic: str
    partition: int
    role: str
    leader: str | None
    term: int
    voters: tuple[str, ...]
    learners: tuple[str, ...]
    in_sync: tuple[str, ...]
    log_start: int
    commit_index: int
    log_end: int
    bytes: int

    @classmethod
    def from_json(cls, data: JSON) -> HostedPartition:
        return cls(
            topic=str(data["topic"]),
            partition=int(data["partition"]),
            role=str(data.get("role", "")),
            leader=_opt_str(data.get("leader")),
            term=int(data.get("term", 0)),
            voters=_strs(data.get("voters")),
            learners=_strs(data.get("learners")),
            in_sync=_strs(data.get("in_sync")),
            log_start=int(data.get("log_start", 0)),
            commit_index=int(data.get("commit_index", -1)),
            log_end=int(data.get("log_end", 0)),
            bytes=int(data.get("bytes", 0)),
        )


@dataclass(frozen=True, slots=True)
class NodePartitions:
    node_id: str
    partitions: tuple[HostedPartition, ...]

    @classmethod
    def from_json(cls, data: JSON) -> NodePartitions:
        return cls(
            node_id=str(data.get("node_id", "")),
            partitions=tuple(HostedPartition.from_json(p) for p in data.get("partitions", ())),
        )


@dataclass(frozen=True, slots=True)
class NodeTls:
    """`GET /v1/nodes/{id}/tls`: what a broker's TLS has loaded (fingerprints are SHA-256 of
    the DER encoding, hex; without TLS, `enabled` is False and the rest empty)."""

    node_id: str
    enabled: bool
    fingerprint: str = ""
    not_after: str = ""
    trusted_cas: tuple[str, ...] = ()
    reloads: int = 0
    reload_error: str = ""

    @classmethod
    def from_json(cls, data: JSON) -> NodeTls:
        certificate = data.get("certificate") or {}
        return cls(
            node_id=str(data.get("node_id", "")),
            enabled=bool(data.get("enabled", False)),
            fingerprint=str(certificate.get("fingerprint", "")),
            not_after=str(certificate.get("not_after", "")),
            trusted_cas=tuple(str(f) for f in data.get("trusted_cas", ())),
            reloads=int(data.get("reloads", 0)),
            reload_error=str(data.get("reload_error", "")),
        )


@dataclass(frozen=True, slots=True)
class NodeAdminState:
    node: str
    draining: bool
    weight: int

    @classmethod
    def from_json(cls, data: JSON) -> NodeAdminState:
        return cls(
            node=str(data["node"]),
            draining=bool(data.get("draining", False)),
            weight=int(data.get("weight", 1)),
        )


# ---------------------------------------------------------------------------- shared queues


def _payload(value: Any, encoded: bool) -> bytes | None:
    """A key, value or header value of a JSON message: base64 when `encoded`, else UTF-8."""
    if value is None:
        return None
    if encoded:
        return base64.b64decode(str(value), validate=True)
    return str(value).encode()


def _ints(value: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in value) if isinstance(value, list | tuple) else ()


@dataclass(slots=True)
class QueueMessage:
    """A message acquired from a consumer group: held by the acquiring consumer until
    `lease_deadline_ms` (broker clock, ms since the epoch) unless renewed or settled.
    `deliveries` is 1 on the first delivery and grows by 1 on each redelivery. (Not frozen:
    consumers build thousands a second, and frozen construction costs twice as much.)"""

    index: int
    deliveries: int
    lease_deadline_ms: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    partition: int
    topic: str

    @classmethod
    def from_json(cls, data: JSON, *, topic: str, partition: int) -> QueueMessage:
        get = data.get
        if get("encoding") == "base64":
            key, value = _payload(get("key"), True), _payload(get("value"), True)
            found = get("headers") or {}
            pairs = tuple((str(k), _payload(v, True) or b"") for k, v in found.items())
        else:
            key, value = get("key"), get("value")
            key = None if key is None else str(key).encode()
            value = None if value is None else str(value).encode()
            found = get("headers")
            pairs = tuple((str(k), str(v).encode()) for k, v in found.items()) if found else ()
        return cls(
            int(data["index"]),
            int(get("deliveries", 1)),
            int(get("lease_deadline_ms", 0)),
            int(get("timestamp_ms", 0)),
            key,
            value,
            pairs,
            partition,
            topic,
        )

    def header(self, name: str) -> bytes | None:
        """The value of the first header called `name`, or None."""
        return next((v for k, v in self.headers if k == name), None)


@dataclass(frozen=True, slots=True)
class Acquired:
    """An acquire's answer: the consumer id holding the messages (the one sent, or the one the
    broker made up) and the messages, oldest first (possibly none)."""

    consumer: str
    messages: list[QueueMessage]

    @classmethod
    def from_json(
        cls, data: JSON, *, topic: str, partition: int, consumer: str | None = None
    ) -> Acquired:
        return cls(
            consumer=str(data.get("consumer") or consumer or ""),
            messages=[
                QueueMessage.from_json(m, topic=topic, partition=partition)
                for m in data.get("messages") or ()
            ],
        )

    @classmethod
    def from_binary(cls, body: bytes, *, topic: str, partition: int) -> Acquired:
        """Decode a binary answer (`application/vnd.laminar.acquired`, docs/formats.md §8):
        only the granted records of its batches become messages. Raises BatchError."""
        consumer, grants, batches = decode_acquired(body)
        wanted = {index: (deliveries, deadline) for index, deliveries, deadline in grants}
        messages: list[QueueMessage] = []
        for batch in split_batches(batches):
            for index, timestamp_ms, key, value, headers in iter_records(batch):
                grant = wanted.pop(index, None)
                if grant is not None:
                    messages.append(
                        QueueMessage(
                            index,
                            grant[0],
                            grant[1],
                            timestamp_ms,
                            key,
                            value,
                            headers,
                            partition,
                            topic,
                        )
                    )
        if wanted:
            raise BatchFramingError(f"{len(wanted)} granted messages are not in the answer")
        return cls(consumer, messages)


@dataclass(frozen=True, slots=True)
class Settled:
    """An accept/release/reject/renew answer. `done`: settled (or renewed) now, or a repeat of
    this consumer's own settlement; `refused`: nothing changed (not held by this consumer under
    a current lease). `lease_deadline_ms`: the new deadline (renew only)."""

    done: tuple[int, ...]
    refused: tuple[int, ...]
    lease_deadline_ms: int | None = None

    @classmethod
    def from_json(cls, data: JSON) -> Settled:
        deadline = data.get("lease_deadline_ms")
        return cls(
            done=_ints(data.get("done")),
            refused=_ints(data.get("refused")),
            lease_deadline_ms=None if deadline is None else int(deadline),
        )


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """A consumer group on one partition. `cursor`: the first index the group has not
    finished; `acquired`: held now; `pending`: not handed out yet or free again;
    `dead_letter_pending`: rejected, not yet in the dead-letter topic; `accepted` and
    `dead_lettered`: totals."""

    topic: str
    partition: int
    group: str
    cursor: int
    acquired: int
    pending: int
    dead_letter_pending: int
    accepted: int
    dead_lettered: int
    raw: JSON = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: JSON) -> GroupDescription:
        return cls(
            topic=str(data.get("topic", "")),
            partition=int(data.get("partition", 0)),
            group=str(data.get("group", "")),
            cursor=int(data.get("cursor", 0)),
            acquired=int(data.get("acquired", 0)),
            pending=int(data.get("pending", 0)),
            dead_letter_pending=int(data.get("dead_letter_pending", 0)),
            accepted=int(data.get("accepted", 0)),
            dead_lettered=int(data.get("dead_lettered", 0)),
            raw=data,
        )
