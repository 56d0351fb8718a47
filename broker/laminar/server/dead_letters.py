"""Moving dead letters of a partition's consumer groups to `<topic>.dlq`, exactly once.

The partition leader runs one `DeadLetterMover` task while its groups have dead letters
pending. Each goes to the same partition number of `<topic>.dlq` (created on demand with the
topic's partition count and replication factor) as one record appended by an idempotent
producer: the producer id is derived from (topic, partition, group, the group's incarnation:
a group deleted and made again starts its sequences again, as a producer of its own), the
sequence is the dead letter's own (assigned by the group's state machine, in order). Only
after the append is committed does the leader propose `DeadLettered` (naming the sequences
and the incarnation), which makes the group forget the message.
A new leader (or a retry) appends the same sequence again and is answered as a duplicate; a
`Conflict` means the sequence fell out of the producer window, i.e. it was appended before.

A dead letter whose record is malformed (a valid checksum, broken framing: stored before
appends checked records) is moved without it, as one whose record retention removed: the
dead-letter headers alone, plus `laminar.dlq.malformed` saying why, reported once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import xxhash

from ..client import AsyncClient, Conflict, LaminarError, NotFound, Record
from ..client.errors import BadRequest
from ..log.errors import MalformedRecordsError
from ..metadata.state import Topic
from ..partition.errors import CommitLost, CommitUnknown, NotLeader, Overloaded, ReplicaClosed
from ..partition.replica import Replica
from ..queue import DeadLettered
from ..queue.state import DeadLetter

log = logging.getLogger(__name__)

#: Dead letters confirmed by one DeadLettered command (within the producer window of 5).
CONFIRM_BATCH = 4
RETRY_DELAY_S = 1.0
DLQ_SUFFIX = ".dlq"


def dead_letter_topic(topic: str) -> str:
    return topic + DLQ_SUFFIX


def producer_id(topic: str, partition: int, group: str, incarnation: int = 0) -> int:
    """The dead-letter producer id of one incarnation of a group on one partition (63-bit,
    never 0; incarnation 0, groups made before they had one, as it always was)."""
    name = f"{topic}/{partition}/{group}" + (f"@{incarnation}" if incarnation else "")
    digest = xxhash.xxh3_64_intdigest(name.encode())
    return (digest & (2**63 - 1)) | 1


@dataclass(frozen=True, slots=True)
class Pending:
    group: str
    index: int
    letter: DeadLetter
    incarnation: int


class DeadLetterMover:
    def __init__(self, client: AsyncClient, replica: Replica, topic: Topic) -> None:
        assert replica.groups is not None
        self.client = client
        self.replica = replica
        self.groups = replica.groups
        self.topic = topic
        self.dlq = dead_letter_topic(replica.topic)

    async def run(self, topics: Callable[[], Mapping[str, Topic]]) -> None:
        """Until nothing is pending or this replica stops leading (`topics`: the cluster's
        topics as of now)."""
        while self.replica.is_leader and not self.replica.closed:
            pending = [Pending(*item) for item in self.groups.dead_letters()]
            if not pending:
                return
            try:
                await self._ensure_topic(topics())
                await self._move(pending)
            except (LaminarError, CommitLost, CommitUnknown, OSError, TimeoutError) as e:
                log.warning("%s: dead letters wait: %s", self.replica.group, e)
                await asyncio.sleep(RETRY_DELAY_S)
            except (NotLeader, Overloaded, ReplicaClosed):
                return

    async def _ensure_topic(self, topics: Mapping[str, Topic]) -> None:
        existing = topics.get(self.dlq)
        if existing is None:
            try:
                await self.client.create_topic(
                    self.dlq,
                    partitions=self.topic.partitions,
                    replication_factor=self.topic.replication_factor,
                )
                log.info("%s: created the dead-letter topic %s", self.replica.group, self.dlq)
            except Conflict:
                pass
            except BadRequest as e:
                raise LaminarError(400, "bad_request", f"cannot create {self.dlq}: {e}") from e
        elif existing.partitions <= self.replica.partition:
            await self.client.alter_topic(self.dlq, partitions=self.topic.partitions)

    async def _move(self, pending: list[Pending]) -> None:
        group = pending[0].group
        batch = [p for p in pending if p.group == group][:CONFIRM_BATCH]
        for item in batch:
            await self._append(item)
        confirmed = DeadLettered(
            group,
            tuple(p.index for p in batch),
            tuple(p.letter.sequence for p in batch),
            batch[0].incarnation,
        )
        future = self.groups.propose(confirmed)
        await asyncio.wait_for(future, self.client.timeout_s)

    async def _append(self, item: Pending) -> None:
        replica = self.replica
        problem: str | None = None
        try:
            original = self.groups.record(item.index)
        except MalformedRecordsError as e:
            original, problem = None, str(e)
            self.groups.on_malformed(
                "dead_letter",
                item.index,
                item.index + 1,
                f"consumer group {item.group}: dead-lettered without its record: {e}",
            )
        headers = list(original.headers) if original is not None else []
        headers += [
            ("laminar.dlq.topic", replica.topic.encode()),
            ("laminar.dlq.partition", str(replica.partition).encode()),
            ("laminar.dlq.index", str(item.index).encode()),
            ("laminar.dlq.group", item.group.encode()),
            ("laminar.dlq.reason", item.letter.reason.encode()),
            ("laminar.dlq.deliveries", str(item.letter.deliveries).encode()),
        ]
        if problem is not None:
            headers.append(("laminar.dlq.malformed", problem.encode()))
        record = Record(
            value=original.value if original is not None else None,
            key=original.key if original is not None else None,
            headers=tuple(headers),
            timestamp_ms=original.timestamp_ms if original is not None else None,
        )
        try:
            await self.client.append(
                self.dlq,
                replica.partition,
                [record],
                producer_id=producer_id(
                    replica.topic, replica.partition, item.group, item.incarnation
                ),
                sequence=item.letter.sequence,
            )
        except Conflict:
            pass  # an older sequence than the dead-letter partition's last: appended before
        except NotFound as e:
            raise LaminarError(503, "unavailable", f"{self.dlq} is not ready yet: {e}") from e


class DeadLetterMovers:
    """One mover task per partition led here that has dead letters (`start`, as the node
    core asks in `Round.movers`); a task ends by itself when nothing is pending or the
    replica stops leading."""

    def __init__(self, client: Callable[[], AsyncClient]) -> None:
        self._client = client
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, replica: Replica, topics: Callable[[], Mapping[str, Topic]]) -> None:
        topic = topics().get(replica.topic)
        if topic is None or replica.group in self.tasks:
            return
        mover = DeadLetterMover(self._client(), replica, topic)
        task = asyncio.get_running_loop().create_task(mover.run(topics))
        self.tasks[replica.group] = task
        task.add_done_callback(lambda t: self._done(replica.group, t))

    def _done(self, group: str, task: asyncio.Task[None]) -> None:
        self.tasks.pop(group, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: dead-letter mover failed", group, exc_info=task.exception())
