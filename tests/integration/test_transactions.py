"""Transactions against three real broker processes (docs/transactions.md): records of one
transaction across topics become visible to read_committed readers and consumer groups
together at its commit, never if it aborts; a restarted transactional id fences its old
instance; a transaction left open is aborted at its timeout; bad requests change nothing."""

from __future__ import annotations

import time
import uuid

import aiohttp
import pytest

from laminar.client import AsyncClient, Conflict, GroupConsumer, Record
from laminar.client.errors import BadRequest, NotFound
from laminar.contract import METADATA_INDEX_HEADER
from laminar.local_cluster import LocalCluster
from laminar.log.batch import encode_batch
from laminar.txn.producer import TxnProducer

from .conftest import auth, wait_until

pytestmark = pytest.mark.integration

WAIT_S = 30.0


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def topics(client: AsyncClient, *names: str, partitions: int = 2) -> None:
    for name in names:
        await client.create_topic(name, partitions=partitions, replication_factor=3)
        await client.wait_for_leaders(name)


async def values(
    client: AsyncClient, topic: str, partition: int, *, isolation: str = "read_committed"
) -> list[bytes | None]:
    read = await client.read(topic, partition, 0, isolation=isolation)
    return [r.value for r in read.records]


async def test_a_commit_shows_every_partitions_records_together(cluster3: LocalCluster) -> None:
    orders, audit = unique("orders"), unique("audit")
    async with AsyncClient(cluster3.urls, token=cluster3.token) as client:
        await topics(client, orders, audit)
        async with client.transaction(unique("billing")) as tx:
            await tx.append(orders, 0, [Record(b"o1"), Record(b"o2")])
            await tx.append(audit, 1, [Record(b"a1")])
            await tx.append(orders, 0, [Record(b"o3")])
            # open: read_uncommitted sees them, read_committed and the groups do not
            assert await values(client, orders, 0, isolation="read_uncommitted") == [
                b"o1", b"o2", b"o3"
            ]  # fmt: skip
            assert await values(client, orders, 0) == []
            assert await values(client, audit, 1) == []
            acquired = await client.acquire(orders, 0, "workers", max_messages=10)
            assert acquired.messages == []
        assert tx.ended is not None and tx.ended.committed and tx.ended.complete
        assert await values(client, orders, 0) == [b"o1", b"o2", b"o3"]
        assert await values(client, audit, 1) == [b"a1"]
        acquired = await client.acquire(orders, 0, "workers", max_messages=10)
        assert [m.value for m in acquired.messages] == [b"o1", b"o2", b"o3"]


async def test_an_abort_hides_its_records_from_readers_and_groups_for_good(
    cluster3: LocalCluster,
) -> None:
    topic = unique("aborted")
    async with AsyncClient(cluster3.urls, token=cluster3.token) as client:
        await topics(client, topic, partitions=1)
        producer = await client.transactional_producer(unique("t"))
        with pytest.raises(RuntimeError, match="boom"):
            async with producer.transaction() as tx:
                await tx.append(topic, 0, [Record(b"never")])
                raise RuntimeError("boom")
        assert tx.ended is not None and not tx.ended.committed
        await client.append(topic, 0, [Record(b"plain")])
        async with producer.transaction() as tx:  # the next one, with the next epoch
            await tx.append(topic, 0, [Record(b"kept")])
        assert await values(client, topic, 0) == [b"plain", b"kept"]
        assert await values(client, topic, 0, isolation="read_uncommitted") == [
            b"never", b"plain", b"kept"
        ]  # fmt: skip
        acquired = await client.acquire(topic, 0, "g", max_messages=10)
        assert [m.value for m in acquired.messages] == [b"plain", b"kept"]


async def test_a_restarted_transactional_id_fences_its_old_instance(
    cluster3: LocalCluster,
) -> None:
    topic, txn_id = unique("fence"), unique("t")
    async with AsyncClient(cluster3.urls, token=cluster3.token) as client:
        await topics(client, topic, partitions=1)
        zombie = await client.transactional_producer(txn_id)
        old = zombie.transaction()
        await old.__aenter__()
        await old.append(topic, 0, [Record(b"zombie")])
        successor = await client.transactional_producer(txn_id)  # aborts the open one
        assert TxnProducer.of(successor.producer_id).epoch > TxnProducer.of(old.producer_id).epoch
        with pytest.raises(Conflict):
            await old.append(topic, 0, [Record(b"late")])
        with pytest.raises(Conflict):
            await old.commit()
        async with successor.transaction() as tx:
            await tx.append(topic, 0, [Record(b"successor")])
        assert await values(client, topic, 0) == [b"successor"]


