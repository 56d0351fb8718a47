"""The Qpid plan's shared-queue tests on a real 3-broker cluster, over the raw HTTP API.

4 senders and 4 receivers in one group; acquire + release then acquire through any broker;
acquire + kill -9 of the partition leader (the lease holds across the failover, then expires);
reject → the dead-letter topic exactly once; a reject after the lease ended is refused and the
message comes again; max_deliveries; bad input changes nothing.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from laminar.local_cluster import LocalCluster

from .conftest import WAIT_S, auth, make_cluster, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = make_cluster(tmp_path_factory.mktemp("queues"))
    yield cluster
    cluster.stop()


class Http:
    """JSON calls that follow 307 to the leader and retry 503 (no leader yet) and 504
    (outcome unknown: the tests' appends carry a producer id, queue commands may be repeated)."""

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session = session
        self.base = base

    async def call(
        self, method: str, path: str, body: Any = None, *, base: str | None = None
    ) -> tuple[int, Any]:
        url = (base or self.base) + path
        deadline = time.monotonic() + WAIT_S
        while True:
            async with self.session.request(
                method, url, json=body, allow_redirects=False
            ) as answer:
                status = answer.status
                document = await answer.json() if answer.content_length != 0 else None
                location = answer.headers.get("Location")
            if status == 307 and location:
                url = location
                continue
            if status in (503, 504) and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                url = (base or self.base) + path
                continue
            return status, document

    async def ok(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        status, document = await self.call(method, path, body, **kw)
        assert status in (200, 201), (method, path, status, document)
        return document


def group_path(topic: str, partition: int, group: str, action: str = "") -> str:
    path = f"/v1/topics/{topic}/partitions/{partition}/groups/{group}"
    return f"{path}/{action}" if action else path


async def create_topic(http: Http, topic: str, partitions: int, **config: Any) -> None:
    body = {"name": topic, "partitions": partitions, "replication_factor": 3, "config": config}
    await http.ok("POST", "/v1/topics", body)

    async def leaders() -> bool:
        described = await http.ok("GET", f"/v1/topics/{topic}")
        return all(p["leader"] and len(p["in_sync"]) == 3 for p in described["partition_states"])

    await wait_until(f"leaders of {topic}", leaders)


async def produce(http: Http, topic: str, partition: int, values: list[str]) -> list[int]:
    # idempotent: `Http` retries a 504, and an append answered 504 (its leader stepped down
    # before the commit) may still be committed by the next leader
    body = {
        "records": [{"value": v} for v in values],
        "producer_id": random.getrandbits(62) + 1,
        "sequence": 0,
    }
    answer = await http.ok("POST", f"/v1/topics/{topic}/partitions/{partition}/records", body)
    return list(range(answer["base_index"], answer["base_index"] + answer["count"]))


async def acquire(
    http: Http, topic: str, partition: int, group: str, consumer: str, **body: Any
) -> list[dict[str, Any]]:
    answer = await http.ok(
        "POST", group_path(topic, partition, group, "acquire"), {"consumer": consumer, **body}
    )
    assert answer["consumer"] == consumer
    return list(answer["messages"])


async def settle(
    http: Http,
    action: str,
    topic: str,
    partition: int,
    group: str,
    consumer: str,
    indexes: list[int],
    **extra: Any,
) -> dict[str, list[int]]:
    body = {"consumer": consumer, "indexes": indexes, **extra}
    return dict(await http.ok("POST", group_path(topic, partition, group, action), body))


# ---- 4 senders, 4 receivers ------------------------------------------------------------------


async def test_four_senders_four_receivers_get_every_message_exactly_once(
    cluster: LocalCluster,
) -> None:
    topic, group, partitions, per_sender = "work", "workers", 4, 400
    async with aiohttp.ClientSession(headers=auth(cluster)) as session:
        http = Http(session, cluster.urls[0])
        await create_topic(http, topic, partitions)
        sent: set[str] = set()
        accepted: Counter[str] = Counter()
        received: dict[str, list[tuple[int, int, int]]] = defaultdict(list)  # (p, sender, seq)
        done = asyncio.Event()

        async def sender(number: int) -> None:
            rng = random.Random(number)
            seq = 0
            while seq < per_sender:
                values = [f"{number}:{seq + i}" for i in range(rng.randint(1, 10))]
                values = values[: per_sender - seq]
                await produce(
                    Http(session, rng.choice(cluster.urls)),
                    topic,
                    rng.randrange(partitions),
                    values,
                )
                sent.update(values)
                seq += len(values)

        async def receiver(number: int) -> None:
            name = f"r{number}"
            own = Http(session, cluster.urls[number % len(cluster.urls)])
            deadline = time.monotonic() + 120
            while not done.is_set() and time.monotonic() < deadline:
                for partition in range(partitions):
                    messages = await acquire(
                        own, topic, partition, group, name, max=25, wait_ms=50, lease_ms=60_000
                    )
                    if not messages:
                        continue
                    for message in messages:
                        assert message["deliveries"] == 1, message  # nobody failed: no redelivery
                        sender_number, seq = map(int, message["value"].split(":"))
                        received[name].append((partition, sender_number, seq))
                    indexes = [m["index"] for m in messages]
                    result = await settle(own, "accept", topic, partition, group, name, indexes)
                    assert result == {"done": indexes, "refused": []}
                    accepted.update(m["value"] for m in messages)
                if len(accepted) == 4 * per_sender:
                    done.set()

        senders = [asyncio.create_task(sender(n)) for n in range(4)]
        receivers = [asyncio.create_task(receiver(n)) for n in range(4)]
        await asyncio.gather(*senders)
        await asyncio.wait_for(asyncio.gather(*receivers), 150)

        assert len(sent) == 4 * per_sender
        assert set(accepted) == sent, f"missing {len(sent - set(accepted))}"
        assert max(accepted.values()) == 1, [v for v, n in accepted.items() if n > 1][:5]
        assert all(received.values()), "every receiver got messages"
        for name, items in received.items():
            last: dict[tuple[int, int], int] = {}
            for partition, sender_number, seq in items:  # one producer's messages in order
                key = (partition, sender_number)
                assert seq > last.get(key, -1), f"{name} got {sender_number}:{seq} out of order"
                last[key] = seq
        total = 0
        for partition in range(partitions):
            described = await http.ok("GET", group_path(topic, partition, group))
            assert described["acquired"] == 0 and described["pending"] == 0, described
            total += described["accepted"]
        assert total == 4 * per_sender


# ---- release ---------------------------------------------------------------------------------


async def test_released_messages_can_be_acquired_through_any_broker(cluster: LocalCluster) -> None:
    topic, group = "released", "g"
    async with aiohttp.ClientSession(headers=auth(cluster)) as session:
        http = Http(session, cluster.urls[0])
        await create_topic(http, topic, 1)
        indexes = await produce(http, topic, 0, [f"m{i}" for i in range(5)])
        held = await acquire(http, topic, 0, group, "a", max=10, lease_ms=60_000)
        assert [m["index"] for m in held] == indexes
        for url in cluster.urls:  # held: nobody gets them, through any broker
            assert await acquire(Http(session, url), topic, 0, group, "b", max=10) == []
        result = await settle(http, "release", topic, 0, group, "a", indexes)
        assert result == {"done": indexes, "refused": []}
        # releasing again is harmless; accepting what you released is refused
        assert (await settle(http, "release", topic, 0, group, "a", indexes))["refused"] == []
        assert (await settle(http, "accept", topic, 0, group, "a", indexes))["refused"] == indexes
        taken = []
        for number, url in enumerate(cluster.urls):  # each broker hands out the next one
            consumer = f"on-{number}"
            got = await acquire(Http(session, url), topic, 0, group, consumer, max=1)
            assert [(m["index"], m["deliveries"]) for m in got] == [(indexes[number], 2)]
            taken.append((consumer, got[0]["index"]))
        for consumer, index in taken:
            await settle(http, "release", topic, 0, group, consumer, [index])
        got = await acquire(Http(session, cluster.urls[2]), topic, 0, group, "c", max=10)
        assert [m["index"] for m in got] == indexes
        assert [m["deliveries"] for m in got] == [3, 3, 3, 2, 2]
        assert [m["value"] for m in got] == [f"m{i}" for i in range(5)]


# ---- reject and max_deliveries ---------------------------------------------------------------


async def read_values(http: Http, topic: str, partition: int) -> list[dict[str, Any]]:
    answer = await http.ok("GET", f"/v1/topics/{topic}/partitions/{partition}/records?from=0")
    return list(answer["records"])


async def dead_letters(http: Http, topic: str, partition: int) -> list[dict[str, Any]]:
    """The records of `topic`'s dead-letter partition, once it holds any: the broker asked
    may be a follower, which learns of a commit a moment after the leader (docs/api.md)."""
    found: list[dict[str, Any]] = []

    async def readable() -> Any:
        found[:] = await read_values(http, f"{topic}.dlq", partition)
        return bool(found) or found

    await wait_until("the dead letter to be readable", readable)
    return found


async def dead_lettered(http: Http, topic: str, partition: int, group: str, count: int) -> None:
    async def moved() -> Any:
        described = await http.ok("GET", group_path(topic, partition, group))
        done = described["dead_lettered"] == count and described["dead_letter_pending"] == 0
        return True if done else described

    await wait_until("the dead-letter append", moved)


async def test_rejected_message_is_dead_lettered_exactly_once(cluster: LocalCluster) -> None:
    topic, group = "orders", "billing"
    async with aiohttp.ClientSession(headers=auth(cluster)) as session:
        http = Http(session, cluster.urls[1])
        await create_topic(http, topic, 2)
        indexes = await produce(http, topic, 1, ["good-1", "poison", "good-2"])
        got = await acquire(http, topic, 1, group, "a", max=3)
        assert [m["value"] for m in got] == ["good-1", "poison", "good-2"]
        poison = indexes[1]
        result = await settle(http, "reject", topic, 1, group, "a", [poison], reason="unparseable")
        assert result == {"done": [poison], "refused": []}
        await settle(http, "accept", topic, 1, group, "a", [indexes[0], indexes[2]])
        # rejecting again is harmless
        again = await settle(http, "reject", topic, 1, group, "a", [poison], reason="unparseable")
        assert again == {"done": [poison], "refused": []}
        await dead_lettered(http, topic, 1, group, 1)
        records = await dead_letters(http, topic, 1)
        assert len(records) == 1
        (record,) = records
        assert record["value"] == "poison"
        assert record["headers"] == {
            "laminar.dlq.topic": topic,
            "laminar.dlq.partition": "1",
            "laminar.dlq.index": str(poison),
            "laminar.dlq.group": group,
            "laminar.dlq.reason": "unparseable",
            "laminar.dlq.deliveries": "1",
        }
        described = await http.ok("GET", f"/v1/topics/{topic}.dlq")
        assert described["partitions"] == 2
        assert await acquire(http, topic, 1, group, "b", max=10, wait_ms=500) == []
        assert await read_values(http, f"{topic}.dlq", 0) == []
        leader_url = (await http.ok("GET", f"/v1/topics/{topic}"))["partition_states"][1][
            "leader_url"
        ]
        async with session.get(leader_url + "/metrics") as answer:
            text = await answer.text()
        labels = f'group="{group}",partition="1",topic="{topic}"'
        assert f"laminar_group_dead_lettered_total{{{labels}}} 1.0" in text
        assert f"laminar_group_accepted_total{{{labels}}} 2.0" in text


async def test_a_reject_after_the_lease_ended_is_refused_and_the_message_comes_again(
    cluster: LocalCluster,
) -> None:
    topic, group = "late", "g"
    async with aiohttp.ClientSession(headers=auth(cluster)) as session:
        http = Http(session, cluster.urls[0])
        await create_topic(http, topic, 1)
        (index,) = await produce(http, topic, 0, ["slow-job"])
        first = await acquire(http, topic, 0, group, "a", max=1, lease_ms=500)
        assert [(m["index"], m["deliveries"]) for m in first] == [(index, 1)]

        async def lease_ended() -> Any:
            described = await http.ok("GET", group_path(topic, 0, group))
            return True if described["acquired"] == 0 else described

        await wait_until("the leader to expire a's lease", lease_ended)
        late = await settle(http, "reject", topic, 0, group, "a", [index], reason="too late")
        assert late == {"done": [], "refused": [index]}
        # not lost: delivered again, and its new holder's reject dead-letters it once
        second = await acquire(http, topic, 0, group, "b", max=1, lease_ms=60_000)
        assert [(m["index"], m["deliveries"]) for m in second] == [(index, 2)]
        result = await settle(http, "reject", topic, 0, group, "b", [index], reason="poison")
        assert result == {"done": [index], "refused": []}
        await dead_lettered(http, topic, 0, group, 1)
        again = await settle(http, "reject", topic, 0, group, "a", [index], reason="too late")
        assert again == {"done": [], "refused": [index]}
        records = await dead_letters(http, topic, 0)
        assert [(r["value"], r["headers"]["laminar.dlq.index"]) for r in records] == [
            ("slow-job", str(index))
        ]
        assert records[0]["headers"]["laminar.dlq.reason"] == "poison"
        assert records[0]["headers"]["laminar.dlq.deliveries"] == "2"
        described = await http.ok("GET", group_path(topic, 0, group))
        counts = [described[key] for key in ("dead_lettered", "accepted", "acquired")]
        assert counts == [1, 0, 0], described


async def test_max_deliveries_dead_letters_a_message_nobody_finishes(
    cluster: LocalCluster,
) -> None:
    topic, group = "flaky", "g"
    async with aiohttp.ClientSession(headers=auth(cluster)) as session:
        http = Http(session, cluster.urls[2])
        await create_topic(http, topic, 1, max_deliveries=2)
        (index,) = await produce(http, topic, 0, ["never-finished"])
        first = await acquire(http, topic, 0, group, "a", max=1, lease_ms=300)
        assert [m["deliveries"] for m in first] == [1]
        # a's lease runs out (a consumer that died): redelivered, count 2
        second = await acquire(http, topic, 0, group, "b", max=1, lease_ms=60_000, wait_ms=5000)
        assert [(m["index"], m["deliveries"]) for m in second] == [(index, 2)]
        await settle(http, "release", topic, 0, group, "b", [index])
        await dead_lettered(http, topic, 0, group, 1)
        (record,) = await dead_letters(http, topic, 0)
        assert record["headers"]["laminar.dlq.reason"] == "max_deliveries"
        assert record["headers"]["laminar.dlq.deliveries"] == "2"
        assert await acquire(http, topic, 0, group, "c", max=1, wait_ms=300) == []


# ---- bad input -------------------------------------------------------------------------------


async def test_bad_queue_requests_get_clear_errors_and_change_nothing(
    cluster: LocalCluster,
) -> None:
    topic, group = "strict", "g"
    async with aiohttp.ClientSession(headers=auth(cluster)) as session:
        http = Http(session, cluster.urls[0])
        await create_topic(http, topic, 1)
        await produce(http, topic, 0, ["a", "b"])
        held = await acquire(http, topic, 0, group, "owner", max=1, lease_ms=60_000)
        before = await http.ok("GET", group_path(topic, 0, group))
        acquire_path = group_path(topic, 0, group, "acquire")
        accept_path = group_path(topic, 0, group, "accept")
        bad: list[tuple[str, Any, str]] = [
            (acquire_path, {"max": 0}, "max"),
            (acquire_path, {"max": 10_001}, "max"),
            (acquire_path, {"lease_ms": 0}, "lease_ms"),
            (acquire_path, {"wait_ms": -1}, "wait_ms"),
            (acquire_path, {"consumer": "no spaces"}, "consumer"),
            (acquire_path, {"maximum": 3}, "unknown"),
            (acquire_path, [1, 2], "object"),
            (accept_path, {"indexes": [held[0]["index"]]}, "consumer"),
            (accept_path, {"consumer": "owner", "indexes": []}, "indexes"),
            (accept_path, {"consumer": "owner", "indexes": ["1"]}, "indexes"),
            (accept_path, {"consumer": "owner", "indexes": [-1]}, "indexes"),
            (
                group_path(topic, 0, group, "reject"),
                {"consumer": "owner", "indexes": [1], "reason": ""},
                "reason",
            ),
            (group_path(topic, 0, "bad group!", "acquire"), {}, "group"),
        ]
        for path, body, word in bad:
            status, document = await http.call("POST", path, body)
            assert status == 400, (path, body, status, document)
            assert word in document["error"]["message"], document
        status, document = await http.call("POST", group_path("nope", 0, group, "acquire"), {})
        assert status == 404
        status, document = await http.call("POST", group_path(topic, 5, group, "acquire"), {})
        assert status == 404
        async with session.post(
            cluster.urls[0] + acquire_path, data=b"max=1", allow_redirects=False
        ) as answer:
            assert answer.status in (307, 415)
        assert await http.ok("GET", group_path(topic, 0, group)) == before


# ---- kill -9 of the partition leader -----------------------------------------------------------


async def test_a_lease_holds_across_a_leader_kill_then_expires(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path / "lease")
    topic, group, lease_ms = "leased", "g", 8000
    try:
        async with aiohttp.ClientSession(headers=auth(cluster)) as session:
            http = Http(session, cluster.urls[0])
            await create_topic(http, topic, 1)
            indexes = await produce(http, topic, 0, [f"m{i}" for i in range(10)])
            held = await acquire(http, topic, 0, group, "a", max=10, lease_ms=lease_ms)
            deadline_ms = held[0]["lease_deadline_ms"]
            assert [m["index"] for m in held] == indexes
            leader = (await http.ok("GET", f"/v1/topics/{topic}"))["partition_states"][0]["leader"]
            cluster.kill(leader)
            survivors = [Http(session, n.api_url) for n in cluster.nodes.values() if n.id != leader]

            async def new_leader() -> Any:
                described = await survivors[0].ok("GET", f"/v1/topics/{topic}")
                now = described["partition_states"][0]["leader"]
                return True if now not in (None, leader) else now

            await wait_until("a new leader", new_leader)
            # the new leader knows a's lease: nobody else gets the messages while it holds
            tries = 0
            while time.time() * 1000 < deadline_ms - 1000:
                for survivor in survivors:
                    assert await acquire(survivor, topic, 0, group, "b", max=10) == []
                    tries += 1
                await asyncio.sleep(0.2)
            assert tries > 0, "the failover took longer than the lease; lengthen the lease"
            # after it runs out, they come back, counted as a second delivery
            got: list[dict[str, Any]] = []
            while len(got) < len(indexes):
                more = await acquire(survivors[1], topic, 0, group, "b", max=10, wait_ms=5000)
                assert more, "the expired messages did not come back"
                got.extend(more)
            assert sorted(m["index"] for m in got) == indexes
            assert {m["deliveries"] for m in got} == {2}
            # a's accept after its lease ran out is refused: b holds them now
            late = await settle(survivors[0], "accept", topic, 0, group, "a", indexes)
            assert late["refused"] == indexes
            # the killed broker comes back and applies the same state from its log
            cluster.start_node(leader)
            cluster.wait_ready([leader])
            done = await settle(survivors[0], "accept", topic, 0, group, "b", indexes)
            assert done == {"done": indexes, "refused": []}
            described = await survivors[0].ok("GET", group_path(topic, 0, group))
            assert described["accepted"] == 10 and described["acquired"] == 0
    finally:
        cluster.stop()


# ---- the client's group consumer and the CLI ---------------------------------------------------


async def test_group_consumer_works_through_every_partition_renews_and_rejects(
    cluster: LocalCluster,
) -> None:
    from laminar.client import AsyncClient, GroupConsumer, Producer

    topic, group, count = "jobs", "runners", 300
    async with AsyncClient(cluster.urls, token=cluster.token, timeout_s=20) as client:
        await client.create_topic(topic, partitions=3, replication_factor=3)
        await client.wait_for_leaders(topic)
        async with Producer(client, topic) as producer:
            for n in range(count):
                name = f"job-{n}" + ("-bad" if n % 50 == 7 else "")
                await producer.send(name.encode(), key=str(n).encode())
        seen: Counter[str] = Counter()
        slow_deliveries: list[int] = []
        consumer = GroupConsumer(client, topic, group, lease_ms=1500, wait_ms=200)

        async def handle(delivery: Any) -> None:
            value = delivery.value.decode()
            seen[value] += 1
            if value == "job-3":  # outlives its lease twice over: renewals keep it ours
                slow_deliveries.append(delivery.deliveries)
                await asyncio.sleep(3.5)
            if value.endswith("-bad"):
                raise ValueError("cannot run " + value)
            if sum(seen.values()) >= count:
                asyncio.get_running_loop().call_soon(asyncio.ensure_future, consumer.close())

        async with consumer:
            await asyncio.wait_for(consumer.run(handle, concurrency=8), 120)
        assert len(seen) == count and max(seen.values()) == 1, seen.most_common(3)
        assert slow_deliveries == [1]
        bad = [f"job-{n}-bad" for n in range(7, count, 50)]
        totals: Counter[str] = Counter()
        for partition in range(3):
            described = await client.describe_group(topic, partition, group)
            totals.update(accepted=described.accepted, dead=described.dead_lettered)
            assert described.acquired == 0 and described.pending == 0
        assert totals == {"accepted": count - len(bad), "dead": len(bad)}
        dead: list[str] = []
        for partition in range(3):
            result = await client.read(f"{topic}.dlq", partition, 0, max_records=1000)
            for record in result.records:
                reason = dict(record.headers)["laminar.dlq.reason"].decode()
                assert reason.startswith("ValueError: cannot run")
                dead.append((record.value or b"").decode())
        assert sorted(dead) == sorted(bad)


def test_queue_cli_consumes_and_describes(cluster: LocalCluster) -> None:
    import json
    import subprocess
    import sys

    topic, group = "cli-queue", "ops"

    def laminar(*args: str, stdin: str = "") -> str:
        command = [sys.executable, "-m", "laminar", *args, "--brokers", ",".join(cluster.urls)]
        command += ["--token-file", str(cluster.token_file)]
        result = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout

    laminar("topic", "create", topic, "--partitions", "1", "--replication-factor", "3")
    laminar("produce", topic, "--partition", "0", stdin="a\nb\nc\n")
    first = laminar("queue", "consume", topic, group, "--count", "2", "--json", "--wait-ms", "5000")
    values = [json.loads(line)["value"] for line in first.splitlines()]
    assert values == ["a", "b"]
    described = json.loads(laminar("queue", "describe", topic, group, "--json"))
    (partition,) = described["partitions"]
    assert (partition["accepted"], partition["pending"], partition["acquired"]) == (2, 1, 0)
    rejected = laminar("queue", "consume", topic, group, "--count", "1", "--reject", "--json")
    assert [json.loads(line)["value"] for line in rejected.splitlines()] == ["c"]
