"""Poison batches against real brokers (issue 19): a batch whose checksum holds but whose
records are malformed is refused at append and changes nothing; one already stored (written
here straight into every replica's segment file, as brokers accepted them before appends
checked records) is never served and never a 500: reads stop before it and answer 422 with
where to go on, acquires settle its records unseen, and the dead-letter mover moves a held
one once, without its record, instead of failing every 200 ms.

Only names that predate the fix are imported, so that this module also runs against the old
code (where it fails)."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from laminar.client import AsyncClient, CorruptData, Record
from laminar.local_cluster import LocalCluster
from laminar.log.batch import (
    BATCH_HEADER_BYTES,
    CHECKSUM_OFFSET,
    encode_batch,
    header_checksum,
    parse_header,
    payload_hash,
)
from laminar.log.segment import STORE_SUFFIX
from laminar.log.store import STORE_HEADER_BYTES

from .conftest import auth, make_cluster, settled_log_end, wait_until

pytestmark = pytest.mark.integration
BATCH = "application/vnd.laminar.batch"
TOPIC = "stored"
RECORDS_PATH = f"/v1/topics/{TOPIC}/partitions/0/records"
LEASE_MS = 600_000


# ---- batches a buggy producer sends --------------------------------------------------------


def rechecksummed(batch: bytes | bytearray) -> bytes:
    """`batch` with its checksum made to hold again (whatever its bytes say)."""
    prefix = bytes(batch[:CHECKSUM_OFFSET])
    checksum = header_checksum(prefix, payload_hash(bytes(batch[BATCH_HEADER_BYTES:])))
    return prefix + checksum.to_bytes(8, "little") + bytes(batch[BATCH_HEADER_BYTES:])


def key_past_the_end(batch: bytes) -> bytes:
    """The fuzzer's finding: record 0's key length runs past the end of its record."""
    damaged = bytearray(batch)
    struct.pack_into("<i", damaged, BATCH_HEADER_BYTES + 4, 1000)
    return rechecksummed(damaged)


def poison_shapes() -> dict[str, bytes]:
    good = encode_batch([Record(b"v1", b"k1", (("h", b"x"),)), Record(b"v2")])
    overflow = bytearray(
        encode_batch([Record(b"a", timestamp_ms=1000), Record(b"b", timestamp_ms=1100)])
    )
    near = 2**63 - 10  # + the second record's delta of 100 overflows 64 bits
    struct.pack_into("<qq", overflow, 48, near, near)
    trailing = bytearray(good + b"\0")
    struct.pack_into("<I", trailing, 24, len(good) + 1 - BATCH_HEADER_BYTES)
    more_records = bytearray(good)
    struct.pack_into("<I", more_records, 28, 3)
    name = bytearray(good)
    name[good.index(b"hx") - 0] = 0xFF  # the header name "h" becomes an invalid byte
    max_ts = bytearray(good)
    struct.pack_into("<q", max_ts, 56, struct.unpack_from("<q", good, 56)[0] + 1)
    return {
        "key past the end": key_past_the_end(good),
        "timestamp overflow": rechecksummed(overflow),
        "trailing bytes": rechecksummed(trailing),
        "record count": rechecksummed(more_records),
        "header name": rechecksummed(name),
        "max timestamp": rechecksummed(max_ts),
    }


# ---- a malformed batch stored on every replica ---------------------------------------------


def poison_on_disk(partition_dir: Path, base_index: int) -> None:
    """Rewrite the stored batch at `base_index` in place: same length, base index, term and
    record count, record 0's key length past its end, and a checksum that holds."""
    for path in sorted(partition_dir.glob(f"*{STORE_SUFFIX}")):
        data = path.read_bytes()
        position = STORE_HEADER_BYTES
        while position < len(data):
            header = parse_header(data, position)
            if header.base_index == base_index:
                batch = key_past_the_end(data[position : position + header.batch_bytes])
                with path.open("r+b") as file:
                    file.seek(position)
                    file.write(batch)
                return
            position += header.batch_bytes
    raise AssertionError(f"no batch at {base_index} in {partition_dir}")


class Stored:
    """The cluster and where the batches of TOPIC's partition 0 lie: `good` before the
    malformed batch [bad, bad_end), `after` past it."""

    def __init__(self, cluster: LocalCluster, bases: list[int], counts: list[int]) -> None:
        self.cluster = cluster
        self.first = list(range(bases[0], bases[0] + counts[0]))
        self.bad = bases[1]
        self.bad_end = bases[1] + counts[1]
        self.after = list(range(bases[2], bases[2] + counts[2]))


BATCHES = [[b"a0", b"a1"], [b"b0", b"b1", b"b2"], [b"c0", b"c1"]]


