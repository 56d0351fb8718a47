"""The workload: writers in three modes, shared-queue consumers and probes, and the record of
every attempt and answer they saw (the checker's only source of truth about the clients).

Every value is unique in the run: `<writer>|<seq>|<padding>`, so a value read back names the
writer and the position in that writer's order. Loops are bounded in count and stop on an
event.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from laminar.client import AsyncClient, Producer
from laminar.client.errors import LaminarError

from .calls import Answer, call

PLAIN = "plain"  # no producer id, retried: duplicates allowed where a retry explains them
IDEMPOTENT = "idempotent"  # raw HTTP with producer_id + sequence: never a duplicate
PRODUCER = "producer"  # laminar.client.Producer: never a duplicate
ATTEMPT_TIMEOUT_S = 5.0
PROBE_TIMEOUT_S = 2.0
PROBE_INTERVAL_S = 0.1
WRITE_INTERVAL_S = 0.02
RETRY_BACKOFF_S = 0.2
MAX_VALUES_PER_WRITER = 5_000
PADDING_BYTES = 160
GROUP = "g"
ACQUIRE_MAX = 5
ACQUIRE_WAIT_MS = 300
LEASE_MS_RANGE = (1_000, 3_000)
#: what a consumer does with each message it is granted (weights)
ACTIONS = {"accept": 60, "release": 15, "reject": 10, "abandon": 15}
PRODUCER_WINDOW = 4
PRODUCER_DELIVERY_TIMEOUT_S = 20.0
CLOSE_TIMEOUT_S = 30.0


@dataclass
class Attempt:
    sent_s: float  # time.monotonic()
    answered_s: float
    outcome: str  # "200", "503", "timeout", "connection_lost", "refused", "error:<code>", ...
    definite: bool  # certainly wrote nothing
    index: int | None = None  # where the broker said the record is (success only)
    duplicate: bool = False  # an idempotent append answered "duplicate": true
    url: str = ""
    message: str = ""  # the broker's error message, for failures


@dataclass
class Value:
    writer: str
    mode: str
    topic: str
    partition: int
    seq: int  # the writer's order
    text: str
    attempts: list[Attempt] = field(default_factory=list)
    acked_index: int | None = None
    producer_id: int | None = None
    sequence: int | None = None
    acked_s: float | None = None


@dataclass
class Grant:
    consumer: str
    partition: int
    index: int
    deliveries: int
    lease_deadline_ms: int
    value: str | None
    sent_s: float
    answered_s: float


@dataclass
class Settle:
    consumer: str
    action: str
    partition: int
    indexes: list[int]
    sent_s: float
    answered_s: float
    outcome: str
    done: list[int] = field(default_factory=list)
    refused: list[int] = field(default_factory=list)


@dataclass
class Recorder:
    """Everything the clients did and were told."""

    values: dict[str, Value] = field(default_factory=dict)
    grants: list[Grant] = field(default_factory=list)
    settles: list[Settle] = field(default_factory=list)
    #: answers that are violations on their own: 5xx other than 503/504, and 404 for a topic
    #: that exists
    bad_answers: list[dict[str, Any]] = field(default_factory=list)
    topics: set[str] = field(default_factory=set)  # created and never deleted

    def add(self, value: Value) -> None:
        if value.text in self.values:
            raise ValueError(f"value {value.text[:40]} made twice")
        self.values[value.text] = value

    def note_answer(self, what: str, answer: Answer, topic: str | None = None) -> None:
        if answer.status >= 500 and answer.status not in (503, 504):
            self.bad_answers.append(
                {"kind": "server_error", "call": what, "status": answer.status,
                 "url": answer.url, "message": answer.message()}
            )  # fmt: skip
        elif answer.status == 404 and topic is not None and topic in self.topics:
            self.bad_answers.append(
                {"kind": "not_found_for_existing_topic", "call": what, "url": answer.url,
                 "message": answer.message(), "at_s": round(answer.answered_s, 3)}
            )  # fmt: skip


def make_text(writer: str, seq: int, padding_bytes: int) -> str:
    return f"{writer}|{seq}|" + "x" * padding_bytes


def parse_text(text: str) -> tuple[str, int] | None:
    parts = text.split("|", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1])


@dataclass
class Context:
    session: aiohttp.ClientSession
    urls: list[str]
    recorder: Recorder
    stop: asyncio.Event
    token: str | None = None  # the session sends it; AsyncClient is given it


def records_url(base: str, topic: str, partition: int) -> str:
    return f"{base}/v1/topics/{topic}/partitions/{partition}/records"


def origin(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


class Entry:
    """Which broker a client talks to first: the one that last answered, else a random one."""

    def __init__(self, urls: list[str], rng: random.Random) -> None:
        self.urls = urls
        self.rng = rng
        self.url = rng.choice(urls)

    def answered(self, answer: Answer) -> None:
        if answer.ok:
            self.url = origin(answer.url)
        elif answer.status == 0 or answer.status >= 500:
            self.url = self.rng.choice(self.urls)


def _attempt(answer: Answer) -> Attempt:
    outcome = answer.outcome
    code = answer.error_code()
    if code and not answer.ok:
        outcome = f"{outcome}:{code}"
    message = "" if answer.ok else answer.message()[:120]
    return Attempt(answer.sent_s, answer.answered_s, outcome, answer.definite_failure,
                   url=answer.url, message=message)  # fmt: skip


async def append_values(
    ctx: Context,
    entry: Entry,
    values: list[Value],
    *,
    timeout_s: float,
    give_up: asyncio.Event | None = None,
) -> None:
    """Append `values` (one batch, one topic/partition) until acknowledged, retrying the very
    same request after any failure, until `give_up` is set (then they stay unacknowledged)."""
    first = values[0]
    body: dict[str, Any] = {"records": [{"value": v.text} for v in values]}
    if first.producer_id is not None:
        body["producer_id"] = first.producer_id
        body["sequence"] = first.sequence
    while True:
        answer = await call(
            ctx.session, "POST", records_url(entry.url, first.topic, first.partition),
            json_body=body, timeout_s=timeout_s,
        )  # fmt: skip
        ctx.recorder.note_answer("append", answer, first.topic)
        entry.answered(answer)
        attempt = _attempt(answer)
        data = answer.json() if answer.ok else None
        if isinstance(data, dict) and isinstance(data.get("base_index"), int):
            attempt.index = data["base_index"]
            attempt.duplicate = bool(data.get("duplicate"))
        for i, value in enumerate(values):
            if attempt.index is None:
                value.attempts.append(attempt)
            else:
                one = Attempt(**{**attempt.__dict__, "index": attempt.index + i})
                value.attempts.append(one)
                value.acked_index = one.index
                value.acked_s = answer.answered_s
        if attempt.index is not None:
            return
        if answer.status == 409:
            return  # the sequence is refused for good: retrying it cannot succeed
        if give_up is not None and give_up.is_set():
            return
        await asyncio.sleep(RETRY_BACKOFF_S)


async def raw_writer(
    ctx: Context,
    name: str,
    mode: str,
    topic: str,
    partition: int,
    rng: random.Random,
    *,
    batch_records: int = 1,
    max_batches: int = MAX_VALUES_PER_WRITER,
    padding_bytes: int = PADDING_BYTES,
    interval_s: float = WRITE_INTERVAL_S,
    timeout_s: float = ATTEMPT_TIMEOUT_S,
) -> None:
    """A writer of one partition through raw HTTP JSON appends, one batch in flight: `plain`
    (no producer id) or `idempotent` (producer id + sequence, reused by every retry)."""
    entry = Entry(ctx.urls, rng)
    producer_id = rng.randrange(1, 2**63) if mode == IDEMPOTENT else None
    seq = 0
    for _ in range(max_batches):
        if ctx.stop.is_set():
            return
        values = []
        for i in range(batch_records):
            value = Value(name, mode, topic, partition, seq + i,
                          make_text(name, seq + i, padding_bytes))  # fmt: skip
            if producer_id is not None:
                value.producer_id, value.sequence = producer_id, seq
            ctx.recorder.add(value)
            values.append(value)
        await append_values(ctx, entry, values, timeout_s=timeout_s, give_up=ctx.stop)
        seq += batch_records
        await asyncio.sleep(interval_s)


async def producer_writer(
    ctx: Context, name: str, topic: str, partition: int, partitions: int, rng: random.Random
) -> None:
    """A writer through the project's Producer: acknowledged = the RecordMetadata it returns."""
    producer_id = rng.randrange(1, 2**63)
    pending: list[tuple[Value, asyncio.Future[Any]]] = []

    async def settle(value: Value, future: asyncio.Future[Any]) -> None:
        try:
            metadata = await future
        except (LaminarError, RuntimeError) as e:
            # the Producer gave up: it never reuses the sequence, so the value is written
            # at most once, and may or may not be
            now = time.monotonic()
            value.attempts.append(Attempt(now, now, f"error:{type(e).__name__}", False))
            return
        now = time.monotonic()
        value.attempts.append(Attempt(now, now, "200", False, index=metadata.index))
        if metadata.partition != partition:
            ctx.recorder.bad_answers.append(
                {"kind": "producer_wrong_partition", "value": value.text[:40],
                 "partition": metadata.partition}
            )  # fmt: skip
        value.acked_index = metadata.index
        value.acked_s = now

    async with AsyncClient(ctx.urls, token=ctx.token, timeout_s=ATTEMPT_TIMEOUT_S) as client:
        producer = Producer(
            client, topic, linger_ms=2, partitions=partitions, producer_id=producer_id,
            delivery_timeout_s=PRODUCER_DELIVERY_TIMEOUT_S,
        )  # fmt: skip
        try:
            for seq in range(MAX_VALUES_PER_WRITER):
                if ctx.stop.is_set():
                    break
                value = Value(name, PRODUCER, topic, partition, seq,
                              make_text(name, seq, PADDING_BYTES))  # fmt: skip
                value.producer_id = producer_id
                ctx.recorder.add(value)
                future = await producer.send(value.text, partition=partition)
                pending.append((value, future))
                if len(pending) >= PRODUCER_WINDOW:
                    await settle(*pending.pop(0))
                await asyncio.sleep(WRITE_INTERVAL_S)
            for item in pending:
                await settle(*item)
        finally:
            with contextlib.suppress(TimeoutError, LaminarError):
                await asyncio.wait_for(producer.close(), CLOSE_TIMEOUT_S)


