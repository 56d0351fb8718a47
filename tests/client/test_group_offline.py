"""Shared-queue client logic without a broker: model decoding, argument checks, request
bodies, redirects and retries of `AsyncClient`'s group calls, and `GroupConsumer` (spreading,
the in-flight bound, lease renewal, batched settling, `run`, close-releases) against a small
in-test aiohttp fake implementing the contract (docs/api.md, "Shared queues"). The fake never
expires a lease by itself, so nothing here depends on timing; the real end-to-end tests live
with the broker's."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from laminar import cli
from laminar.client import (
    Acquired,
    AsyncClient,
    Client,
    Delivery,
    GroupConsumer,
    GroupDescription,
    NotFound,
    QueueMessage,
    Retry,
    Settled,
    default_consumer_id,
)
from laminar.client.group import MAX_RENEWS_IN_FLIGHT, reason_for

from .test_client_offline import closed_port_url

TOPIC = "jobs"
GROUP = "workers"
CONSUMER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")


# ---------------------------------------------------------------------------- the fake broker


@dataclass
class Held:
    consumer: str
    deadline_ms: int


@dataclass
class FakeGroup:
    deliveries: dict[int, int] = field(default_factory=dict)
    held: dict[int, Held] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)
    #: index -> (consumer, action) that settled it last since it was handed out
    settled: dict[int, tuple[str, str]] = field(default_factory=dict)
    accepted: int = 0
    dead: list[tuple[int, str]] = field(default_factory=list)


class FakeBroker:
    """One topic; every partition led by this broker. Records every request it serves."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.messages: dict[int, list[dict[str, Any]]] = {p: [] for p in range(partitions)}
        self.groups: dict[tuple[int, str], FakeGroup] = {}
        self.requests: list[tuple[str, str, Any]] = []  # (method, path, body)
        self.fail: dict[str, list[int]] = {}  # action -> statuses to answer first
        self.most_held = 0
        self.changed = asyncio.Event()
        #: partitions whose renewals are answered only once `unstall` is set
        self.stalled: set[int] = set()
        self.unstall = asyncio.Event()
        self.url = ""

    # -- test helpers

    def add(self, partition: int, count: int, value: bytes | None = None) -> list[int]:
        log = self.messages[partition]
        added = []
        for _ in range(count):
            index = 10 * len(log) + 3  # indexes with gaps, like a Raft log's
            log.append({"index": index, "value": value})
            added.append(index)
        self.changed.set()
        return added

    def end(self, partition: int) -> int:
        """One past the last index of `partition` (0: none)."""
        log = self.messages[partition]
        return log[-1]["index"] + 1 if log else 0

    def group(self, partition: int, group: str = GROUP) -> FakeGroup:
        return self.groups.setdefault((partition, group), FakeGroup())

    def held(self) -> int:
        return sum(len(g.held) for g in self.groups.values())

    def calls(self, action: str) -> list[Any]:
        return [body for _, path, body in self.requests if path.endswith("/" + action)]

    def expire(self, partition: int, index: int, to: str = "someone-else") -> None:
        self.group(partition).held[index] = Held(to, 0)

    # -- the app

    def app(self) -> web.Application:
        app = web.Application()
        prefix = "/v1/topics/{topic}/partitions/{p}/groups/{group}"
        app.router.add_get("/v1/topics/{topic}", self.describe_topic)
        app.router.add_get(prefix, self.describe_group)
        app.router.add_post(prefix + "/{action}", self.act)
        return app

    async def describe_topic(self, request: web.Request) -> web.Response:
        self.requests.append(("GET", request.path, None))
        if request.match_info["topic"] != TOPIC:
            return error(404, "not_found", "no such topic")
        states = [
            {
                "partition": p,
                "leader": "n1",
                "leader_url": self.url,
                "replicas": ["n1"],
                "learners": [],
                "in_sync": ["n1"],
                "log_start": 0,
                "commit_index": self.end(p) - 1 if self.messages[p] else 0,
                "log_end": self.end(p),
            }
            for p in range(self.partitions)
        ]
        return web.json_response(
            {
                "name": TOPIC,
                "partitions": self.partitions,
                "replication_factor": 1,
                "config": {},
                "partition_states": states,
            }
        )

    async def describe_group(self, request: web.Request) -> web.Response:
        self.requests.append(("GET", request.path, None))
        p, name = int(request.match_info["p"]), request.match_info["group"]
        if (p, name) not in self.groups:
            return error(404, "not_found", f"no group {name}")
        g = self.groups[(p, name)]
        free = [m for m in self.messages[p] if m["index"] not in g.finished | set(g.held)]
        return web.json_response(
            {
                "topic": TOPIC,
                "partition": p,
                "group": name,
                "cursor": min((m["index"] for m in free), default=0),
                "acquired": len(g.held),
                "pending": len(free),
                "dead_letter_pending": 0,
                "accepted": g.accepted,
                "dead_lettered": len(g.dead),
                "end_index": self.end(p),
            }
        )

    async def act(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(("POST", request.path, body))
        action = request.match_info["action"]
        statuses = self.fail.get(action)
        if statuses:
            status = statuses.pop(0)
            code = {503: "unavailable", 404: "not_found"}.get(status, "bad_request")
            return error(status, code, "injected", {"Retry-After": "1"})
        p = int(request.match_info["p"])
        if request.match_info["topic"] != TOPIC or not 0 <= p < self.partitions:
            return error(404, "not_found", "no such partition")
        if action == "renew" and p in self.stalled:
            await self.unstall.wait()
        g = self.group(p, request.match_info["group"])
        if action == "acquire":
            return await self.acquire(p, g, body)
        consumer, indexes = body["consumer"], body["indexes"]
        mine = [i for i in indexes if i in g.held and g.held[i].consumer == consumer]
        done = [i for i in indexes if i in mine or g.settled.get(i) == (consumer, action)]
        refused = [i for i in indexes if i not in done]
        answer: dict[str, Any] = {"done": done, "refused": refused}
        now = int(time.time() * 1000)
        for i in mine:
            if action == "renew":
                g.held[i].deadline_ms = now + body["lease_ms"]
                answer["lease_deadline_ms"] = now + body["lease_ms"]
                continue
            del g.held[i]
            g.settled[i] = (consumer, action)
            if action == "accept":
                g.finished.add(i)
                g.accepted += 1
            elif action == "reject":
                g.finished.add(i)
                g.dead.append((i, body.get("reason", "rejected")))
        self.changed.set()
        return web.json_response(answer)

    async def acquire(self, p: int, g: FakeGroup, body: dict[str, Any]) -> web.Response:
        consumer = body.get("consumer") or "made-up-1"
        deadline = time.monotonic() + body.get("wait_ms", 0) / 1000
        while True:
            free = [
                m
                for m in self.messages[p]
                if m["index"] not in g.finished and m["index"] not in g.held
            ][: body.get("max", 100)]
            remaining = deadline - time.monotonic()
            if free or remaining <= 0:
                break
            self.changed.clear()
            with suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)
        lease_ms = body.get("lease_ms", 30000)
        deadline_ms = int(time.time() * 1000) + lease_ms
        out = []
        for m in free:
            i = m["index"]
            g.held[i] = Held(consumer, deadline_ms)
            g.settled.pop(i, None)
            g.deliveries[i] = g.deliveries.get(i, 0) + 1
            value = m["value"] if m["value"] is not None else f"m{i}".encode()
            item: dict[str, Any] = {
                "index": i,
                "deliveries": g.deliveries[i],
                "lease_deadline_ms": deadline_ms,
                "timestamp_ms": 1_700_000_000_000 + i,
                "key": f"k{i}",
                "value": value.decode("utf-8", "replace"),
                "headers": {"h": "v"},
            }
            try:
                value.decode()
            except UnicodeDecodeError:
                item.update(
                    key=b64(item["key"].encode()),
                    value=b64(value),
                    headers={"h": b64(b"v")},
                    encoding="base64",
                )
            out.append(item)
        self.most_held = max(self.most_held, self.held())
        return web.json_response({"consumer": consumer, "messages": out})


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def error(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    body = {"error": {"code": code, "message": message}}
    return web.json_response(body, status=status, headers=headers)


@asynccontextmanager
async def fake(partitions: int = 1) -> AsyncIterator[tuple[FakeBroker, AsyncClient]]:
    broker = FakeBroker(partitions)
    server = TestServer(broker.app())
    await server.start_server()
    broker.url = str(server.make_url("")).rstrip("/")
    try:
        async with AsyncClient([broker.url], timeout_s=5) as client:
            yield broker, client
    finally:
        await server.close()


async def eventually(check: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    """Wait until `check()` holds (a bound against hanging, not a timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.01)


async def take(consumer: GroupConsumer, count: int) -> list[Delivery]:
    out: list[Delivery] = []
    async with asyncio.timeout(5):
        async for delivery in consumer:
            out.append(delivery)
            if len(out) == count:
                break
    return out


# ---------------------------------------------------------------------------- models


def test_queue_messages_decode_text_and_base64() -> None:
    text = QueueMessage.from_json(
        {
            "index": 7,
            "deliveries": 2,
            "lease_deadline_ms": 99,
            "timestamp_ms": 5,
            "key": None,
            "value": "héllo",
            "headers": {"a": "b"},
        },
        topic="t",
        partition=3,
    )
    assert text == QueueMessage(7, 2, 99, 5, None, "héllo".encode(), (("a", b"b"),), 3, "t")
    assert text.header("a") == b"b" and text.header("x") is None
    binary = QueueMessage.from_json(
        {
            "index": 8,
            "deliveries": 1,
            "lease_deadline_ms": 1,
            "timestamp_ms": 1,
            "key": b64(b"k"),
            "value": b64(b"\xff\x00"),
            "headers": {"h": b64(b"\x80")},
            "encoding": "base64",
        },
        topic="t",
        partition=0,
    )
    assert (binary.key, binary.value, binary.headers) == (b"k", b"\xff\x00", (("h", b"\x80"),))
    with pytest.raises(ValueError):
        QueueMessage.from_json(
            {"index": 1, "value": "not base64!", "encoding": "base64"}, topic="t", partition=0
        )


def test_answers_decode() -> None:
    acquired = Acquired.from_json({"consumer": "c1", "messages": []}, topic="t", partition=0)
    assert acquired == Acquired("c1", [])
    assert (
        Acquired.from_json({"messages": []}, topic="t", partition=0, consumer="me").consumer == "me"
    )
    assert Settled.from_json({"done": [1, 2], "refused": [3]}) == Settled((1, 2), (3,), None)
    renewed = Settled.from_json({"done": [1], "refused": [], "lease_deadline_ms": 42})
    assert renewed.lease_deadline_ms == 42
    raw = {
        "topic": "t",
        "partition": 1,
        "group": "g",
        "cursor": 10,
        "acquired": 2,
        "pending": 3,
        "dead_letter_pending": 1,
        "accepted": 4,
        "dead_lettered": 5,
        "end_index": 16,
    }
    assert GroupDescription.from_json(raw) == GroupDescription("t", 1, "g", 10, 2, 3, 1, 4, 5, 16)


def test_default_consumer_ids_are_valid_and_distinct() -> None:
    ids = {default_consumer_id() for _ in range(5)}
    assert len(ids) == 5
    assert all(CONSUMER_ID.fullmatch(i) for i in ids)
    assert reason_for(ValueError("boom")) == "ValueError: boom"
    assert reason_for(KeyError()) == "KeyError"
    assert len(reason_for(ValueError("x" * 500))) == 200


# ---------------------------------------------------------------------------- AsyncClient


async def test_group_call_arguments_are_checked_before_sending() -> None:
    async with AsyncClient([closed_port_url()], timeout_s=0.2) as client:
        bad_calls: list[Awaitable[object]] = [
            client.acquire("t", 0, "-bad"),
            client.acquire("t", 0, "g", consumer="has space"),
            client.acquire("t", 0, "g", max_messages=0),
            client.acquire("t", 0, "g", max_messages=10_001),
            client.acquire("t", 0, "g", lease_ms=0),
            client.acquire("t", 0, "g", wait_ms=60_001),
            client.acquire("t", 0, "g", max_bytes=0),
            client.accept("t", 0, "g", "c", []),
            client.accept("t", 0, "g", "c", [-1]),
            client.release("t", 0, "g", "", [1]),
            client.reject("t", 0, "g", "c", [1], reason=""),
            client.reject("t", 0, "g", "c", [1], reason="x" * 201),
            client.renew("t", 0, "g", "c", [1], lease_ms=3_600_001),
            client.describe_group("t", 0, "g/x"),
        ]
        for call in bad_calls:
            with pytest.raises(ValueError):
                await call


async def test_group_calls_send_the_contract_bodies() -> None:
    async with fake() as (broker, client):
        broker.add(0, 3, b"\xfe")
        got = await client.acquire(TOPIC, 0, GROUP, max_messages=2, lease_ms=5000)
        assert got.consumer == "made-up-1"  # the broker's when none is given
        assert [m.index for m in got.messages] == [3, 13]
        assert got.messages[0].value == b"\xfe" and got.messages[0].key == b"k3"
        assert got.messages[0].topic == TOPIC and got.messages[0].deliveries == 1
        mine = await client.acquire(
            TOPIC, 0, GROUP, consumer="me:1", max_messages=5, wait_ms=10, max_bytes=1000
        )
        assert [m.index for m in mine.messages] == [23]
        renewed = await client.renew(TOPIC, 0, GROUP, "me:1", [23, 3], lease_ms=9000)
        assert renewed.done == (23,) and renewed.refused == (3,)
        assert renewed.lease_deadline_ms is not None
        assert (await client.accept(TOPIC, 0, GROUP, "made-up-1", [3])).done == (3,)
        assert (await client.accept(TOPIC, 0, GROUP, "made-up-1", [3])).done == (3,)  # again
        assert (await client.release(TOPIC, 0, GROUP, "made-up-1", [13])).done == (13,)
        rejected = await client.reject(TOPIC, 0, GROUP, "me:1", [23], reason="bad input")
        assert rejected == Settled((23,), ())
        described = await client.describe_group(TOPIC, 0, GROUP)
        assert (described.accepted, described.dead_lettered, described.pending) == (1, 1, 1)
        assert [body for _, path, body in broker.requests if path.endswith("/acquire")] == [
            {"max": 2, "lease_ms": 5000},
            {"max": 5, "lease_ms": 30000, "consumer": "me:1", "wait_ms": 10, "max_bytes": 1000},
        ]
        assert broker.calls("renew") == [{"consumer": "me:1", "indexes": [23, 3], "lease_ms": 9000}]
        assert broker.calls("reject") == [
            {"consumer": "me:1", "indexes": [23], "reason": "bad input"}
        ]
        assert broker.calls("release") == [{"consumer": "made-up-1", "indexes": [13]}]
        assert broker.groups[(0, GROUP)].dead == [(23, "bad input")]
        paths = {path for _, path, _ in broker.requests}
        assert f"/v1/topics/{TOPIC}/partitions/0/groups/{GROUP}/accept" in paths
        assert f"/v1/topics/{TOPIC}/partitions/0/groups/{GROUP}" in paths
        with pytest.raises(NotFound):
            await client.describe_group(TOPIC, 0, "nobody")


async def test_group_calls_follow_redirects_and_retry_503() -> None:
    async with fake() as (broker, _):
        follower = web.Application()
        hops: list[str] = []

        async def redirect(request: web.Request) -> web.Response:
            hops.append(request.path)
            return web.json_response(
                {"error": {"code": "not_leader", "message": "ask n1", "leader": "n1"}},
                status=307,
                headers={"Location": broker.url + request.path_qs},
            )

        follower.router.add_route("*", "/{tail:.*}", redirect)
        server = TestServer(follower)
        await server.start_server()
        try:
            async with AsyncClient([str(server.make_url("")).rstrip("/")], timeout_s=5) as client:
                broker.add(0, 1)
                broker.fail["acquire"] = [503]
                got = await client.acquire(TOPIC, 0, GROUP, consumer="c")
                assert [m.index for m in got.messages] == [3]
                done = await client.accept(TOPIC, 0, GROUP, "c", [3])
                assert done.done == (3,)
        finally:
            await server.close()
        assert hops  # the first call went to the follower, which sent it on
        assert broker.calls("acquire") == [{"max": 100, "lease_ms": 30000, "consumer": "c"}] * 2
        assert broker.calls("accept") == [{"consumer": "c", "indexes": [3]}]


async def test_the_sync_client_wraps_the_group_calls() -> None:
    async with fake() as (broker, _):
        broker.add(0, 2)
        with Client([broker.url], timeout_s=5) as client:
            got = await asyncio.to_thread(client.acquire, TOPIC, 0, GROUP, consumer="s")
            indexes = [m.index for m in got.messages]
            renewed = await asyncio.to_thread(client.renew, TOPIC, 0, GROUP, "s", indexes, 1000)
            assert renewed.done == tuple(indexes)
            await asyncio.to_thread(client.accept, TOPIC, 0, GROUP, "s", indexes[:1])
            await asyncio.to_thread(client.reject, TOPIC, 0, GROUP, "s", indexes[1:], "no")
            await asyncio.to_thread(client.release, TOPIC, 0, GROUP, "s", indexes)
            described = await asyncio.to_thread(client.describe_group, TOPIC, 0, GROUP)
        assert (described.accepted, described.dead_lettered) == (1, 1)


# ---------------------------------------------------------------------------- GroupConsumer


def test_group_consumer_arguments_are_checked() -> None:
    client = AsyncClient([closed_port_url()])
    for bad in (
        {"lease_ms": 0},
        {"wait_ms": -1},
        {"max_in_flight": 0},
        {"batch": 10_001},
        {"limit": -1},
        {"renew_interval_ms": 0},
        {"settle_batch": 0},
        {"consumer": "bad id"},
    ):
        with pytest.raises(ValueError):
            GroupConsumer(client, TOPIC, GROUP, **bad)
    with pytest.raises(ValueError):
        GroupConsumer(client, TOPIC, ".group")
    assert CONSUMER_ID.fullmatch(GroupConsumer(client, TOPIC, GROUP).consumer)


async def test_it_spreads_over_every_partition_and_batches_accepts() -> None:
    async with fake(3) as (broker, client):
        for p in range(3):
            broker.add(p, 4)
        consumer = GroupConsumer(
            client, TOPIC, GROUP, consumer="c1", wait_ms=20, settle_batch=4, limit=12
        )
        async with consumer:
            got = [d async for d in consumer]  # ends at `limit`
            assert sorted((d.partition, d.index) for d in got) == [
                (p, i) for p in range(3) for i in (3, 13, 23, 33)
            ]
            assert consumer.in_flight == 12
            results = await asyncio.gather(*(d.accept() for d in got))
            assert results == [True] * 12
            assert all(d.state == "accepted" and d.settled for d in got)
            assert consumer.in_flight == 0
        accepts = broker.calls("accept")
        assert len(accepts) == 3  # one per partition: 4 indexes each
        assert all(body == {"consumer": "c1", "indexes": [3, 13, 23, 33]} for body in accepts)
        assert all(broker.group(p).accepted == 4 for p in range(3))
        assert broker.calls("release") == []  # nothing was left to release
        assert {body["consumer"] for body in broker.calls("acquire")} == {"c1"}
        with pytest.raises(RuntimeError):
            await got[0].accept()  # closed (and settled) already


async def test_settling_twice_is_refused_and_lost_leases_answer_false() -> None:
    async with fake() as (broker, client):
        broker.add(0, 2)
        async with GroupConsumer(client, TOPIC, GROUP, consumer="c", wait_ms=20) as consumer:
            first, second = await take(consumer, 2)
            assert await first.reject("bad") is True
            with pytest.raises(RuntimeError):
                await first.accept()
            broker.expire(0, second.index)  # someone else holds it now
            assert await second.accept() is False
            assert second.state == "lost"
            assert consumer.refused == 1
        assert broker.group(0).dead == [(first.index, "bad")]


async def test_run_goes_on_when_the_broker_refuses_a_settlement(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with fake() as (broker, client):
        broker.add(0, 2)
        consumer = GroupConsumer(client, TOPIC, GROUP, consumer="c", wait_ms=20, limit=2)

        async def handler(delivery: Delivery) -> None:
            if delivery.index == 3:
                broker.expire(0, delivery.index)  # its lease ended while it was worked on
                raise ValueError("poison")

        async with consumer:
            async with asyncio.timeout(5):
                await consumer.run(handler)  # ends at `limit`
        assert consumer.refused == 1
        g = broker.group(0)
        assert g.dead == [] and g.accepted == 1 and g.held[3].consumer == "someone-else"
        assert "refused to reject 1 of 1 messages of jobs/0" in caplog.text


async def test_it_holds_at_most_max_in_flight() -> None:
    async with fake() as (broker, client):
        broker.add(0, 20)
        async with GroupConsumer(
            client, TOPIC, GROUP, consumer="c", max_in_flight=5, wait_ms=20
        ) as consumer:
            got = await take(consumer, 5)
            await asyncio.sleep(0.1)  # room for a wrong extra acquire (none may happen)
            assert broker.held() == 5 and consumer.in_flight == 5
            assert all(body["max"] <= 5 for body in broker.calls("acquire"))
            assert await got[0].accept()
            more = await take(consumer, 1)
            assert more[0].index == 53  # the next one, acquired once there was room
            assert broker.most_held == 5
        assert broker.held() == 0  # close released the 5 held


async def test_with_room_for_one_a_message_behind_empty_partitions_is_not_held_up() -> None:
    """limit=1 over six partitions, the message on the last: the loop holding the only room
    asks without waiting (others have none), so the room goes round the partitions instead
    of sitting in a 60 s long poll on each empty one ahead (issue 26)."""
    async with fake(6) as (broker, client):
        (index,) = broker.add(5, 1)
        consumer = GroupConsumer(client, TOPIC, GROUP, consumer="c", wait_ms=60_000, limit=1)
        async with consumer:
            async with asyncio.timeout(30):  # a long poll ahead of it would take 60 s
                got = [d async for d in consumer]
            assert [(d.partition, d.index) for d in got] == [(5, index)]
            assert await got[0].accept()
        acquires = broker.calls("acquire")
        assert acquires and all(body.get("wait_ms", 0) == 0 for body in acquires)
        assert all(body["max"] == 1 for body in acquires)


async def test_loops_with_room_to_spare_long_poll() -> None:
    async with fake(3) as (broker, client):
        broker.add(1, 1)
        consumer = GroupConsumer(client, TOPIC, GROUP, consumer="c", wait_ms=50, limit=1)
        async with consumer:
            got = await take(consumer, 1)
            assert await got[0].accept()
        async with GroupConsumer(client, TOPIC, GROUP, consumer="c", wait_ms=50) as consumer:
            broker.add(2, 1)
            assert [d.partition for d in await take(consumer, 1)] == [2]
        acquires = broker.calls("acquire")
        # the first consumer (room for one) never waited; the second (room for 1000) did
        waits = [body.get("wait_ms", 0) for body in acquires]
        assert 0 in waits and 50 in waits
        assert all(body.get("wait_ms") == 50 for body in acquires if body["max"] > 1)


async def test_it_renews_every_held_lease_in_one_call_per_partition() -> None:
    async with fake(2) as (broker, client):
        broker.add(0, 2)
        broker.add(1, 1)
        consumer = GroupConsumer(
            client, TOPIC, GROUP, consumer="r", lease_ms=300, wait_ms=20, limit=3
        )
        async with consumer:
            got = await take(consumer, 3)
            await eventually(lambda: len(broker.calls("renew")) >= 2, "renewals")
            renewals = {tuple(body["indexes"]) for body in broker.calls("renew")[:2]}
            assert renewals == {(3, 13), (3,)}
            assert all(body["lease_ms"] == 300 for body in broker.calls("renew"))
            broker.expire(0, 13)
            lost = next(d for d in got if (d.partition, d.index) == (0, 13))
            await eventually(lambda: lost.lease_lost, "the lost lease noticed")
            assert await lost.accept() is False
            kept = next(d for d in got if (d.partition, d.index) == (0, 3))
            assert kept.lease_deadline_ms >= kept.message.lease_deadline_ms
            assert await kept.accept() is True


async def test_a_slow_renewal_holds_back_neither_the_next_nor_other_partitions() -> None:
    """Partition 0's renewals go unanswered: partition 1's go on at their interval, and
    partition 0's too, up to MAX_RENEWS_IN_FLIGHT unanswered (the loop used to wait for
    every answer before its next round, and one slow partition let every lease run out)."""
    async with fake(2) as (broker, client):
        broker.add(0, 1)
        broker.add(1, 1)
        broker.stalled.add(0)
        consumer = GroupConsumer(
            client, TOPIC, GROUP, consumer="r", lease_ms=300, wait_ms=20, limit=2
        )
        async with consumer:
            await take(consumer, 2)

            def renewals(partition: int) -> int:
                path = f"/v1/topics/{TOPIC}/partitions/{partition}/groups/{GROUP}/renew"
                return sum(1 for _, p, _ in broker.requests if p == path)

            await eventually(lambda: renewals(1) >= 2 * MAX_RENEWS_IN_FLIGHT, "renewals")
            assert renewals(0) == MAX_RENEWS_IN_FLIGHT  # (counted as they arrive)
            broker.unstall.set()
            await eventually(lambda: renewals(0) > MAX_RENEWS_IN_FLIGHT, "renewals again")


async def test_close_releases_what_is_held_and_sends_pending_settlements() -> None:
    async with fake() as (broker, client):
        broker.add(0, 6)
        consumer = GroupConsumer(
            client, TOPIC, GROUP, consumer="c", wait_ms=20, settle_linger_ms=60_000
        )
        async with consumer:
            first, second = await take(consumer, 2)
            accepting = asyncio.create_task(first.accept())  # lingers until close
            await asyncio.sleep(0)
            assert broker.calls("accept") == []
        assert await accepting is True
        assert broker.calls("accept") == [{"consumer": "c", "indexes": [3]}]
        (released,) = broker.calls("release")
        assert released == {"consumer": "c", "indexes": [13, 23, 33, 43, 53]}  # handed or not
        assert second.state == "released"
        assert broker.held() == 0
        assert [d async for d in consumer] == []  # iteration ended


async def test_run_accepts_rejects_and_releases() -> None:
    async with fake() as (broker, client):
        broker.add(0, 4)
        seen: list[int] = []
        consumer = GroupConsumer(client, TOPIC, GROUP, consumer="c", wait_ms=20, limit=4)

        async def handler(delivery: Delivery) -> None:
            seen.append(delivery.index)
            if delivery.index == 13:
                raise ValueError("boom")
            if delivery.index == 23:
                raise Retry
            if delivery.index == 33:
                await delivery.reject("mine")

        async with consumer:
            async with asyncio.timeout(5):
                await consumer.run(handler, concurrency=2)  # ends at `limit`
        assert sorted(seen) == [3, 13, 23, 33]
        g = broker.group(0)
        assert g.accepted == 1 and sorted(g.dead) == [(13, "ValueError: boom"), (33, "mine")]
        assert broker.calls("release") == [{"consumer": "c", "indexes": [23]}]

        broker.add(0, 1)  # index 43
        released = GroupConsumer(client, TOPIC, GROUP, consumer="d", wait_ms=20, limit=2)

        async def failing(delivery: Delivery) -> None:
            raise RuntimeError("later")

        async with released:
            async with asyncio.timeout(5):
                await released.run(failing, on_error="release")
        assert sorted(i for body in broker.calls("release")[1:] for i in body["indexes"]) == [
            23,
            43,
        ]
        assert g.deliveries[23] == 2  # released once, delivered again


async def test_close_ends_run_and_releases_what_its_handlers_hold() -> None:
    async with fake() as (broker, client):
        broker.add(0, 2)
        consumer = GroupConsumer(
            client, TOPIC, GROUP, consumer="c", wait_ms=20, close_timeout_s=0.05
        )
        started = asyncio.Event()

        async def stuck(delivery: Delivery) -> None:
            started.set()
            await asyncio.Event().wait()  # never ends: close() must cancel it

        async with asyncio.timeout(5):
            await consumer.start()
            running = asyncio.create_task(consumer.run(stuck))
            await started.wait()
            await consumer.close()
            await running  # ends normally
        assert broker.calls("accept") == [] and broker.held() == 0
        released = sorted(i for body in broker.calls("release") for i in body["indexes"])
        assert released == [3, 13]


async def test_it_retries_unavailable_and_raises_fatal_errors() -> None:
    async with fake(2) as (broker, client):
        broker.add(1, 1)
        broker.fail["acquire"] = [503, 503]
        async with GroupConsumer(client, TOPIC, GROUP, consumer="c", wait_ms=20) as consumer:
            (got,) = await take(consumer, 1)
            assert (got.partition, got.index) == (1, 3)
        broker.fail["acquire"] = [404]
        async with GroupConsumer(client, TOPIC, GROUP, consumer="c", wait_ms=20) as consumer:
            with pytest.raises(NotFound):
                async with asyncio.timeout(5):
                    async for _ in consumer:
                        pass
            with pytest.raises(NotFound):  # it stays raised
                await consumer.__anext__()
        with pytest.raises(NotFound):
            async with GroupConsumer(client, "nope", GROUP):
                pass


async def test_it_picks_up_new_partitions() -> None:
    async with fake(1) as (broker, client):
        consumer = GroupConsumer(
            client, TOPIC, GROUP, consumer="c", wait_ms=20, partition_check_s=0.02
        )
        async with consumer:
            assert consumer.partitions == [0]
            broker.partitions = 2
            broker.messages[1] = []
            broker.add(1, 1)
            (got,) = await take(consumer, 1)
            assert got.partition == 1 and consumer.partitions == [0, 1]
            assert await got.accept()


# ---------------------------------------------------------------------------- the CLI


async def laminar(*argv: str) -> int:
    return await asyncio.to_thread(cli.main, list(argv))


async def test_the_queue_commands(capsys: pytest.CaptureFixture[str]) -> None:
    async with fake(2) as (broker, client):
        url = ["--brokers", broker.url]
        fast = [*url, "--wait-ms", "20"]
        broker.add(0, 2)
        broker.add(1, 1, b"\xff")
        assert await laminar("queue", "consume", TOPIC, GROUP, "--count", "2", "--json", *fast) == 0
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert len(lines) == 2 and {"partition", "index", "deliveries"} <= set(lines[0])
        assert sum(broker.group(p).accepted for p in range(2)) == 2
        assert broker.held() == 0  # no more acquired than printed

        assert await laminar("queue", "describe", TOPIC, GROUP, "--json", *url) == 0
        described = json.loads(capsys.readouterr().out)
        assert [p["partition"] for p in described["partitions"]] == [0, 1]
        assert sum(p["accepted"] for p in described["partitions"]) == 2
        assert await laminar("queue", "describe", TOPIC, GROUP, "--partition", "1", *url) == 0
        assert "PARTITION" in capsys.readouterr().out

        broker.add(0, 1)
        assert (
            await laminar("queue", "consume", TOPIC, GROUP, "--release", "--count", "2", *fast) == 0
        )
        out = capsys.readouterr().out.splitlines()
        assert len(out) == 2
        assert broker.held() == 0 and len(broker.calls("release")) >= 1

        broker.add(1, 1)
        got = await client.acquire(TOPIC, 1, GROUP, consumer="cli", max_messages=1)
        index = str(got.messages[0].index)
        assert (
            await laminar(
                "queue",
                "reject",
                TOPIC,
                GROUP,
                "-p",
                "1",
                "--consumer",
                "cli",
                "--reason",
                "x",
                index,
                *url,
            )
            == 0
        )
        assert "rejected 1" in capsys.readouterr().out
        assert (
            await laminar(
                "queue",
                "accept",
                TOPIC,
                GROUP,
                "-p",
                "1",
                "--consumer",
                "cli",
                "999",
                "--json",
                *url,
            )
            == 1
        )
        assert json.loads(capsys.readouterr().out) == {"done": [], "refused": [999]}
        assert await laminar("queue", "describe", TOPIC, "nobody", *url) == 1
