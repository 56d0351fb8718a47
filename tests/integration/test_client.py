"""The Python client against three real broker processes (the `cluster3` fixture of
tests/integration/conftest.py: an object whose `.urls` are the brokers' API base URLs, and, if
the cluster runs with a token, `.token`; the token test uses `secured_cluster`, brokers that
require `.token`).

Covers the contract of docs/api.md as the client sees it: topic administration, producing 10k
keyed records with the Producer and consuming them back in order per partition, idempotent
appends (the same producer id and sequence twice → `duplicate`, same `base_index`), 307
redirects followed with the body, reads served by followers, and every error status mapped
to its exception class.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from typing import Any

import aiohttp
import pytest

from laminar.client import (
    AsyncClient,
    BadRequest,
    Client,
    Conflict,
    Consumer,
    NodeTls,
    NotFound,
    OutOfRange,
    PayloadTooLarge,
    Producer,
    Record,
    RecordMetadata,
    StoredRecord,
    TopicDescription,
    Unauthorized,
    partition_for,
)
from laminar.contract import METADATA_INDEX_HEADER
from laminar.log.batch import encode_batch

pytestmark = pytest.mark.integration

BATCH = "application/vnd.laminar.batch"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def client_for(cluster3: Any, urls: list[str] | None = None, **kwargs: Any) -> AsyncClient:
    return AsyncClient(urls or cluster3.urls, token=getattr(cluster3, "token", None), **kwargs)


def auth(cluster3: Any) -> dict[str, str]:
    token = getattr(cluster3, "token", None)
    return {"Authorization": f"Bearer {token}"} if token else {}


async def ready_topic(
    client: AsyncClient,
    name: str,
    partitions: int = 1,
    timeout_s: float = 30,
    config: dict[str, Any] | None = None,
) -> TopicDescription:
    """Create `name` and wait until every partition has a leader and 3 in-sync replicas."""
    await client.create_topic(name, partitions=partitions, replication_factor=3, config=config)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        description = await client.describe_topic(name)
        states = description.partition_states
        if len(states) == partitions and all(
            s.leader and s.leader_url and len(s.in_sync) == 3 for s in states
        ):
            return description
        assert loop.time() < deadline, f"partitions of {name} got no leader: {description}"
        await asyncio.sleep(0.1)


async def consume(consumer: Consumer, count: int) -> list[tuple[int, StoredRecord]]:
    got: list[tuple[int, StoredRecord]] = []
    async for item in consumer:
        got.append(item)
        if len(got) == count:
            break
    return got


async def test_topic_administration(cluster3: Any) -> None:
    async with client_for(cluster3) as client:
        cluster = await client.cluster()
        assert sorted(m.api_url.rstrip("/") for m in cluster.members) == sorted(
            u.rstrip("/") for u in cluster3.urls
        )
        assert all(m.state == "alive" and m.weight >= 1 for m in cluster.members)
        assert cluster.metadata_leader in {m.id for m in cluster.members}

        name = unique("admin")
        description = await ready_topic(client, name, partitions=3)
        assert (description.name, description.partitions, description.replication_factor) == (
            name,
            3,
            3,
        )
        for state in description.partition_states:
            assert len(state.replicas) == 3 and state.leader in state.replicas
            assert 0 <= state.log_start <= state.log_end
            assert state.commit_index < state.log_end
        assert name in {t.name for t in await client.topics()}

        with pytest.raises(Conflict):
            await client.create_topic(name)
        grown = await client.alter_topic(name, partitions=4, config={"retention_ms": 3_600_000})
        assert grown.partitions == 4
        assert grown.config.get("retention_ms") == 3_600_000
        with pytest.raises(BadRequest):
            await client.alter_topic(name, partitions=2)  # partitions may only grow

        hosted = await client.node_partitions(cluster.members[0].id)
        assert hosted.node_id == cluster.members[0].id
        assert {p.partition for p in hosted.partitions if p.topic == name} <= {0, 1, 2, 3}
        for member in cluster.members:  # forwarded to each; no TLS here (test_tls: with)
            assert await client.node_tls(member.id) == NodeTls(member.id, enabled=False)
        with pytest.raises(NotFound):
            await client.node_tls("n99")

        described = await client.wait_for_leaders(name)  # (the partitions just added)
        table = [p for p in await client.partitions() if p.topic == name]
        assert [p.partition for p in table] == [0, 1, 2, 3]
        assert [p.partition for p in await client.partitions(name)] == [0, 1, 2, 3]
        for row, state in zip(table, described.partition_states, strict=True):
            assert (row.leader, row.replicas) == (state.leader, state.replicas)
            assert row.term is not None and row.term >= 1 and row.leader is not None
        with pytest.raises(NotFound):
            await client.partitions("no-such-topic")

        await client.delete_topic(name)
        with pytest.raises(NotFound):
            await client.describe_topic(name)
        with pytest.raises(NotFound):
            await client.delete_topic(name)


async def test_node_admin_round_trip(cluster3: Any) -> None:
    async with client_for(cluster3) as client:
        node = (await client.cluster()).members[-1].id
        weight = await client.set_weight(node, 1)
        assert (weight.node, weight.weight) == (node, 1)
        drained = await client.drain(node)
        assert (drained.node, drained.draining) == (node, True)
        undrained = await client.undrain(node)
        assert (undrained.node, undrained.draining, undrained.weight) == (node, False, 1)
        member = (await client.cluster()).member(node)
        assert member is not None and not member.draining


async def test_every_broker_shows_a_client_its_own_metadata_writes(cluster3: Any) -> None:
    """Read-your-writes (docs/api.md): a drain, then an undrain, acknowledged by the metadata
    leader, read back at once from each broker with the index the client saw (a follower not
    there yet waits); an index no broker has reached is 503, a malformed one 400."""
    async with client_for(cluster3) as client, aiohttp.ClientSession() as session:
        node = (await client.cluster()).members[-1].id

        async def member_on(url: str) -> dict[str, Any]:
            headers = {**auth(cluster3), METADATA_INDEX_HEADER: str(client.metadata_index)}
            async with session.get(f"{url}/v1/cluster", headers=headers) as answer:
                assert answer.status == 200, await answer.text()
                assert int(answer.headers[METADATA_INDEX_HEADER]) >= client.metadata_index
                body = await answer.json()
            return next(m for m in body["members"] if m["id"] == node)

        for _ in range(3):
            await client.drain(node)
            for url in cluster3.urls:
                assert (await member_on(url))["draining"] is True, url
            await client.undrain(node)
            for url in cluster3.urls:
                assert (await member_on(url))["draining"] is False, url

        ahead = str(client.metadata_index + 1_000_000)
        for value, status in ((ahead, 503), ("x1", 400), ("\u00b2", 400), ("9" * 20, 400)):
            headers = {**auth(cluster3), METADATA_INDEX_HEADER: value}
            async with session.get(f"{cluster3.urls[0]}/v1/cluster", headers=headers) as answer:
                assert answer.status == status, (value, await answer.text())
                assert (await answer.json())["error"]["code"] in ("unavailable", "bad_request")


async def test_produce_and_consume_10k_keyed_records_in_order(cluster3: Any) -> None:
    async with client_for(cluster3) as client:
        name = unique("keyed")
        await ready_topic(client, name, partitions=6)
        keys = [f"key-{k}".encode() for k in range(101)]
        sent: list[tuple[bytes, bytes, asyncio.Future[RecordMetadata]]] = []
        counters: dict[bytes, int] = defaultdict(int)
        async with Producer(client, name, linger_ms=5, max_batch_bytes=64 << 10) as producer:
            for i in range(10_000):
                key = keys[i % len(keys)]
                value = b"%s:%d" % (key, counters[key])
                counters[key] += 1
                sent.append((key, value, await producer.send(value, key=key)))
        where: dict[tuple[int, int], tuple[bytes, bytes]] = {}
        for key, value, future in sent:
            meta = future.result()
            assert meta.partition == partition_for(key, 6)
            where[(meta.partition, meta.index)] = (key, value)
        assert len(where) == 10_000  # no two records at one index

        async with Consumer(client, name, start="earliest", wait_ms=500) as consumer:
            got = await asyncio.wait_for(consume(consumer, 10_000), timeout=90)
            positions = consumer.positions()
        last: dict[int, int] = {}
        seen_per_key: dict[bytes, int] = defaultdict(int)
        for partition, record in got:
            assert record.index > last.get(partition, 0)  # in order per partition
            last[partition] = record.index
            assert where[(partition, record.index)] == (record.key, record.value)
            assert record.key is not None
            assert record.value == b"%s:%d" % (record.key, seen_per_key[record.key])
            seen_per_key[record.key] += 1
        assert seen_per_key == counters
        for partition, index in last.items():
            assert positions[partition] == index + 1


async def test_idempotent_appends_are_deduplicated(cluster3: Any) -> None:
    async with client_for(cluster3) as client:
        name = unique("idem")
        await ready_topic(client, name)
        producer_id = 7_000_000_000 + uuid.uuid4().int % 1_000_000
        batch = encode_batch(
            [Record(b"a", key=b"k"), Record(b"b"), Record(b"c")],
            producer_id=producer_id,
            producer_seq=0,
        )
        first = await client.append(name, 0, batch)
        assert (first.count, first.duplicate) == (3, False)
        again = await client.append(name, 0, batch)
        assert (again.base_index, again.count, again.duplicate) == (first.base_index, 3, True)

        records = [Record(b"d"), Record(b"e")]
        second = await client.append(name, 0, records, producer_id=producer_id, sequence=3)
        assert (second.base_index, second.duplicate) == (first.base_index + 3, False)
        repeat = await client.append(name, 0, records, producer_id=producer_id, sequence=3)
        assert (repeat.base_index, repeat.duplicate) == (second.base_index, True)
        with pytest.raises(Conflict):  # below the next expected and not a remembered batch
            await client.append(name, 0, [Record(b"x")], producer_id=producer_id, sequence=1)

        plain = await client.append(name, 0, [Record(b"f")])
        assert plain.base_index == second.base_index + 2 and not plain.duplicate

        result = await client.read(name, 0, first.base_index)
        assert [r.value for r in result.records] == [b"a", b"b", b"c", b"d", b"e", b"f"]
        assert [r.index for r in result.records] == list(
            range(first.base_index, first.base_index + 6)
        )
        assert result.records[0].key == b"k"
        assert result.next_index == first.base_index + 6
        assert result.commit_index >= first.base_index + 5
        part = await client.read(name, 0, first.base_index + 1, max_records=2)
        assert [r.value for r in part.records] == [b"b", b"c"]
        assert part.next_index == first.base_index + 3


async def test_the_client_follows_a_redirect_with_the_body(cluster3: Any) -> None:
    async with client_for(cluster3) as client:
        name = unique("redirect")
        description = await ready_topic(client, name)
        leader_url = (description.partition_states[0].leader_url or "").rstrip("/")
        follower = next(u.rstrip("/") for u in cluster3.urls if u.rstrip("/") != leader_url)

        async with aiohttp.ClientSession() as session:
            path = f"/v1/topics/{name}/partitions/0/records"
            body = encode_batch([Record(b"raw")])
            async with session.post(
                follower + path,
                data=body,
                headers={"Content-Type": BATCH, **auth(cluster3)},
                allow_redirects=False,
            ) as response:
                assert response.status == 307
                assert response.headers["Location"].startswith(leader_url + path)
                error = (await response.json())["error"]
                assert error["code"] == "not_leader"
                assert error["leader_url"].rstrip("/") == leader_url

        # Point the client's leader cache at the follower: it must follow the 307 (re-sending
        # the body) and learn the real leader from it.
        client._leaders[(name, 0)] = follower
        result = await client.append(name, 0, [Record(b"via a follower")])
        assert result.count == 1
        assert client._leaders[(name, 0)] == leader_url
        only_follower = client_for(cluster3, [follower])
        async with only_follower:
            again = await only_follower.append(name, 0, [Record(b"bootstrap on a follower")])
        assert again.base_index == result.base_index + 1


async def test_every_in_sync_replica_serves_reads(cluster3: Any) -> None:
    async with client_for(cluster3) as client:
        name = unique("replicas")
        await ready_topic(client, name)
        written = await client.append(name, 0, [Record(b"r%d" % i) for i in range(5)])
        last = written.base_index + written.count - 1
        cluster = await client.cluster()
        urls = {m.id: m.api_url.rstrip("/") for m in cluster.members}
        state = (await client.describe_topic(name)).partition_states[0]
        async with aiohttp.ClientSession() as session:
            for node in state.in_sync:
                deadline = asyncio.get_running_loop().time() + 10
                while True:  # a follower learns the commit index a moment later
                    async with session.get(
                        f"{urls[node]}/v1/topics/{name}/partitions/0/records",
                        params={"from": str(written.base_index), "wait_ms": "1000"},
                        headers={"Accept": BATCH, **auth(cluster3)},
                        allow_redirects=False,
                    ) as response:
                        assert response.status == 200, node
                        commit = int(response.headers["Laminar-Commit-Index"])
                        assert int(response.headers["Laminar-Log-Start"]) >= 0
                        assert int(response.headers["Laminar-Next-Index"]) > written.base_index
                    if commit >= last:
                        break
                    assert asyncio.get_running_loop().time() < deadline, node
        result = await client.read(name, 0, written.base_index)
        assert [r.value for r in result.records] == [b"r%d" % i for i in range(5)]


async def test_consumer_latest_seek_and_positions(cluster3: Any) -> None:
    async with client_for(cluster3) as client:
        name = unique("latest")
        await ready_topic(client, name, partitions=2)
        before = await client.append(name, 1, [Record(b"old")])
        while True:  # "latest" starts after the commit index that describe_topic shows
            state = (await client.describe_topic(name)).partition(1)
            if state is not None and state.commit_index >= before.base_index:
                break
            await asyncio.sleep(0.05)
        async with Consumer(client, name, start="latest", wait_ms=200) as consumer:
            assert consumer.positions()[1] == before.base_index + 1
            new = await client.append(name, 1, [Record(b"new")])
            partition, record = await asyncio.wait_for(consumer.__anext__(), timeout=10)
            assert (partition, record.index, record.value) == (1, new.base_index, b"new")
            consumer.seek(1, before.base_index)
            partition, record = await asyncio.wait_for(consumer.__anext__(), timeout=10)
            assert (partition, record.value) == (1, b"old")
            assert consumer.positions()[1] == before.base_index + 1
        async with Consumer(client, name, [1], start={1: new.base_index}) as consumer:
            partition, record = await asyncio.wait_for(consumer.__anext__(), timeout=10)
            assert record.value == b"new"
            assert consumer.partitions == [1]
            waiting = asyncio.ensure_future(consumer.__anext__())  # nothing more to read
            await asyncio.sleep(0.3)
        with pytest.raises(StopAsyncIteration):  # closing ends a waiting iteration
            await asyncio.wait_for(waiting, timeout=5)


async def test_errors_map_to_exception_classes(cluster3: Any) -> None:
    async with client_for(cluster3, timeout_s=10) as client:
        missing = unique("missing")
        with pytest.raises(NotFound) as not_found:
            await client.describe_topic(missing)
        assert (not_found.value.status, not_found.value.code) == (404, "not_found")
        with pytest.raises(NotFound):
            await client.append(missing, 0, [Record(b"v")])
        with pytest.raises(NotFound):
            await client.read(missing, 0)
        with pytest.raises(NotFound):
            await client.drain(unique("no-such-node"))

        name = unique("errors")
        await ready_topic(client, name)
        with pytest.raises(NotFound):
            await client.append(name, 99, [Record(b"v")])

        # retention removes whole old segments: reads below the new log start get 416
        retained = unique("retained")
        await ready_topic(client, retained, config={"segment_bytes": 4096, "retention_bytes": 4096})
        for _ in range(40):
            await client.append(retained, 0, [Record(b"r" * 1000)])
        for _ in range(100):
            state = (await client.describe_topic(retained)).partition_states[0]
            if state.log_start > 0:
                break
            await asyncio.sleep(0.1)
        assert state.log_start > 0, state
        with pytest.raises(OutOfRange) as out_of_range:
            await client.read(retained, 0, 0)
        assert out_of_range.value.status == 416
        assert out_of_range.value.log_start is not None and out_of_range.value.log_start > 0
        after = await client.read(retained, 0, out_of_range.value.log_start)
        assert after.records and after.records[0].index >= out_of_range.value.log_start
        with pytest.raises(BadRequest):
            await client.read(name, 0, -1)
        with pytest.raises(BadRequest):
            await client.read(name, 0, 1, max_records=0)

        with pytest.raises(BadRequest):
            await client.create_topic("bad name!")
        with pytest.raises(BadRequest):
            await client.create_topic(unique("zero"), partitions=0)
        with pytest.raises(BadRequest):
            await client.set_weight((await client.cluster()).members[0].id, -1)

        corrupt = bytearray(encode_batch([Record(b"payload")]))
        corrupt[-1] ^= 0xFF  # the checksum no longer matches
        with pytest.raises(BadRequest) as bad_batch:
            await client.append(name, 0, bytes(corrupt))
        assert bad_batch.value.code == "corrupt_batch"


async def test_a_wrong_or_missing_token_is_unauthorized(secured_cluster: Any) -> None:
    """`secured_cluster` (tests/integration/conftest.py): brokers run with `.token`."""
    token = secured_cluster.token
    async with AsyncClient(secured_cluster.urls, timeout_s=5) as anonymous:
        with pytest.raises(Unauthorized) as info:
            await anonymous.topics()
        assert (info.value.status, info.value.code) == (401, "unauthorized")
    async with AsyncClient(secured_cluster.urls, token=token + "x", timeout_s=5) as wrong:
        with pytest.raises(Unauthorized):
            await wrong.cluster()
    async with AsyncClient(secured_cluster.urls, token=token, timeout_s=10) as right:
        assert (await right.cluster()).members


async def test_a_batch_over_the_request_limit_is_payload_too_large(cluster3: Any) -> None:
    async with client_for(cluster3, timeout_s=20) as client:
        name = unique("big")
        await ready_topic(client, name)
        with pytest.raises(PayloadTooLarge):  # default --max-request-bytes is 8 MiB
            await client.append(name, 0, [Record(b"x" * (9 << 20))])


def test_the_sync_client(cluster3: Any) -> None:
    with Client(cluster3.urls, token=getattr(cluster3, "token", None)) as client:
        name = unique("sync")
        client.create_topic(name, partitions=2, replication_factor=3)
        metas = client.produce(name, [b"one", "two", Record(b"three", key=b"k")], partition=1)
        assert [m.partition for m in metas] == [1, 1, 1]
        assert [m.index for m in metas] == list(range(metas[0].index, metas[0].index + 3))
        result = client.read(name, 1, metas[0].index)
        assert [r.value for r in result.records] == [b"one", b"two", b"three"]
        with client.producer(name, linger_ms=1) as producer:
            future = producer.send(b"four", key=b"k")
        assert future.result(timeout=30).partition == partition_for(b"k", 2)
        client.delete_topic(name)


def test_closing_the_sync_client_cancels_calls_in_flight(cluster3: Any) -> None:
    client = Client(cluster3.urls, token=getattr(cluster3, "token", None))
    name = unique("close")
    client.create_topic(name, partitions=1, replication_factor=3)
    # a long poll far past the end: still waiting when the client closes
    past = client.describe_topic(name).partition_states[0].commit_index + 1000
    waiting = client.submit(client.async_client.read(name, 0, past, wait_ms=60_000))
    client.close()
    assert waiting.cancelled()
    with Client(cluster3.urls, token=getattr(cluster3, "token", None)) as admin:
        admin.delete_topic(name)