async def load(cluster: LocalCluster) -> list[int]:
    """BATCHES appended to TOPIC (their base indexes) and stored on every replica; consumer c1
    of group `held` acquires every record."""
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        await client.create_topic(TOPIC, partitions=1, replication_factor=3)
        await client.wait_for_leaders(TOPIC)
        bases = [
            (await client.append(TOPIC, 0, [Record(v) for v in values])).base_index
            for values in BATCHES
        ]
        held = await client.acquire(
            TOPIC, 0, "held", consumer="c1", max_messages=100, lease_ms=LEASE_MS
        )
        assert len(held.messages) == 7
        end = bases[-1] + len(BATCHES[-1])
        for node in cluster.nodes:
            # An acknowledgement means a majority stored the batches; the damage below is
            # written into every replica's files, so wait for the third one too.
            async def stored_all(node: str = node) -> object:
                hosted = (await client.node_partitions(node)).partitions
                ends = [p.log_end for p in hosted if p.topic == TOPIC]
                return True if ends and ends[0] >= end else ends

            await wait_until(f"{node} to store every batch", stored_all)
    return bases


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stored]:
    """Three brokers; TOPIC holds 2 good records, 3 malformed ones (on every replica) and 2
    good ones. Consumer c1 of group `held` acquired everything before the damage (what a
    broker granted before acquires checked records), under a long lease."""
    cluster = make_cluster(tmp_path_factory.mktemp("poison"))
    try:
        bases = asyncio.run(load(cluster))
        for node in list(cluster.nodes):
            assert cluster.stop_node(node) == 0
        for node in cluster.nodes.values():
            poison_on_disk(node.data_dir / "partitions" / TOPIC / "0", bases[1])
        for node in list(cluster.nodes):
            cluster.start_node(node)
        cluster.wait_ready()
        yield Stored(cluster, bases, [len(b) for b in BATCHES])
    finally:
        cluster.stop()


async def get(cluster: LocalCluster, url: str, **kwargs: Any) -> tuple[int, Any, dict[str, str]]:
    async with (
        aiohttp.ClientSession(headers=auth(cluster)) as session,
        session.get(url, allow_redirects=False, **kwargs) as response,
    ):
        body: Any = await response.read()
        if response.content_type == "application/json":
            body = await response.json()
        return response.status, body, dict(response.headers)


async def post(cluster: LocalCluster, url: str, **kwargs: Any) -> tuple[int, Any]:
    """POST, following 307s to the leader (aiohttp's own redirects drop the token)."""
    async with aiohttp.ClientSession(headers=auth(cluster)) as session:
        for _ in range(5):
            async with session.post(url, allow_redirects=False, **kwargs) as response:
                if response.status == 307:
                    url = response.headers["Location"]
                    continue
                if response.content_type == "application/json":
                    return response.status, await response.json()
                return response.status, await response.read()
    raise AssertionError(f"POST {url}: redirected too often")


async def metric(cluster: LocalCluster, node: str, path: str) -> float:
    _, text, _ = await get(cluster, f"{cluster.nodes[node].api_url}/metrics")
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            if sample.name == "laminar_malformed_records_total" and sample.labels == {"path": path}:
                return sample.value
    raise AssertionError("no metric laminar_malformed_records_total")


async def leader(cluster: LocalCluster) -> str:
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        found = (await client.wait_for_leaders(TOPIC)).partition_states[0].leader
    assert found is not None
    return found


def tracebacks(cluster: LocalCluster) -> dict[str, int]:
    return {n: cluster.tail(n, 100_000).count("Traceback") for n in cluster.nodes}


# ---- appends -------------------------------------------------------------------------------


async def test_poison_batches_with_a_valid_checksum_are_refused_and_change_nothing(
    stored: Stored,
) -> None:
    cluster = stored.cluster
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        await client.create_topic("appends", partitions=1, replication_factor=3)
        await client.wait_for_leaders("appends")
        end = await settled_log_end(client, "appends")
    url = f"{cluster.urls[0]}/v1/topics/appends/partitions/0/records"
    for shape, batch in poison_shapes().items():
        status, body = await post(cluster, url, data=batch, headers={"Content-Type": BATCH})
        assert status == 400, (shape, status, body)
        assert body["error"]["code"] == "corrupt_batch", (shape, body)
        assert "malformed records" in body["error"]["message"], (shape, body)
    status, body = await post(
        cluster, url, data=poison_shapes()["timestamp overflow"], headers={"Content-Type": BATCH}
    )
    assert f"first_timestamp_ms {2**63 - 10} is outside" in body["error"]["message"]
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        assert (await client.describe_topic("appends")).partition_states[0].log_end == end
        good = await client.append("appends", 0, [Record(b"fine")])
        assert good.base_index >= end


# ---- reads ---------------------------------------------------------------------------------