async def test_a_transaction_left_open_is_aborted_at_its_timeout(cluster3: LocalCluster) -> None:
    topic, txn_id = unique("timeout"), unique("t")
    async with AsyncClient(cluster3.urls, token=cluster3.token) as client:
        await topics(client, topic, partitions=1)
        tx = client.transaction(txn_id, timeout_ms=500)
        await tx.__aenter__()
        await tx.append(topic, 0, [Record(b"forgotten")])
        await client.append(topic, 0, [Record(b"after")])
        assert await values(client, topic, 0) == []  # held back behind the open one
        # the coordinator aborts it: a long poll returns once the stable end moves
        read = await client.read(topic, 0, 0, wait_ms=int(WAIT_S * 1000))
        deadline = time.monotonic() + WAIT_S
        while not read.records and time.monotonic() < deadline:  # bounded by WAIT_S
            read = await client.read(topic, 0, 0, wait_ms=1000)
        assert [r.value for r in read.records] == [b"after"]

        # (the markers come first; the id is complete, EMPTY, a moment later)
        async def complete() -> object:
            return (await client.describe_transaction(txn_id)).phase == "empty"

        await wait_until(f"{txn_id} complete", complete, WAIT_S)
        with pytest.raises(Conflict):
            await tx.commit()


async def test_bad_transaction_requests_are_refused_and_change_nothing(
    cluster3: LocalCluster,
) -> None:
    topic, txn_id = unique("bad"), unique("t")
    async with AsyncClient(cluster3.urls, token=cluster3.token) as client:
        await topics(client, topic, partitions=1)
        producer = await client.transactional_producer(txn_id)
        with pytest.raises(BadRequest):
            await client.init_transactions("no spaces")
        with pytest.raises(BadRequest):
            await client.init_transactions(txn_id, timeout_ms=0)
        with pytest.raises(NotFound):
            await client.add_transaction_partitions(txn_id, producer.producer_id, [(topic, 5)])
        with pytest.raises(NotFound):
            await client.describe_transaction(unique("never-started"))
        # a transactional batch for a partition its transaction does not have
        batch = encode_batch([Record(b"x")], producer_id=producer.producer_id, transactional=True)
        with pytest.raises(Conflict):
            await client.append(topic, 0, batch)
        json_append = {"records": [{"value": "x"}], "producer_id": producer.producer_id,
                       "sequence": 0, "transactional": True}  # fmt: skip
        async with aiohttp.ClientSession(headers=auth(cluster3)) as session:
            leader = (await client.describe_topic(topic)).partition_states[0].leader_url
            url = f"{leader}/v1/topics/{topic}/partitions/0/records"
            async with session.post(url, json=json_append, allow_redirects=False) as response:
                assert response.status == 409, await response.text()
            del json_append["producer_id"]
            async with session.post(url, json=json_append, allow_redirects=False) as response:
                assert response.status == 400, await response.text()
        # only the brokers write markers
        base = cluster3.urls[0]
        url = f"{base}/v1/topics/{topic}/partitions/0/markers"
        async with aiohttp.ClientSession(headers=auth(cluster3)) as session:
            body = {"producer_id": producer.producer_id, "commit": True}
            async with session.post(url, json=body, allow_redirects=False) as response:
                assert response.status == 403, await response.text()
            async with session.post(
                f"{base}/v1/transactions/{txn_id}/end", json={"producer_id": 0, "commit": True}
            ) as response:
                assert response.status == 400, await response.text()
        assert (await client.describe_transaction(txn_id)).phase == "empty"
        assert await values(client, topic, 0, isolation="read_uncommitted") == []


async def test_one_end_commits_several_ids_transactions_together(cluster3: LocalCluster) -> None:
    """The Spark sink's commit: each task writes as an id of its own; one end, with the
    others in `also` and a tag, commits them all, and each id tells how it ended."""
    topic = unique("tasks")
    ids = [unique("task") for _ in range(3)]
    async with AsyncClient(cluster3.urls, token=cluster3.token) as client:
        await topics(client, topic, partitions=3)
        producers = [await client.transactional_producer(txn_id) for txn_id in ids]
        transactions = [producer.transaction() for producer in producers]
        for partition, tx in enumerate(transactions):
            await tx.append(topic, partition, [Record(b"row-%d" % partition)])
        assert [await values(client, topic, p) for p in range(3)] == [[], [], []]
        ended = await client.end_transaction(
            ids[0],
            producers[0].producer_id,
            commit=True,
            also=[(t, p.producer_id) for t, p in zip(ids[1:], producers[1:], strict=True)],
            tag="batch 4",
        )
        assert ended.committed and ended.complete
        assert [await values(client, topic, p) for p in range(3)] == [
            [b"row-0"], [b"row-1"], [b"row-2"]
        ]  # fmt: skip
        for txn_id in ids:
            described = await client.describe_transaction(txn_id)
            assert (described.phase, described.last_committed, described.last_tag) == (
                "empty", True, "batch 4"
            )  # fmt: skip
        # all or none: one fenced member (restarted) and the end changes nothing
        producers = [await client.transactional_producer(txn_id) for txn_id in ids]
        for partition, producer in enumerate(producers):
            await producer.transaction().append(topic, partition, [Record(b"again")])
        stale = producers[2].producer_id
        await client.init_transactions(ids[2])  # aborts its open transaction, fencing `stale`
        with pytest.raises(Conflict):
            await client.end_transaction(
                ids[0],
                producers[0].producer_id,
                commit=True,
                also=[(ids[1], producers[1].producer_id), (ids[2], stale)],
            )
        for txn_id in ids[:2]:
            assert (await client.describe_transaction(txn_id)).phase == "ongoing"
        assert [await values(client, topic, p) for p in range(3)] == [
            [b"row-0"], [b"row-1"], [b"row-2"]
        ]  # fmt: skip


