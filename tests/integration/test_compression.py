"""Compressed batches (zstd, lz4) against three real brokers: a producer's compressed batches
are stored, replicated and served as sent (every replica holds the very bytes), consumers, the
binary read and the shared-queue acquire give back the records; the CLI's `produce
--compression` does the same; and a compressed batch that is damaged, lies about its length
or is a decompression bomb gets a JSON 400 and changes nothing, over HTTP and over a
streaming append."""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
import zstandard

from laminar.client import AsyncClient, Consumer, LaminarError, Producer, Record
from laminar.local_cluster import LocalCluster
from laminar.log.batch import (
    BATCH_HEADER_BYTES,
    CHECKSUM_OFFSET,
    encode_batch,
    header_checksum,
    parse_header,
    payload_hash,
    records_bytes,
    records_from,
    split_batches,
)
from laminar.log.compression import RECORDS_BYTES, Codec

from .conftest import auth, make_cluster, settled_log_end
from .test_cli import laminar, ok

pytestmark = pytest.mark.integration
BATCH = "application/vnd.laminar.batch"
LINES = 300
#: the topic limit of the bad-input tests: a batch's records may take this, decompressed
MAX_BATCH_BYTES = 64 << 10
WAIT_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = make_cluster(tmp_path_factory.mktemp("compression"))
    yield cluster
    cluster.stop()


def log_line(i: int) -> bytes:
    return json.dumps(
        {"level": "info", "service": "checkout", "msg": f"order {1000 + i} paid", "n": i}
    ).encode()


async def create(client: AsyncClient, topic: str, **config: Any) -> None:
    await client.create_topic(topic, partitions=1, replication_factor=3, config=config or None)
    await client.wait_for_leaders(topic)


async def stored_batches(cluster: LocalCluster, node: str, topic: str, end: int) -> bytes:
    """The batches `node` serves for `topic`'s partition 0 up to index `end` (binary reads of
    its own replica, once it has them all)."""
    url = f"{cluster.nodes[node].api_url}/v1/topics/{topic}/partitions/0/records"
    data = bytearray()
    index = 0
    deadline = asyncio.get_running_loop().time() + WAIT_S
    async with aiohttp.ClientSession(headers={**auth(cluster), "Accept": BATCH}) as session:
        while asyncio.get_running_loop().time() < deadline:
            if index >= end:
                return bytes(data)
            params = {"from": str(index), "wait_ms": "500"}
            async with session.get(url, params=params, allow_redirects=False) as response:
                assert response.status == 200, (node, response.status, await response.text())
                body = await response.read()
                index = int(response.headers["Laminar-Next-Index"])
            data += body
    raise AssertionError(f"{node} did not serve {topic} up to {end}")


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
async def test_compressed_batches_are_stored_replicated_and_read_as_sent(
    cluster: LocalCluster, codec: str
) -> None:
    topic = f"logs-{codec}"
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        await create(client, topic)
        async with Producer(client, topic, compression=codec, linger_ms=50) as producer:
            futures = [
                await producer.send(log_line(i), key=b"k%d" % (i % 3), headers={"n": b"%d" % i})
                for i in range(LINES)
            ]
        indexes = [(await f).index for f in futures]
        end = max(indexes) + 1

        got: list[tuple[bytes | None, bytes | None, tuple[tuple[str, bytes], ...]]] = []
        async with asyncio.timeout(WAIT_S), Consumer(client, topic) as consumer:
            async for _, record in consumer:
                got.append((record.key, record.value, record.headers))
                if len(got) == LINES:
                    break
        assert got == [(b"k%d" % (i % 3), log_line(i), (("n", b"%d" % i),)) for i in range(LINES)]

    # every replica serves the very bytes its leader took: compressed, never rewritten
    served = {node: await stored_batches(cluster, node, topic, end) for node in cluster.nodes}
    assert len(set(served.values())) == 1, {n: len(d) for n, d in served.items()}
    data = next(iter(served.values()))
    user = [b for b in split_batches(data) if not parse_header(b).is_control]
    assert user and all(parse_header(b).codec is Codec[codec.upper()] for b in user)
    stored_bytes = sum(parse_header(b).payload_bytes for b in user)
    decompressed_bytes = sum(records_bytes(b) for b in user)
    assert stored_bytes * 3 < decompressed_bytes, (stored_bytes, decompressed_bytes)
    records, _, _ = records_from(data, 0, 10_000)
    assert [r.value for r in records] == [log_line(i) for i in range(LINES)]


async def test_shared_queue_acquires_hand_out_compressed_records(cluster: LocalCluster) -> None:
    topic = "jobs-compressed"
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        await create(client, topic)
        values = [log_line(i) for i in range(40)]
        await client.append(topic, 0, [Record(v) for v in values], compression="zstd")
        await client.append(topic, 0, [Record(b"plain")])  # (one topic may hold both)
        acquired: list[bytes | None] = []
        for _ in range(20):
            answer = await client.acquire(topic, 0, "workers", max_messages=100, wait_ms=500)
            acquired += [m.value for m in answer.messages]
            if len(acquired) >= 41:
                break
        assert acquired == [*values, b"plain"]
        with pytest.raises(ValueError, match="carries its own codec"):
            await client.append(topic, 0, encode_batch([Record(b"x")]), compression="lz4")


def resealed(batch: bytes | bytearray) -> bytes:
    """`batch` with a checksum that holds (a producer's bug, not damage on the way)."""
    prefix = bytes(batch[:CHECKSUM_OFFSET])
    payload = bytes(batch[BATCH_HEADER_BYTES:])
    return prefix + header_checksum(prefix, payload_hash(payload)).to_bytes(8, "little") + payload