def group_url(base: str, topic: str, partition: int, action: str = "") -> str:
    path = f"{base}/v1/topics/{topic}/partitions/{partition}/groups/{GROUP}"
    return f"{path}/{action}" if action else path


async def acquire(
    ctx: Context,
    entry: Entry,
    consumer: str,
    topic: str,
    partition: int,
    lease_ms: int,
    max_messages: int = ACQUIRE_MAX,
    wait_ms: int = ACQUIRE_WAIT_MS,
) -> list[Grant]:
    answer = await call(
        ctx.session, "POST", group_url(entry.url, topic, partition, "acquire"),
        json_body={"consumer": consumer, "max": max_messages, "lease_ms": lease_ms,
                   "wait_ms": wait_ms},
        timeout_s=ATTEMPT_TIMEOUT_S + wait_ms / 1000,
    )  # fmt: skip
    ctx.recorder.note_answer("acquire", answer, topic)
    entry.answered(answer)
    data = answer.json() if answer.ok else None
    if not isinstance(data, dict):
        return []
    grants = []
    for message in data.get("messages", []):
        grant = Grant(
            consumer, partition, int(message["index"]), int(message["deliveries"]),
            int(message["lease_deadline_ms"]), message.get("value"),
            answer.sent_s, answer.answered_s,
        )  # fmt: skip
        grants.append(grant)
    ctx.recorder.grants.extend(grants)
    return grants


