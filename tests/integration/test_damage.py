"""A bit flipped in a replica's sealed segment stays local and is repaired (issue 17, bug 2):
the broker starts, the damaged replica is cut at the damage and fetched again from its
leader (a damaged leader steps down), reads never answer 500, other partitions are not
touched, and the repair shows in the metrics. Real broker processes and files."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from laminar.client import AsyncClient
from laminar.local_cluster import LocalCluster
from laminar.log.batch import BATCH_HEADER_BYTES, Record, parse_header
from laminar.log.segment import STORE_SUFFIX
from laminar.log.store import STORE_HEADER_BYTES

from .conftest import auth, make_cluster, wait_until
from .test_metrics import samples, scrape

pytestmark = pytest.mark.integration

SEGMENT_BYTES = 16 * 1024
RECORDS = 240  # about 15 segments of SEGMENT_BYTES


def flip_in_sealed_segment(partition_dir: Path) -> int:
    """Flip one bit in the payload of a batch in the middle of the oldest sealed segment of
    the replica in `partition_dir` (where only its checksum can tell); its base index."""
    stores = sorted(partition_dir.glob(f"*{STORE_SUFFIX}"))
    assert len(stores) >= 3, stores
    path = stores[0]
    data = bytearray(path.read_bytes())
    position, found = STORE_HEADER_BYTES, []
    while position < len(data):
        header = parse_header(bytes(data[position : position + BATCH_HEADER_BYTES]))
        found.append((position, header))
        position += header.batch_bytes
    position, header = found[len(found) // 2]
    data[position + BATCH_HEADER_BYTES + 5] ^= 0x10
    path.write_bytes(bytes(data))
    return header.base_index


async def replica_read(cluster: LocalCluster, node: str, topic: str) -> list[bytes] | int:
    """Every value in `node`'s own replica of partition 0 of `topic`, or the status of the
    first answer that was not 200 (a damaged replica answers 503 until it is repaired)."""
    base = cluster.nodes[node].api_url
    values: list[bytes] = []
    index = 0
    async with aiohttp.ClientSession(headers=auth(cluster)) as session:
        while True:
            url = f"{base}/v1/topics/{topic}/partitions/0/records?from={index}&max_records=1000"
            async with session.get(url, allow_redirects=False) as response:
                if response.status != 200:
                    return response.status
                body = await response.json()
            if not body["records"]:
                return values
            values += [r["value"].encode() for r in body["records"]]
            index = body["next_index"]


async def storage_metric(cluster: LocalCluster, node: str, name: str) -> float:
    return await counter(cluster, node, f"laminar_storage_{name}_total")


async def counter(cluster: LocalCluster, node: str, name: str) -> float:
    """The value of `node`'s unlabelled counter `name` (its exposition name)."""
    async with aiohttp.ClientSession() as session:
        _, families = await scrape(session, cluster.nodes[node].api_url)
    found = samples(families, name)
    assert len(found) == 1, f"{name}: {found}"
    return found[0][1]


async def loaded_cluster(tmp_path: Path) -> tuple[LocalCluster, list[bytes], str]:
    """Three brokers with small segments; topics `flip` and `other` (RF 3) each holding the
    same RECORDS values on every replica; the leader of flip/0."""
    cluster = make_cluster(tmp_path, extra_args=("--segment-bytes", str(SEGMENT_BYTES)))
    values = [f"{n:05d}".encode() * 100 for n in range(RECORDS)]
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        for topic in ("flip", "other"):
            await client.create_topic(topic, partitions=1, replication_factor=3)
            await client.wait_for_leaders(topic)
            for start in range(0, RECORDS, 10):
                batch = [Record(value=v) for v in values[start : start + 10]]
                await client.append(topic, 0, batch, producer_id=5, sequence=start)
        leader = (await client.describe_topic("flip")).partition_states[0].leader
    assert leader is not None
    await every_replica_holds(cluster, values)
    return cluster, values, leader


async def every_replica_holds(cluster: LocalCluster, values: list[bytes]) -> None:
    async def check() -> object:
        found = {
            (node, topic): await replica_read(cluster, node, topic)
            for node in cluster.nodes
            for topic in ("flip", "other")
        }
        bad = {k: v if isinstance(v, int) else len(v) for k, v in found.items() if v != values}
        return bad or True

    await wait_until("every replica to hold every record", check)


@pytest.mark.parametrize("stop", ["sigterm", "kill9"])
async def test_a_follower_with_a_flipped_bit_starts_and_is_repaired(
    tmp_path: Path, stop: str
) -> None:
    cluster, values, leader = await loaded_cluster(tmp_path / stop)
    try:
        follower = next(n for n in cluster.nodes if n != leader)
        if stop == "sigterm":
            assert cluster.stop_node(follower) == 0
        else:
            cluster.kill(follower)
        flip_in_sealed_segment(cluster.nodes[follower].data_dir / "partitions" / "flip" / "0")
        cluster.start_node(follower)
        cluster.wait_ready([follower])  # it starts: the damage stays in its partition
        await every_replica_holds(cluster, values)  # reads find it, and it is fetched again
        assert await storage_metric(cluster, follower, "repairs") >= 1
        log = cluster.tail(follower, 10_000)
        assert "flip/0" in log and "Traceback" not in log
        async with AsyncClient(cluster.urls, token=cluster.token) as client:
            more = await client.append("flip", 0, [Record(value=b"after")])
        assert more.base_index >= RECORDS  # (leader no-ops take indexes too)
    finally:
        cluster.stop()


async def test_a_leader_that_finds_a_flipped_bit_steps_down_and_is_repaired(
    tmp_path: Path,
) -> None:
    cluster, values, leader = await loaded_cluster(tmp_path / "leader")
    try:
        async with AsyncClient(cluster.urls, token=cluster.token) as client:
            term = (await client.describe_topic("flip")).partition_states[0].term
        assert term is not None
        partition = cluster.nodes[leader].data_dir / "partitions" / "flip" / "0"
        flip_in_sealed_segment(partition)  # under the running broker (its page cache too)
        status = await replica_read(cluster, leader, "flip")
        assert status == 503, status  # never served, never a 500

        async def elected_again() -> object:
            """flip/0 has a leader of a later term: the damaged one stepped down (its
            reopened replica campaigns only once repaired). Which broker that is, is Raft's
            choice: another, or this one again, repaired (its broker's preferred leader
            campaigns first: a run here under load saw it win the first election after its
            repair, and CI111 ended as that run did, with it leading in a later term)."""
            async with AsyncClient(cluster.urls, token=cluster.token) as client:
                state = (await client.describe_topic("flip")).partition_states[0]
            later = state.term is not None and state.term > term
            return (later and state.leader is not None) or state

        await wait_until("a leader of flip/0 in a later term", elected_again)
        await every_replica_holds(cluster, values)
        assert await storage_metric(cluster, leader, "corrupt_batches") >= 1
        assert await storage_metric(cluster, leader, "repairs") >= 1
        async with AsyncClient(cluster.urls, token=cluster.token) as client:
            more = await client.append("flip", 0, [Record(value=b"after")])
        assert more.base_index >= RECORDS  # (leader no-ops take indexes too)
        assert "Traceback" not in cluster.tail(leader, 10_000)
    finally:
        cluster.stop()
