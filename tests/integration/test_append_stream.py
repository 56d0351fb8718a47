"""Streaming appends (docs/api.md, "Streaming appends") against three real broker processes:
acks in order with the records readable as sent, a follower's upgrade redirected to the leader,
idempotent duplicates, a refused batch ending the stream with nothing after it written, the
wire format seen raw, authorization at the upgrade and while the stream is open, and a
leadership move: every batch acknowledged before the stream ended is in the log."""

from __future__ import annotations

import asyncio
import os
import struct
import uuid
from pathlib import Path

import aiohttp
import orjson
import pytest

from laminar.client import AsyncClient, Conflict, Forbidden, Record, Unauthorized
from laminar.client.errors import LaminarError
from laminar.credentials import add_principal, retire_tokens
from laminar.local_cluster import LocalCluster
from laminar.log.batch import encode_batch

from .conftest import auth, make_cluster, wait_until

pytestmark = pytest.mark.integration

ACK = struct.Struct(">QIB")
WAIT_MS = 5_000


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def topic_on(cluster: LocalCluster, rf: int = 3) -> tuple[str, str, str]:
    """A new one-partition topic: (name, its leader's URL, a follower's URL)."""
    name = unique("stream")
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        await client.create_topic(name, partitions=1, replication_factor=rf)
        described = await client.wait_for_leaders(name)
        leader = described.partition_states[0].leader
    members = {node_id: node.api_url for node_id, node in cluster.nodes.items()}
    follower = next(url for node, url in members.items() if node != leader)
    return name, members[leader], follower


async def read_all(client: AsyncClient, topic: str, end: int) -> dict[int, bytes | None]:
    """The partition's records before `end`: index -> value. Long polls: the replica read may
    learn of the commit a moment after the leader acknowledged (a client that did not append
    has no index to name for read-your-writes)."""
    values: dict[int, bytes | None] = {}
    index = (await client.describe_topic(topic)).partition_states[0].log_start
    while index < end:  # bounded: each read ends past at least one index
        read = await client.read(topic, 0, index, max_records=10_000, wait_ms=WAIT_MS)
        assert read.next_index > index, f"nothing committed at {index} within {WAIT_MS} ms"
        values.update((r.index, r.value) for r in read.records if r.index < end)
        index = read.next_index
    return values


async def test_batches_are_acknowledged_in_order_and_read_back(cluster3: LocalCluster) -> None:
    topic, _, follower = await topic_on(cluster3)
    # bootstrapped from a follower only: the upgrade is redirected to the leader
    async with AsyncClient([follower], token=cluster3.token) as client:
        sizes = [1 + (i * 7) % 5 for i in range(600)]
        sent = [[Record(value=f"{i}-{j}".encode()) for j in range(n)] for i, n in enumerate(sizes)]
        async with await client.append_stream(topic, 0, max_in_flight=64) as stream:
            futures = []
            for records in sent:
                futures.append(await stream.send(records))
                assert stream.in_flight <= 64
            results = await asyncio.gather(*futures)
        assert [r.count for r in results] == sizes
        assert not any(r.duplicate for r in results)
        bases = [r.base_index for r in results]
        assert bases == sorted(bases) and len(set(bases)) == len(bases)
        end = results[-1].base_index + results[-1].count
        values = await read_all(client, topic, end)
        for result, records in zip(results, sent, strict=True):
            read = [values[result.base_index + i] for i in range(result.count)]
            assert read == [r.value for r in records]
        assert len(values) == sum(sizes)