async def settle(
    ctx: Context,
    entry: Entry,
    consumer: str,
    action: str,
    topic: str,
    partition: int,
    indexes: list[int],
) -> Settle:
    body: dict[str, Any] = {"consumer": consumer, "indexes": indexes}
    if action == "reject":
        body["reason"] = "fault-suite"
    answer = await call(
        ctx.session, "POST", group_url(entry.url, topic, partition, action),
        json_body=body, timeout_s=ATTEMPT_TIMEOUT_S,
    )  # fmt: skip
    ctx.recorder.note_answer(action, answer, topic)
    entry.answered(answer)
    result = Settle(consumer, action, partition, indexes, answer.sent_s, answer.answered_s,
                    answer.outcome)  # fmt: skip
    data = answer.json() if answer.ok else None
    if isinstance(data, dict):
        result.done = [int(i) for i in data.get("done", [])]
        result.refused = [int(i) for i in data.get("refused", [])]
    ctx.recorder.settles.append(result)
    return result


async def queue_consumer(
    ctx: Context, name: str, topic: str, partitions: int, rng: random.Random
) -> None:
    """Acquires with short leases and settles each message by a seeded choice; an abandoned
    message is never settled (its lease runs out and it comes back)."""
    entry = Entry(ctx.urls, rng)
    actions, weights = list(ACTIONS), list(ACTIONS.values())
    for _ in range(MAX_VALUES_PER_WRITER):
        if ctx.stop.is_set():
            return
        partition = rng.randrange(partitions)
        lease_ms = rng.randint(*LEASE_MS_RANGE)
        grants = await acquire(ctx, entry, name, topic, partition, lease_ms)
        chosen: dict[str, list[int]] = {}
        for grant in grants:
            chosen.setdefault(rng.choices(actions, weights)[0], []).append(grant.index)
        for action, indexes in sorted(chosen.items()):
            if action != "abandon":
                await settle(ctx, entry, name, action, topic, partition, indexes)
        if not grants:
            await asyncio.sleep(RETRY_BACKOFF_S)


async def probe(ctx: Context, topic: str, partition: int, rng: random.Random) -> None:
    """An idempotent writer of small values, one every PROBE_INTERVAL_S: its acknowledgements
    tell when the partition took appends again after a fault."""
    name = f"probe-{topic}-{partition}"
    entry = Entry(ctx.urls, rng)
    producer_id = rng.randrange(1, 2**63)
    for seq in range(MAX_VALUES_PER_WRITER * 4):
        if ctx.stop.is_set():
            return
        value = Value(name, IDEMPOTENT, topic, partition, seq, make_text(name, seq, 0))
        value.producer_id, value.sequence = producer_id, seq
        ctx.recorder.add(value)
        await append_values(ctx, entry, [value], timeout_s=PROBE_TIMEOUT_S, give_up=ctx.stop)
        await asyncio.sleep(PROBE_INTERVAL_S)