async def test_a_json_append_can_be_part_of_a_transaction(cluster3: LocalCluster) -> None:
    topic = unique("json")
    async with AsyncClient(cluster3.urls, token=cluster3.token) as client:
        await topics(client, topic, partitions=1)
        producer = await client.transactional_producer(unique("json-producer"))
        await client.add_transaction_partitions(producer.txn_id, producer.producer_id, [(topic, 0)])
        leader = (await client.describe_topic(topic)).partition_states[0].leader_url
        body = {
            "records": [{"value": "in the transaction"}],
            "producer_id": producer.producer_id,
            "sequence": 0,
            "transactional": True,
        }
        # read-your-writes: without the index it saw, the leader may answer from metadata
        # applied before the add (docs/api.md), and refuse the append (CI115)
        seen = {METADATA_INDEX_HEADER: str(client.metadata_index)}
        async with aiohttp.ClientSession(headers={**auth(cluster3), **seen}) as session:
            url = f"{leader}/v1/topics/{topic}/partitions/0/records"
            async with session.post(url, json=body, allow_redirects=False) as response:
                assert response.status == 200, await response.text()
        assert await values(client, topic, 0) == []
        assert await values(client, topic, 0, isolation="read_uncommitted") == [
            b"in the transaction"
        ]
        await client.end_transaction(producer.txn_id, producer.producer_id, commit=True)
        assert await values(client, topic, 0) == [b"in the transaction"]


async def test_consume_transform_produce_happens_exactly_once(cluster3: LocalCluster) -> None:
    """A shared queue's messages accepted in the transaction that appends their results:
    an abort gives them back and writes nothing; a commit does both."""
    source, sink, txn_id = unique("in"), unique("out"), unique("worker")
    async with AsyncClient(cluster3.urls, token=cluster3.token) as client:
        await topics(client, source, sink, partitions=1)
        for n in range(4):
            await client.append(source, 0, [Record(f"m{n}".encode())])
        producer = await client.transactional_producer(txn_id)

        async def work(*, fail: bool) -> list[bytes | None]:
            taken = await client.acquire(source, 0, "g", consumer="w", max_messages=2)
            async with producer.transaction() as tx:
                for message in taken.messages:
                    await tx.append(sink, 0, [Record((message.value or b"").upper())])
                done = await tx.accept(source, 0, "g", "w", [m.index for m in taken.messages])
                assert len(done.done) == 2
                if fail:
                    raise RuntimeError("the transform failed")
            return [m.value for m in taken.messages]

        with pytest.raises(RuntimeError, match="transform failed"):
            await work(fail=True)
        assert await values(client, sink, 0) == []
        again = await client.acquire(source, 0, "g", consumer="w2", max_messages=10)
        assert [(m.value, m.deliveries) for m in again.messages][:2] == [(b"m0", 2), (b"m1", 2)]
        await client.release(source, 0, "g", "w2", [m.index for m in again.messages])
        assert await work(fail=False) == [b"m0", b"m1"]
        assert await values(client, sink, 0) == [b"M0", b"M1"]
        rest = await client.acquire(source, 0, "g", consumer="w3", max_messages=10)
        assert [m.value for m in rest.messages] == [b"m2", b"m3"]
        assert (await client.describe_group(source, 0, "g")).accepted == 2
        # an accept into a transaction that lacks the partition, or a transactional release
        async with producer.transaction() as tx:
            await tx.append(sink, 0, [Record(b"x")])
            index = rest.messages[0].index
            with pytest.raises(Conflict):
                await client.accept(source, 0, "g", "w3", [index], txn_producer_id=tx.producer_id)
            with pytest.raises(BadRequest):
                await client._settle(  # (the client itself never sends this)
                    "release", source, 0, "g", "w3", [index], txn_producer_id=tx.producer_id
                )
            await tx.abort()


async def test_a_group_consumers_deliveries_are_accepted_in_a_transaction(
    cluster3: LocalCluster,
) -> None:
    source, sink = unique("in"), unique("out")
    async with AsyncClient(cluster3.urls, token=cluster3.token) as client:
        await topics(client, source, sink, partitions=1)
        await client.append(source, 0, [Record(b"a"), Record(b"b")])
        producer = await client.transactional_producer(unique("worker"))
        async with GroupConsumer(client, source, "g", limit=2, wait_ms=100) as consumer:
            async for delivery in consumer:
                async with producer.transaction() as tx:
                    await tx.append(sink, 0, [Record((delivery.value or b"") * 2)])
                    assert await delivery.accept_in(tx)
                assert delivery.state == "accepted"
        assert await values(client, sink, 0) == [b"aa", b"bb"]
        assert (await client.describe_group(source, 0, "g")).accepted == 2