async def test_a_repeated_producer_sequence_is_a_duplicate(cluster3: LocalCluster) -> None:
    topic, leader, _ = await topic_on(cluster3)
    async with AsyncClient([leader], token=cluster3.token) as client:
        async with await client.append_stream(topic, 0) as stream:
            first = await (await stream.send([Record(value=b"a")], producer_id=7, sequence=0))
            again = await (await stream.send([Record(value=b"a")], producer_id=7, sequence=0))
            later = await (await stream.send([Record(value=b"b")], producer_id=7, sequence=1))
        assert not first.duplicate and again.duplicate
        assert again.base_index == first.base_index
        assert later.base_index == first.base_index + 1
        # a sequence that skips back out of the window: a conflict ends the stream
        async with await client.append_stream(topic, 0) as stream:
            ok = await stream.send([Record(value=b"c")], producer_id=8, sequence=10)
            await ok
            refused = await stream.send([Record(value=b"d")], producer_id=8, sequence=3)
            with pytest.raises(Conflict) as caught:
                await refused
            assert not caught.value.ambiguous
            with pytest.raises(Conflict):
                await stream.send([Record(value=b"e")])


async def test_a_corrupt_batch_ends_the_stream_and_nothing_after_it_is_written(
    cluster3: LocalCluster,
) -> None:
    topic, leader, _ = await topic_on(cluster3)
    good = encode_batch([Record(value=b"good")])
    corrupt = bytearray(encode_batch([Record(value=b"evil")]))
    corrupt[-1] ^= 0xFF  # the checksum no longer holds
    url = leader.replace("http", "ws") + f"/v1/topics/{topic}/partitions/0/records/stream"
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(url, headers=auth(cluster3)) as ws,
    ):
        for _ in range(3):
            await ws.send_bytes(good)
        await ws.send_bytes(bytes(corrupt))
        await ws.send_bytes(good)  # after the refused batch: never written
        acks: list[tuple[int, int, int]] = []
        ended = None
        async for message in ws:
            if message.type is aiohttp.WSMsgType.BINARY:
                acks += ACK.iter_unpack(message.data)
            elif message.type is aiohttp.WSMsgType.TEXT:
                ended = orjson.loads(message.data)
        assert ws.closed
    assert [(count, dup) for _, count, dup in acks] == [(1, 0)] * 3
    assert [base for base, _, _ in acks] == [acks[0][0] + i for i in range(3)]
    assert ended is not None and ended["status"] == 400 and ended["acked"] == 3, ended
    assert ended["error"]["code"] == "corrupt_batch"
    async with AsyncClient([leader], token=cluster3.token) as client:
        # nothing after the refusal (the log end may still move: a leader's no-op)
        end = (await client.describe_topic(topic)).partition_states[0].log_end
        assert list((await read_all(client, topic, end)).values()) == [b"good"] * 3


async def test_text_messages_and_plain_gets_are_refused(cluster3: LocalCluster) -> None:
    topic, leader, _ = await topic_on(cluster3)
    path = f"/v1/topics/{topic}/partitions/0/records/stream"
    async with aiohttp.ClientSession() as session:
        async with session.get(leader + path, headers=auth(cluster3)) as response:
            assert response.status == 426
            assert (await response.json())["error"]["code"] == "upgrade_required"
        async with session.ws_connect(leader.replace("http", "ws") + path,
                                      headers=auth(cluster3)) as ws:  # fmt: skip
            await ws.send_str("hello")
            message = await ws.receive()
            assert message.type is aiohttp.WSMsgType.TEXT
            body = orjson.loads(message.data)
            assert body["status"] == 400 and body["acked"] == 0
            assert (await ws.receive()).type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)


