"""The client's results. The API's JSON bodies are the shared models of `laminar.models` (the
broker builds its answers with the same classes), re-exported here under the names the client
has always used; the rest are the client's own views, of what the JSON is not all of: a read's
raw batches, where a produced record went, and a queue message with its topic and partition
(which the binary acquire answer decodes to as well).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from laminar.log.batch import iter_records, split_batches
from laminar.log.errors import BatchFramingError
from laminar.models import (
    AcquiredMessage,
    AcquireResult,
    AppendResult,
    ClusterInfo,
    GroupDescription,
    HostedPartition,
    Member,
    NodeAdminState,
    NodePartitions,
    NodeTls,
    PartitionState,
    ReadResult,
    Settled,
    TopicDescription,
    TopicInfo,
)
from laminar.queue.wire import decode_acquired

JSON = Mapping[str, Any]

__all__ = [
    "JSON",
    "Acquired",
    "AppendResult",
    "ClusterInfo",
    "GroupDescription",
    "HostedPartition",
    "Member",
    "NodeAdminState",
    "NodePartitions",
    "NodeTls",
    "PartitionState",
    "QueueMessage",
    "RawRead",
    "ReadResult",
    "RecordMetadata",
    "Settled",
    "TopicDescription",
    "TopicInfo",
]


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


# ---------------------------------------------------------------------------- shared queues


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
        """A message of a JSON acquire answer (ModelError, a ValueError, if it is not one)."""
        return cls.from_wire(AcquiredMessage.from_json(data), topic=topic, partition=partition)

    @classmethod
    def from_wire(cls, m: AcquiredMessage, *, topic: str, partition: int) -> QueueMessage:
        """The message of partition `partition` of `topic` that `m` shows."""
        r = m.record
        return cls(
            r.index,
            m.deliveries,
            m.lease_deadline_ms,
            r.timestamp_ms,
            r.key,
            r.value,
            r.headers,
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
        """A JSON acquire answer (`AcquireResult`); `consumer`, the id sent, stands in for
        one the answer leaves out. ModelError (a ValueError) if it is not one."""
        if consumer is not None and not data.get("consumer"):
            data = {**data, "consumer": consumer}
        answer = AcquireResult.from_json(data)
        messages = [
            QueueMessage.from_wire(m, topic=topic, partition=partition) for m in answer.messages
        ]
        return cls(answer.consumer, messages)

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