async def test_reads_stop_before_a_stored_malformed_batch_and_say_where_to_go_on(
    stored: Stored,
) -> None:
    cluster = stored.cluster
    for node in cluster.nodes.values():
        url = node.api_url + RECORDS_PATH

        async def committed(url: str = url) -> object:
            status, body, _ = await get(cluster, f"{url}?from={stored.after[-1]}")
            return (status == 200 and len(body["records"]) == 1) or (status, body)

        await wait_until(f"{node.id} to have committed every batch", committed)
        status, body, _ = await get(cluster, f"{url}?from={stored.first[0]}")
        assert status == 200, body  # the records before it, and where reading goes on
        assert [r["value"] for r in body["records"]] == ["a0", "a1"]
        assert body["next_index"] == stored.bad
        for start in (stored.bad, stored.bad + 2):  # a read that starts in it
            status, body, _ = await get(cluster, f"{url}?from={start}")
            assert status == 422, (node.id, status, body)
            assert body["error"]["code"] == "corrupt_data", body
            assert body["error"]["next_index"] == stored.bad_end, body
            assert "malformed" in body["error"]["message"], body
        status, body, _ = await get(cluster, f"{url}?from={stored.bad_end}")
        assert status == 200 and [r["value"] for r in body["records"]] == ["c0", "c1"], body
        # binary readers: the batches before it, then the same 422
        binary = {"Accept": BATCH}
        status, data, headers = await get(cluster, f"{url}?from={stored.first[0]}", headers=binary)
        assert status == 200 and headers["Laminar-Next-Index"] == str(stored.bad), headers
        assert parse_header(data).next_index == stored.bad and len(data) > BATCH_HEADER_BYTES
        status, body, _ = await get(cluster, f"{url}?from={stored.bad}", headers=binary)
        assert status == 422 and body["error"]["next_index"] == stored.bad_end, body
        assert await metric(cluster, node.id, "read") == stored.bad_end - stored.bad
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        result = await client.read(TOPIC, 0, stored.first[0])
        assert [r.value for r in result.records] == [b"a0", b"a1"]
        assert result.next_index == stored.bad
        with pytest.raises(CorruptData) as raised:
            await client.read(TOPIC, 0, stored.bad)
        assert raised.value.next_index == stored.bad_end
    assert not any(tracebacks(cluster).values()), tracebacks(cluster)


# ---- shared queues -------------------------------------------------------------------------


async def test_acquire_settles_malformed_records_unseen_and_hands_out_the_rest(
    stored: Stored,
) -> None:
    cluster = stored.cluster
    url = f"{cluster.urls[0]}/v1/topics/{TOPIC}/partitions/0/groups/fresh/acquire"
    status, body = await post(
        cluster, url, json={"consumer": "c", "max": 100, "lease_ms": LEASE_MS}
    )
    assert status == 200, body  # JSON
    got = [(m["index"], m["value"]) for m in body["messages"]]
    expected = list(zip(stored.first + stored.after, ["a0", "a1", "c0", "c1"], strict=True))
    assert got == expected
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        described = await client.describe_group(TOPIC, 0, "fresh")
        # nobody holds a record it was not given: the malformed ones are settled, unseen
        assert (described.acquired, described.accepted) == (4, 3), described
        assert described.pending == 0, described
        binary = await client.acquire(TOPIC, 0, "fresh-binary", max_messages=100)
        assert [m.value for m in binary.messages] == [b"a0", b"a1", b"c0", b"c1"]
        assert (await client.describe_group(TOPIC, 0, "fresh-binary")).acquired == 4
    lead = await leader(cluster)
    assert await metric(cluster, lead, "acquire") == 2 * (stored.bad_end - stored.bad)
    log = cluster.tail(lead, 100_000)
    assert f"records {stored.bad}..{stored.bad_end - 1} are malformed and skipped" in log
    assert "consumer group fresh:" in log
    assert not any(tracebacks(cluster).values()), tracebacks(cluster)


async def test_a_held_malformed_record_rejected_is_dead_lettered_once_without_it(
    stored: Stored,
) -> None:
    cluster = stored.cluster
    bad = list(range(stored.bad, stored.bad_end))
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        settled = await client.reject(TOPIC, 0, "held", "c1", bad, reason="unreadable")
        assert list(settled.done) == bad, settled

        async def moved() -> object:
            described = await client.describe_group(TOPIC, 0, "held")
            return described.dead_lettered == len(bad) or described

        await wait_until("the dead letters to be moved", moved)
        letters = await client.read(f"{TOPIC}.dlq", 0)
    assert [r.value for r in letters.records] == [None] * len(bad)
    for record, index in zip(letters.records, bad, strict=True):
        headers = dict(record.headers)
        assert headers["laminar.dlq.index"] == str(index).encode()
        assert headers["laminar.dlq.reason"] == b"unreadable"
        assert b"key of 1000 bytes runs past" in headers["laminar.dlq.malformed"]
    await asyncio.sleep(2)  # the mover would have failed ten times by now
    lead = await leader(cluster)
    log = cluster.tail(lead, 100_000)
    assert "dead-letter mover failed" not in log
    assert log.count("(dead_letter)") == len(bad)  # one report per dead letter
    assert await metric(cluster, lead, "dead_letter") == len(bad)
    assert not any(tracebacks(cluster).values()), tracebacks(cluster)