async def test_streams_are_authorized_at_the_upgrade_and_while_open(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path / "auth", 1)
    try:
        credentials = cluster.credentials_path()
        writer = add_principal(credentials, "writer", ["producer"], ["s*"])
        reader = add_principal(credentials, "reader", ["consumer"], ["s*"])
        async with AsyncClient(cluster.urls, token=cluster.token) as admin:
            await admin.create_topic("s1", partitions=1, replication_factor=1)
            await admin.wait_for_leaders("s1")

        async def streams(token: str) -> bool:
            async with AsyncClient(cluster.urls, token=token) as client:
                stream = await client.append_stream("s1", 0)
                await (await stream.send([Record(value=b"x")]))
                await stream.close()
            return True

        await wait_until("the writer's token", lambda: streams(writer), 30)
        with pytest.raises(Forbidden):
            async with AsyncClient(cluster.urls, token=reader) as client:
                await client.append_stream("s1", 0)
        with pytest.raises(Unauthorized):
            async with AsyncClient(cluster.urls, token="lmq_" + "x" * 43) as client:
                await client.append_stream("s1", 0)
        # a token retired while its stream is open: the stream ends (401) once it is noticed
        second = add_principal(credentials, "writer")
        await wait_until("the second token", lambda: streams(second), 30)
        async with AsyncClient(cluster.urls, token=writer) as client:
            stream = await client.append_stream("s1", 0)
            await (await stream.send([Record(value=b"before")]))
            assert retire_tokens(credentials, "writer", keep=1) == 1
            with pytest.raises(Unauthorized):
                for _ in range(600):  # one batch every 50 ms, up to 30 s
                    await (await stream.send([Record(value=b"during")]))
                    await asyncio.sleep(0.05)
            await stream.close(flush=False)
    finally:
        cluster.stop()


async def test_every_acknowledged_batch_survives_a_leadership_move(
    cluster3: LocalCluster,
) -> None:
    topic, leader, _ = await topic_on(cluster3)
    async with AsyncClient([leader], token=cluster3.token) as client:
        leader_id = next(n for n, node in cluster3.nodes.items() if node.api_url == leader)
        stream = await client.append_stream(topic, 0, max_in_flight=256)
        acked: list[tuple[int, bytes]] = []
        failures: list[LaminarError] = []

        async def note(future: asyncio.Future[object], value: bytes) -> None:
            try:
                result = await future
            except LaminarError as e:
                failures.append(e)
            else:
                acked.append((result.base_index, value))  # type: ignore[attr-defined]

        notes = []
        handed_off = False
        try:
            for i in range(20_000):  # bounded: the move ends the stream long before
                value = os.urandom(8) + i.to_bytes(4, "big")
                future = await stream.send([Record(value=value)])
                notes.append(asyncio.ensure_future(note(future, value)))
                if i == 500:  # the first 501 acknowledged before the move begins (an event:
                    await asyncio.gather(*notes)  # the window's drain raced the handoff)
                if i == 700:  # the move, with the batches sent since in flight across it
                    await client.handoff(leader_id)
                    handed_off = True
        except LaminarError as e:
            failures.append(e)
        await asyncio.gather(*notes)
        await stream.close(flush=False)
        assert handed_off and failures, "the stream outlived the leadership move"
        assert all(e.code in ("not_leader", "outcome_unknown", "unavailable") for e in failures)
        assert len(acked) >= 501
        # every acknowledged batch is in the log, at its index, with its value
        end = max(base for base, _ in acked) + 1
        async with AsyncClient(cluster3.urls, token=cluster3.token) as reader:
            values = await read_all(reader, topic, end)
        for base, value in acked:
            assert values[base] == value
        # and the stream to the new leader works
        async with await client.append_stream(topic, 0) as again:
            assert not (await (await again.send([Record(value=b"after")]))).duplicate


async def test_a_stream_opened_while_the_leader_is_gone_waits_for_the_next(tmp_path: Path) -> None:
    """The leader is killed: the brokers still name it (the stream's upgrade goes there and
    finds nothing), then elect another and answer 503 meanwhile. Opening the stream rides that
    out, as any other call does, and the stream then works."""
    cluster = make_cluster(tmp_path / "leaderless")
    try:
        topic, leader, _ = await topic_on(cluster)
        leader_id = next(n for n, node in cluster.nodes.items() if node.api_url == leader)
        async with AsyncClient(cluster.urls, token=cluster.token) as client:
            await client.describe_topic(topic)  # routes cached: the leader first
            cluster.kill(leader_id)
            async with await client.append_stream(topic, 0) as stream:
                result = await (await stream.send([Record(value=b"after")]))
            read = await client.read(topic, 0, result.base_index)
            assert [r.value for r in read.records] == [b"after"]
            assert (await client.describe_topic(topic)).partition_states[0].leader != leader_id
    finally:
        cluster.stop()
