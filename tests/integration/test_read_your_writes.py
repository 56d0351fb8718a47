"""Read-your-writes for records (laminar.contract, `Laminar-Acked-Index`) against real broker
processes: a read that names the highest index its client saw acknowledged is served only
through that index, by the replica asked once it has committed that far, else by the leader.
A follower learns of a commit a message after the leader acknowledged it, so without this a
read right after an append could miss it (the sync client's test once did)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from laminar.client import AsyncClient, Record
from laminar.client.errors import LaminarError
from laminar.contract import ACKED_INDEX_HEADER, ACKED_WAIT_S
from laminar.local_cluster import LocalCluster
from laminar.partition.replica import READ_WANT_S

from .conftest import auth, make_cluster

pytestmark = pytest.mark.integration


async def topic_with_records(cluster: LocalCluster, client: AsyncClient) -> tuple[str, int]:
    """A new one-partition RF3 topic holding three records: (name, the last one's index)."""
    name = f"ryw-{uuid.uuid4().hex[:10]}"
    await client.create_topic(name, partitions=1, replication_factor=3)
    await client.wait_for_leaders(name)
    result = await client.append(name, 0, [Record(b"a"), Record(b"b"), Record(b"c")])
    return name, result.base_index + result.count - 1


async def raw_read(
    cluster: LocalCluster, base: str, topic: str, acked: str | None
) -> tuple[int, dict[str, str], Any]:
    """A JSON read from index 0 at `base`, redirects not followed: (status, headers, body)."""
    headers = auth(cluster) | ({} if acked is None else {ACKED_INDEX_HEADER: acked})
    url = f"{base}/v1/topics/{topic}/partitions/0/records?from=0"
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers=headers, allow_redirects=False) as response,
    ):
        return response.status, dict(response.headers), await response.json()


def roles(cluster: LocalCluster, leader: str) -> tuple[str, str]:
    """(the leader's URL, a follower's URL)."""
    follower = next(n for n in cluster.nodes if n != leader)
    return cluster.nodes[leader].api_url, cluster.nodes[follower].api_url


async def test_a_follower_serves_through_the_acked_index_or_sends_the_reader_to_the_leader(
    cluster3: LocalCluster,
) -> None:
    async with AsyncClient(cluster3.urls, token=cluster3.token) as client:
        topic, last = await topic_with_records(cluster3, client)
        described = await client.describe_topic(topic)
        leader, follower = roles(cluster3, described.partition_states[0].leader or "")
        # committed that far: served where asked, through the index
        status, headers, body = await raw_read(cluster3, follower, topic, str(last))
        assert status == 200, body
        assert body["commit_index"] >= last
        assert [r["value"] for r in body["records"]][-3:] == ["a", "b", "c"]
        # an index the follower never commits: after waiting, to the leader
        started = time.monotonic()
        status, headers, body = await raw_read(cluster3, follower, topic, str(last + 1000))
        assert status == 307, body
        assert time.monotonic() - started >= ACKED_WAIT_S * 0.9
        assert headers["Location"].startswith(leader + "/v1/topics/")
        assert body["error"]["code"] == "not_leader"
        # at the leader an index past its log end was never written there (a deleted topic of
        # the same name): not waited for
        status, _, body = await raw_read(cluster3, leader, topic, str(last + 1000))
        assert status == 200, body
        assert len(body["records"]) == 3
        for bad in ("-1", "x", "9" * 20, "1.5", str(2**63)):
            status, _, body = await raw_read(cluster3, follower, topic, bad)
            assert status == 400 and body["error"]["code"] == "bad_request", (bad, body)
            assert ACKED_INDEX_HEADER in body["error"]["message"]
        await client.delete_topic(topic)


async def test_a_client_reads_what_it_appended_and_a_recreated_topic_does_not_hold_it(
    cluster3: LocalCluster,
) -> None:
    """Every read right after an append returns it, wherever the client routes the read.
    Another client then deletes the topic and makes it again: the first one's acknowledged
    index belongs to the old log, and its reads of the new one are still answered."""
    async with (
        AsyncClient(cluster3.urls, token=cluster3.token) as client,
        AsyncClient(cluster3.urls, token=cluster3.token) as other,
    ):
        topic, _ = await topic_with_records(cluster3, client)
        for n in range(50):  # bounded: each append's own read
            value = n.to_bytes(4, "big")
            result = await client.append(topic, 0, [Record(value)])
            read = await client.read(topic, 0, result.base_index)
            assert [r.value for r in read.records][:1] == [value], (n, read)
        await other.delete_topic(topic)
        await other.create_topic(topic, partitions=1, replication_factor=3)
        await other.wait_for_leaders(topic)
        await other.append(topic, 0, [Record(b"new")])
        read = await client.read(topic, 0, 0)
        assert [r.value for r in read.records] == [b"new"]
        await other.delete_topic(topic)


async def test_a_follower_told_of_commits_lazily_asks_its_leader_before_it_serves_a_read(
    cluster3: LocalCluster,
) -> None:
    """A follower nobody read from for `READ_WANT_S` is not told of each commit at once
    (`laminar.raft.raft`, "Commit notices on demand"). A read it serves right after an append
    was acknowledged, without the acknowledged index, still returns that append: the follower
    asked its leader for the commit index first."""
    async with AsyncClient(cluster3.urls, token=cluster3.token) as client:
        topic, _ = await topic_with_records(cluster3, client)
        described = await client.describe_topic(topic)
        _, follower = roles(cluster3, described.partition_states[0].leader or "")
        for n in range(3):  # bounded: each round waits for the follower to stop wanting them
            await asyncio.sleep(READ_WANT_S + 0.2)
            value = f"v{n}"
            await client.append(topic, 0, [Record(value.encode())])  # its answer: "lazily"
            status, _, body = await raw_read(cluster3, follower, topic, None)
            assert status == 200, body
            assert [r["value"] for r in body["records"]][-1] == value, (n, body)
        await client.delete_topic(topic)


async def test_a_leader_without_a_quorum_answers_503_short_of_the_index(tmp_path: Path) -> None:
    """The index is in the leader's log but not committed (both followers stopped): a read
    naming it is 503, nothing served short of it (and the same once the leader, cut off, steps
    down and knows no leader to send the reader to)."""
    cluster = make_cluster(tmp_path / "quorum")
    try:
        async with AsyncClient(cluster.urls, token=cluster.token) as client:
            topic, last = await topic_with_records(cluster, client)
            leader_id = (await client.describe_topic(topic)).partition_states[0].leader or ""
            followers = [n for n in cluster.nodes if n != leader_id]
            pids = cluster.serving_pids()
            for node in followers:
                os.kill(pids[node], signal.SIGSTOP)
            try:
                with pytest.raises(LaminarError) as raised:  # proposed, never committed
                    await client.append(topic, 0, [Record(b"d")], timeout_s=2.0)
                assert raised.value.ambiguous, raised.value
                leader = cluster.nodes[leader_id].api_url
                status, _, body = await raw_read(cluster, leader, topic, str(last + 1))
                assert status == 503, body
                assert body["error"]["code"] == "unavailable"
                status, _, body = await raw_read(cluster, leader, topic, str(last))
                assert status == 200, body
            finally:
                for node in followers:
                    os.kill(pids[node], signal.SIGCONT)
    finally:
        cluster.stop()