def with_section(batch: bytes, section: bytes) -> bytes:
    header = bytearray(batch[:BATCH_HEADER_BYTES])
    struct.pack_into("<I", header, 24, len(section))
    return resealed(bytes(header) + section)


def bad_batches() -> dict[str, tuple[bytes, str]]:
    """Compressed batches the broker must refuse, and a phrase of each refusal."""
    records = [Record(log_line(i)) for i in range(20)]
    good = encode_batch(records, compression="zstd")
    section = good[BATCH_HEADER_BYTES:]
    frame = section[RECORDS_BYTES.size :]
    declared = RECORDS_BYTES.unpack_from(section)[0]
    bomb_bytes = 64 << 20  # 64 MiB of zeros: about 2 KiB as a zstd frame
    compressor = zstandard.ZstdCompressor(level=1).compressobj(size=bomb_bytes)
    chunk = bytes(1 << 20)
    bomb = b"".join([*(compressor.compress(chunk) for _ in range(64)), compressor.flush()])
    gzip = bytearray(good)
    struct.pack_into("<H", gzip, 6, 1 << 2)  # Kafka's gzip number: not supported
    plain_records = encode_batch(records)[BATCH_HEADER_BYTES:]
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(plain_records)
    return {
        "bomb": (with_section(good, RECORDS_BYTES.pack(bomb_bytes) + bomb), "over the limit"),
        "bomb declared small": (
            with_section(good, RECORDS_BYTES.pack(1000) + bomb),
            "declares 67108864 bytes",
        ),
        "garbage frame": (with_section(good, section[:4] + b"\0" * 40), "zstd frame is damaged"),
        "cut short": (with_section(good, section[:-4]), "does not decompress"),
        "length one more": (
            with_section(good, RECORDS_BYTES.pack(declared + 1) + frame),
            "not the",
        ),
        "no content size": (
            with_section(good, RECORDS_BYTES.pack(len(plain_records)) + unsized),
            "does not declare its content size",
        ),
        "gzip": (resealed(gzip), "unsupported compression codec 1"),
    }


async def test_bad_compressed_batches_get_a_json_400_and_change_nothing(
    cluster: LocalCluster,
) -> None:
    topic = "bad-compressed"
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        await create(client, topic, max_batch_bytes=MAX_BATCH_BYTES)
        before = await settled_log_end(client, topic)
    url = f"{cluster.urls[0]}/v1/topics/{topic}/partitions/0/records"
    async with aiohttp.ClientSession(headers=auth(cluster)) as session:
        for shape, (batch, phrase) in bad_batches().items():
            target = url
            for _ in range(5):  # (to the leader: aiohttp's own redirects drop the token)
                async with session.post(
                    target, data=batch, headers={"Content-Type": BATCH}, allow_redirects=False
                ) as response:
                    if response.status == 307:
                        target = response.headers["Location"]
                        continue
                    assert response.content_type == "application/json", shape
                    status, body = response.status, await response.json()
                    break
            assert status == 400, (shape, status, body)
            assert body["error"]["code"] == "corrupt_batch", (shape, body)
            assert phrase in body["error"]["message"], (shape, body)
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        assert (await client.describe_topic(topic)).partition_states[0].log_end == before
        # the same records within the limit, compressed: taken
        fine = await client.append(
            topic, 0, [Record(log_line(i)) for i in range(20)], compression="zstd"
        )
        assert fine.base_index >= before


async def test_streamed_compressed_batches_are_checked_too(cluster: LocalCluster) -> None:
    topic = "streamed-compressed"
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        await create(client, topic, max_batch_bytes=MAX_BATCH_BYTES)
        good = encode_batch([Record(log_line(i)) for i in range(30)], compression="lz4")
        async with await client.append_stream(topic, 0) as stream:
            first = await (await stream.send(good))
        bomb, _ = bad_batches()["bomb"]
        stream = await client.append_stream(topic, 0)
        with pytest.raises(LaminarError) as caught:
            async with stream:
                await (await stream.send(bomb))
        assert caught.value.code == "corrupt_batch", caught.value
        assert "over the limit" in str(caught.value)
        result = await client.read(topic, 0, first.base_index)
        assert [r.value for r in result.records] == [log_line(i) for i in range(30)]
        # (refused before it was proposed: nothing can come of it later)
        state = (await client.describe_topic(topic)).partition_states[0]
        assert state.log_end == first.base_index + 30


async def log_end(cluster: LocalCluster, topic: str) -> int:
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        return (await client.describe_topic(topic)).partition_states[0].log_end


def test_cli_produce_compression(cluster: LocalCluster) -> None:
    topic = "cli-compressed"
    ok(laminar(cluster, "topic", "create", topic, "--replication-factor", "3"))
    lines = [log_line(i).decode() for i in range(200)]
    stdin = "\n".join(lines) + "\n"
    summary = ok(laminar(cluster, "produce", topic, "--compression", "zstd", stdin=stdin))
    assert summary.startswith(f"produced {len(lines)} records"), summary
    consumed = ok(laminar(cluster, "consume", topic, "--json"))
    assert [json.loads(line)["value"] for line in consumed.splitlines()] == lines
    end = asyncio.run(log_end(cluster, topic))
    data = asyncio.run(stored_batches(cluster, next(iter(cluster.nodes)), topic, end))
    codecs = {parse_header(b).codec for b in split_batches(data) if not parse_header(b).is_control}
    assert codecs == {Codec.ZSTD}
