"""Three (and four) real broker processes on loopback: produce and consume 100k records,
kill -9 a partition leader under load, add a broker and drain one — nothing acknowledged is
ever lost or duplicated."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from laminar.client import AsyncClient, Consumer, Producer
from laminar.client.errors import LaminarError, NotFound
from laminar.local_cluster import LocalCluster
from laminar.log.batch import Record
from laminar.placement import Candidate, place

from .conftest import make_cluster, wait_until

pytestmark = pytest.mark.integration


async def leaders_ready(client: AsyncClient, topic: str, rf: int) -> object:
    described = await client.describe_topic(topic)
    states = described.partition_states
    if all(p.leader and len(p.in_sync) == rf for p in states):
        return True
    return [(p.partition, p.leader, p.in_sync) for p in states]


async def read_all(client: AsyncClient, topic: str, partition: int) -> list[tuple[int, bytes]]:
    """(index, value) of every record in the partition, in order."""
    out: list[tuple[int, bytes]] = []
    position = 0
    while True:
        result = await client.read(topic, partition, position, max_records=10_000)
        out.extend((r.index, r.value or b"") for r in result.records)
        if result.next_index <= position or result.next_index > result.commit_index:
            return out
        position = result.next_index


async def test_produce_and_consume_100k_in_order(cluster3: LocalCluster) -> None:
    topic, partitions, total = "events", 6, 100_000
    async with AsyncClient(cluster3.urls, token=cluster3.token) as client:
        await client.create_topic(topic, partitions=partitions, replication_factor=3)
        await wait_until("leaders", lambda: leaders_ready(client, topic, 3))
        producer = Producer(client, topic, linger_ms=5)
        futures = []
        for i in range(total):
            key = f"key-{i % 997}".encode()
            futures.append(await producer.send(f"{i}".encode(), key=key))
        await producer.flush()
        acked = [f.result() for f in futures]
        await producer.close()
        assert len({(m.partition, m.index) for m in acked}) == total

        consumer = Consumer(client, topic, start="earliest", wait_ms=200)
        seen: dict[int, list[int]] = defaultdict(list)
        by_key: dict[bytes, list[int]] = defaultdict(list)
        count = 0
        async for partition, record in consumer:
            seen[partition].append(record.index)
            assert record.key is not None and record.value is not None
            by_key[record.key].append(int(record.value))
            count += 1
            if count == total:
                break
        await consumer.close()
        for partition, indexes in seen.items():
            assert indexes == sorted(set(indexes)), f"partition {partition} out of order"
        for key, values in by_key.items():
            assert values == sorted(values), f"{key!r} out of order"
        assert sorted(v for values in by_key.values() for v in values) == list(range(total))
        described = await client.describe_topic(topic)
        for state in described.partition_states:
            assert state.leader in state.replicas and sorted(state.in_sync) == ["n1", "n2", "n3"]
            assert state.commit_index >= 0 and state.log_end == state.commit_index + 1


class Load:
    """Appends unique values to every partition until stopped; remembers what was acked."""

    def __init__(self, client: AsyncClient, topic: str, partitions: int) -> None:
        self.client = client
        self.topic = topic
        self.partitions = partitions
        self.acked: dict[int, set[bytes]] = defaultdict(set)
        self.last_ack_s: dict[int, float] = {}
        self.failures = 0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for partition in range(self.partitions):
            self._tasks.append(asyncio.create_task(self._run(partition)))

    async def _run(self, partition: int) -> None:
        producer_id = random.getrandbits(62) + 1
        sequence = 0
        n = 0
        while not self._stop.is_set():
            values = [f"p{partition}-{n + i}".encode() for i in range(20)]
            try:
                result = await self.client.append(
                    self.topic,
                    partition,
                    [Record(value=v) for v in values],
                    producer_id=producer_id,
                    sequence=sequence,
                )
            except (LaminarError, OSError, TimeoutError):
                self.failures += 1
                await asyncio.sleep(0.1)
                continue  # retried with the same sequence: deduplicated if it was written
            assert result.count == len(values)
            self.acked[partition].update(values)
            self.last_ack_s[partition] = time.monotonic()
            sequence += len(values)
            n += len(values)

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def check(self) -> None:
        """Every acknowledged value is in its partition exactly once; nothing else is twice."""
        for partition in range(self.partitions):
            values = [v for _, v in await read_all(self.client, self.topic, partition)]
            assert len(values) == len(set(values)), f"partition {partition} has duplicates"
            missing = self.acked[partition] - set(values)
            assert not missing, f"partition {partition} lost {len(missing)} acknowledged records"


async def test_every_broker_holds_the_partition_status_its_leaders_report(
    cluster3: LocalCluster,
) -> None:
    """The partition status table (`GET /v1/partitions`, asked of each broker) agrees with what
    each partition's leader says of itself (`GET /v1/nodes/{id}/partitions`, answered by that
    node): leader, term and replicas; and again once leaderships moved (a hand-off)."""
    topic, partitions = "status-table", 6
    async with AsyncClient(cluster3.urls, token=cluster3.token) as client:
        await client.create_topic(topic, partitions=partitions, replication_factor=3)
        await wait_until("leaders", lambda: leaders_ready(client, topic, 3))

        async def agree() -> object:
            live: dict[int, Any] = {}
            for node in cluster3.nodes:
                for p in (await client.node_partitions(node)).partitions:
                    best = live.get(p.partition)
                    if (
                        p.topic == topic
                        and p.role == "leader"
                        and (best is None or p.term > best.term)
                    ):
                        live[p.partition] = p
            if set(live) != set(range(partitions)):
                return f"leaders {sorted(live)}"
            for url in cluster3.urls:
                async with AsyncClient([url], token=cluster3.token) as one:
                    table = {row.partition: row for row in await one.partitions(topic)}
                for n, leader in live.items():
                    row = table.get(n)
                    if row is None or (row.leader, row.term, row.replicas) != (
                        leader.leader, leader.term, leader.voters
                    ):  # fmt: skip
                        return f"{url}: partition {n} {row} but its leader says {leader}"
            return True

        await wait_until("every broker's table agreeing with the leaders", agree)
        moved = (await client.describe_topic(topic)).partition_states[0].leader
        assert moved is not None
        await client.handoff(moved)
        await wait_until("the tables agreeing after the hand-off", agree)
        await client.delete_topic(topic)


async def test_kill_leader_under_load(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path / "kill")
    try:
        topic = "chaos"
        async with AsyncClient(cluster.urls, token=cluster.token, timeout_s=20) as client:
            await client.create_topic(topic, partitions=3, replication_factor=3)
            await wait_until("leaders", lambda: leaders_ready(client, topic, 3))
            load = Load(client, topic, 3)
            load.start()
            await asyncio.sleep(2)
            victim = (await client.describe_topic(topic)).partition_states[0].leader
            assert victim is not None
            cluster.kill(victim)
            killed_at = time.monotonic()

            async def partition0_moves() -> object:
                return load.last_ack_s.get(0, 0) > killed_at + 0.5

            await wait_until("appends to partition 0 after the kill", partition0_moves)
            recovered_s = load.last_ack_s[0] - killed_at
            await asyncio.sleep(1)
            cluster.start_node(victim)
            cluster.wait_ready([victim])
            await asyncio.sleep(2)
            await load.stop()

            async def caught_up() -> object:
                hosted = (await client.node_partitions(victim)).partitions
                described = await client.describe_topic(topic)
                ends = {p.partition: p.log_end for p in described.partition_states}
                done = len(hosted) == 3 and all(p.log_end == ends[p.partition] for p in hosted)
                return True if done else hosted

            await wait_until(f"{victim} to catch up", caught_up)
            await load.check()
            assert sum(len(v) for v in load.acked.values()) > 0
            print(f"partition 0 served again {recovered_s:.2f} s after kill -9 of {victim}")
    finally:
        cluster.stop()


def target(group: str, nodes: list[str], draining: set[str], rf: int) -> list[str]:
    return sorted(place(group, [Candidate(n, draining=n in draining) for n in nodes], rf))


async def test_add_broker_and_drain(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path / "moves")
    try:
        topic, partitions, rf = "moves", 8, 2
        async with AsyncClient(cluster.urls, token=cluster.token, timeout_s=20) as client:
            await client.create_topic(topic, partitions=partitions, replication_factor=rf)
            await wait_until("leaders", lambda: leaders_ready(client, topic, rf))
            load = Load(client, topic, partitions)
            load.start()
            await asyncio.sleep(1)
            cluster.add_node()
            nodes = ["n1", "n2", "n3", "n4"]

            async def placed(draining: set[str]) -> object:
                states = (await client.describe_topic(topic)).partition_states
                wrong = [
                    (s.partition, s.replicas, s.learners)
                    for s in states
                    if sorted(s.replicas) != target(f"{topic}/{s.partition}", nodes, draining, rf)
                    or s.learners
                ]
                return wrong if wrong else True

            await wait_until("placement with n4", lambda: placed(set()), 90)
            hosted = await client.node_partitions("n4")
            assert hosted.partitions, "n4 hosts nothing although placement gives it partitions"
            await client.drain("n2")
            await wait_until("placement without n2", lambda: placed({"n2"}), 90)

            async def n2_empty() -> object:
                hosted = await client.node_partitions("n2")
                return True if not hosted.partitions else [p.partition for p in hosted.partitions]

            await wait_until("n2 to host nothing", n2_empty, 60)
            await asyncio.sleep(2)  # and it stays that way (no replica comes back)
            assert await n2_empty() is True
            await load.stop()
            await load.check()
    finally:
        cluster.stop()


async def test_handoff_moves_a_brokers_leaderships_away(tmp_path: Path) -> None:
    """POST /v1/nodes/{node}/handoff (what the pod's preStop runs): served by that node (any
    broker redirects there); afterwards it leads nothing and every partition has a leader."""
    cluster = make_cluster(tmp_path / "handoff")
    try:
        async with AsyncClient(cluster.urls, token=cluster.token, timeout_s=20) as client:
            await client.create_topic("handoff", partitions=6, replication_factor=3)
            described = await client.wait_for_leaders("handoff")
            counts: dict[str, int] = {}
            for state in described.partition_states:
                assert state.leader is not None
                counts[state.leader] = counts.get(state.leader, 0) + 1
            busiest = max(counts, key=lambda n: counts[n])
            other = next(n for n in cluster.nodes if n != busiest)
            via = [cluster.nodes[other].api_url]
            async with AsyncClient(via, token=cluster.token, timeout_s=20) as via_other:
                assert await via_other.handoff(busiest) == 0

            async def moved() -> object:
                states = (await client.describe_topic("handoff")).partition_states
                leaders = [s.leader for s in states]
                return None not in leaders and busiest not in leaders

            await wait_until("leaders moved off the broker", moved)
            with pytest.raises(NotFound):
                await client.handoff("n99")
        cli = subprocess.run(
            [sys.executable, "-m", "laminar", "node", "handoff", "--brokers", cluster.urls[0]],
            env={**os.environ, "LAMINAR_NODE_ID": other,
                 "LAMINAR_TOKEN_FILE": str(cluster.token_file)},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert cli.returncode == 0, cli.stderr
        assert cli.stdout.strip() == f"{other}: leads 0 groups"
    finally:
        cluster.stop()
