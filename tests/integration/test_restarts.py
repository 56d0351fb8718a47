"""Restarts never remove acknowledged data: a broker removes a replica only after applying a
committed deletion of *its* topic (issue 17, bug 1), and moves aside (never deletes) a replica
of a topic the cluster does not know. Real broker processes, kill -9 and SIGTERM."""

from __future__ import annotations

import shutil
from pathlib import Path

import aiohttp
import pytest

from laminar.client import AsyncClient
from laminar.local_cluster import LocalCluster
from laminar.log.batch import Record

from .conftest import auth, make_cluster, wait_until

pytestmark = pytest.mark.integration


async def hosts_replica(cluster: LocalCluster, node: str, topic: str) -> bool:
    """Whether `node` lists a replica of partition 0 of `topic` among those it hosts."""
    base = cluster.nodes[node].api_url
    async with (
        aiohttp.ClientSession(headers=auth(cluster)) as session,
        session.get(f"{base}/v1/nodes/{node}/partitions") as response,
    ):
        hosted = (await response.json())["partitions"]
    return any(p["topic"] == topic and p["partition"] == 0 for p in hosted)


async def replica_values(cluster: LocalCluster, node: str, topic: str) -> list[bytes] | None:
    """The values in `node`'s own replica of partition 0 of `topic` (None: it hosts none)."""
    if not await hosts_replica(cluster, node, topic):
        return None
    base = cluster.nodes[node].api_url
    async with aiohttp.ClientSession(headers=auth(cluster)) as session:
        url = f"{base}/v1/topics/{topic}/partitions/0/records?from=0&max_records=1000"
        async with session.get(url, allow_redirects=False) as response:
            assert response.status == 200, await response.text()
            body = await response.json()
    return [record["value"].encode() for record in body["records"]]


async def wait_replicas_hold(
    cluster: LocalCluster, topic: str, values: list[bytes], nodes: list[str] | None = None
) -> None:
    async def every_replica_holds() -> object:
        found = {n: await replica_values(cluster, n, topic) for n in nodes or cluster.nodes}
        return True if all(v == values for v in found.values()) else found

    await wait_until(
        f"every replica of {topic}/0 to hold {len(values)} records", every_replica_holds
    )


async def append_all(client: AsyncClient, topic: str, values: list[bytes], producer: int) -> None:
    for sequence, value in enumerate(values):
        # idempotent: a retry after an ambiguous answer is not written twice
        await client.append(
            topic, 0, [Record(value=value)], producer_id=producer, sequence=sequence
        )


@pytest.mark.parametrize("journal_bytes", [0, 1 << 20], ids=["no-journal", "journal"])
async def test_topics_created_since_restarts_survive_kill9_of_every_broker(
    tmp_path: Path, journal_bytes: int
) -> None:
    """The reported reproduction: rolling restarts, a new topic, 20 records acknowledged,
    kill -9 of all three brokers, start: every replica still has the 20 records (it used to
    remove t/0 as a topic that "no longer exists", from metadata replayed only up to the
    commit index saved before the topic was created). With a journal, each start replays it
    (the logs were written without their own fdatasyncs)."""
    journal = ("--journal-bytes", str(journal_bytes))
    cluster = make_cluster(tmp_path / "kill-all", extra_args=journal)
    try:
        async with AsyncClient(cluster.urls, token=cluster.token) as client:
            await client.create_topic("a", partitions=1, replication_factor=3)
            await client.wait_for_leaders("a")
        for node in list(cluster.nodes):
            assert cluster.stop_node(node) == 0
            cluster.start_node(node)
            cluster.wait_ready([node])
        values = [f"record-{n}".encode() for n in range(20)]
        async with AsyncClient(cluster.urls, token=cluster.token) as client:
            await client.create_topic("t", partitions=1, replication_factor=3)
            await client.wait_for_leaders("t")
            await append_all(client, "t", values, producer=17)
        await wait_replicas_hold(cluster, "t", values)
        for node in list(cluster.nodes):
            cluster.kill(node)
        cluster.start()
        await wait_replicas_hold(cluster, "t", values)
        for node in cluster.nodes:
            log = cluster.tail(node, 10_000)
            assert "removing t/0" not in log
            assert ("journal" in log) == bool(journal_bytes)  # (its replay is logged)
    finally:
        cluster.stop()


async def test_a_topic_deleted_while_a_broker_was_down(tmp_path: Path) -> None:
    """n3 is killed holding a replica of `t`; `t` is deleted and topic `u` created. When n3
    comes back its replica of `t` goes (the deletion is committed and n3 applied it) and it
    hosts its replica of `u`."""
    cluster = make_cluster(tmp_path / "deleted")
    try:
        async with AsyncClient(cluster.urls, token=cluster.token) as client:
            await client.create_topic("t", partitions=1, replication_factor=3)
            await client.wait_for_leaders("t")
            await append_all(client, "t", [b"old-1", b"old-2"], producer=21)
        await wait_replicas_hold(cluster, "t", [b"old-1", b"old-2"])
        cluster.kill("n3")
        up = [cluster.nodes[n].api_url for n in ("n1", "n2")]
        async with AsyncClient(up, token=cluster.token) as client:
            await client.delete_topic("t")
            await client.create_topic("u", partitions=1, replication_factor=3)
            await client.wait_for_leaders("u")
            await append_all(client, "u", [b"new"], producer=22)
        cluster.start_node("n3")
        cluster.wait_ready(["n3"])

        async def replica_gone() -> bool:
            # Only the hosted list: between it and a read of the records n3 may apply the
            # deletion, and the read then answers 404 for a topic it no longer knows.
            return not await hosts_replica(cluster, "n3", "t")

        await wait_until("n3 to drop its replica of the deleted topic", replica_gone)
        assert "t/0: its topic was deleted" in cluster.tail("n3", 10_000)
        assert not (cluster.nodes["n3"].data_dir / "partitions" / "t" / "0").exists()
        await wait_replicas_hold(cluster, "u", [b"new"])
    finally:
        cluster.stop()


async def test_a_replica_of_a_topic_nobody_knows_is_moved_aside(tmp_path: Path) -> None:
    """A partition directory that records no topic (as written before topics were recorded)
    and whose topic the caught-up metadata does not know is moved to quarantine/, not
    deleted; a replica that records no topic but whose topic exists is kept and adopted."""
    cluster = make_cluster(tmp_path / "unknown")
    try:
        async with AsyncClient(cluster.urls, token=cluster.token) as client:
            await client.create_topic("known", partitions=1, replication_factor=3)
            await client.wait_for_leaders("known")
            await append_all(client, "known", [b"k"], producer=31)
        await wait_replicas_hold(cluster, "known", [b"k"])
        assert cluster.stop_node("n2") == 0
        partitions = cluster.nodes["n2"].data_dir / "partitions"
        (partitions / "known" / "0" / "topic.json").unlink()
        shutil.copytree(partitions / "known", partitions / "stranger")
        cluster.start_node("n2")
        cluster.wait_ready(["n2"])
        quarantine = cluster.nodes["n2"].data_dir / "quarantine" / "stranger"

        async def moved_aside() -> bool:
            return quarantine.exists() and not (partitions / "stranger" / "0").exists()

        await wait_until("n2 to move the unknown topic's replica aside", moved_aside)
        kept = list(quarantine.iterdir())
        assert len(kept) == 1 and any(kept[0].glob("*.log")), kept
        assert (partitions / "known" / "0" / "topic.json").exists()
        await wait_replicas_hold(cluster, "known", [b"k"])
    finally:
        cluster.stop()
