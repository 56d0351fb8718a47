"""Transactions under kill -9 (docs/transactions.md), against three real broker processes:
the coordinator's broker (the metadata leader) killed while transactions end, then a
partition leader killed while they commit. Afterwards every transaction is committed or
aborted in every partition it wrote: a checker reads each partition read_committed and finds
each transaction whole or absent, every one acknowledged committed whole, every one aborted
absent."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from laminar.client import AsyncClient, LaminarError, Record
from laminar.local_cluster import LocalCluster

from .conftest import make_cluster, wait_until

pytestmark = pytest.mark.integration

TOPICS = ("tx-a", "tx-b")
PARTITIONS = 3
PRODUCERS = 4
#: Bounds of the load: transactions per producer, and seconds in all.
MAX_TRANSACTIONS = 400
MAX_LOAD_S = 60.0
SETTLE_S = 60.0


@dataclass
class Outcomes:
    """What the producers were told of each transaction (by its tag)."""

    values: dict[str, set[tuple[str, int, bytes]]] = field(default_factory=dict)
    committed: set[str] = field(default_factory=set)
    aborted: set[str] = field(default_factory=set)
    unknown: set[str] = field(default_factory=set)  # an error left the outcome open


async def produce(cluster: LocalCluster, n: int, stop: asyncio.Event, out: Outcomes) -> None:
    """Transactions of two or three partitions each, every fifth aborted, until `stop`."""
    rng = random.Random(n)
    async with AsyncClient(cluster.urls, token=cluster.token, timeout_s=20.0) as client:
        for i in range(MAX_TRANSACTIONS):
            if stop.is_set():
                return
            tag = f"p{n}-{i}"
            parts = rng.sample([(t, p) for t in TOPICS for p in range(PARTITIONS)], 3)
            commit = i % 5 != 4
            out.values[tag] = {(t, p, f"{tag}/{t}/{p}".encode()) for t, p in parts}
            try:
                async with client.transaction(f"producer-{n}", timeout_ms=10_000) as tx:
                    for topic, partition in parts:
                        value = f"{tag}/{topic}/{partition}".encode()
                        await tx.append(topic, partition, [Record(value)])
                    ended = await tx.end(commit=commit)
                (out.committed if ended.committed else out.aborted).add(tag)
            except LaminarError:
                out.unknown.add(tag)
                await asyncio.sleep(0.2)


async def check(cluster: LocalCluster, out: Outcomes) -> None:
    """Every partition read_committed, once no transaction is open: each transaction whole
    or absent, as the producers were told."""
    async with AsyncClient(cluster.urls, token=cluster.token, timeout_s=30.0) as client:
        seen: set[tuple[str, int, bytes]] = set()
        for topic in TOPICS:
            for partition in range(PARTITIONS):

                async def settled(t: str = topic, p: int = partition) -> object:
                    # no transaction open: the stable end is the log's end
                    described = await client.describe_topic(t)
                    end = described.partition_states[p].commit_index
                    read = await client.read(t, p, end, isolation="read_committed")
                    uncommitted = await client.read(t, p, end, isolation="read_uncommitted")
                    return read.next_index == uncommitted.next_index

                await wait_until(f"{topic}/{partition} settled", settled, SETTLE_S)
                position = 0
                for _ in range(10_000):  # bounded: each read moves on
                    read = await client.read(topic, partition, position, max_records=10_000)
                    seen.update((topic, partition, r.value or b"") for r in read.records)
                    if read.next_index <= position or not read.records:
                        break
                    position = read.next_index
    partial = []
    for tag, values in out.values.items():
        present = values & seen
        if present and present != values:
            partial.append(tag)
        if tag in out.committed:
            assert present == values, f"committed {tag} lost {sorted(values - present)}"
        if tag in out.aborted:
            assert not present, f"aborted {tag} is visible: {sorted(present)}"
    assert not partial, f"partial transactions: {partial}"


async def metadata_leader(cluster: LocalCluster) -> str:
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        info = await client.cluster()
        assert info.metadata_leader is not None
        return info.metadata_leader


async def partition_leader(cluster: LocalCluster, topic: str, partition: int) -> str:
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        leader = (await client.describe_topic(topic)).partition_states[partition].leader
        assert leader is not None
        return leader


async def run_with_kill(cluster: LocalCluster, victim: str) -> Outcomes:
    """The load, with `victim` killed -9 once transactions have committed, and restarted."""
    out = Outcomes()
    stop = asyncio.Event()
    producers = [asyncio.ensure_future(produce(cluster, n, stop, out)) for n in range(PRODUCERS)]
    started = time.monotonic()

    async def some_committed() -> object:
        return len(out.committed) >= 20 or len(out.committed)

    try:
        await wait_until("transactions to commit", some_committed, MAX_LOAD_S)
        cluster.kill(victim)
        before = len(out.committed)

        async def more_committed() -> object:
            return len(out.committed) >= before + 20 or len(out.committed)

        await wait_until("commits without the victim", more_committed, MAX_LOAD_S)
        cluster.start_node(victim)
        await asyncio.to_thread(cluster.wait_ready)
        after = len(out.committed)

        async def committed_again() -> object:
            return len(out.committed) >= after + 20 or len(out.committed)

        await wait_until("commits with the victim back", committed_again, MAX_LOAD_S)
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.gather(*producers), MAX_LOAD_S)
    assert time.monotonic() - started < 4 * MAX_LOAD_S
    return out


async def setup(cluster: LocalCluster) -> None:
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        for topic in TOPICS:
            await client.create_topic(topic, partitions=PARTITIONS, replication_factor=3)
            await client.wait_for_leaders(topic)


async def test_killing_the_coordinator_while_transactions_end_leaves_none_partial(
    tmp_path: Path,
) -> None:
    cluster = make_cluster(tmp_path / "coordinator")
    try:
        await setup(cluster)
        out = await run_with_kill(cluster, await metadata_leader(cluster))
        assert out.committed and out.aborted
        await check(cluster, out)
    finally:
        cluster.stop()


async def test_killing_a_partition_leader_while_transactions_commit_leaves_none_partial(
    tmp_path: Path,
) -> None:
    cluster = make_cluster(tmp_path / "partition")
    try:
        await setup(cluster)
        leader = await partition_leader(cluster, TOPICS[0], 0)
        if leader == await metadata_leader(cluster):  # a partition leader alone
            leader = await partition_leader(cluster, TOPICS[1], 1)
        out = await run_with_kill(cluster, leader)
        assert out.committed and out.aborted
        await check(cluster, out)
    finally:
        cluster.stop()


async def test_a_transaction_prepared_when_the_coordinator_dies_is_finished_by_the_next(
    tmp_path: Path,
) -> None:
    """Deterministically between PREPARE and COMPLETE: one partition of the transaction has
    its only replica on a stopped broker, so its marker cannot be written; the coordinator's
    broker is then killed -9. The stopped broker goes on, and the new metadata leader writes
    the marker and completes the transaction: its records are readable in both partitions."""
    cluster = make_cluster(tmp_path / "prepared")
    try:
        async with AsyncClient(cluster.urls, token=cluster.token) as admin:
            await admin.create_topic("wide", partitions=1, replication_factor=3)
            await admin.create_topic("narrow", partitions=1, replication_factor=1)
            await admin.wait_for_leaders("wide")
            lonely = (await admin.wait_for_leaders("narrow")).partition_states[0].leader
            assert lonely is not None

            # the stopped broker must not lead the metadata: the end's proposal would wait
            # for it (a client that knows it as the leader asks it, and hears nothing)
            async def led_elsewhere() -> object:
                leader = (await admin.cluster()).metadata_leader
                if leader == lonely:
                    await admin.handoff(lonely)
                return (leader is not None and leader != lonely) or leader

            await wait_until("the metadata led by another broker", led_elsewhere)
        # bootstrapped from the others: a stopped broker answers nothing, not even "no"
        others = [node.api_url for name, node in cluster.nodes.items() if name != lonely]
        async with AsyncClient(others, token=cluster.token, timeout_s=30.0) as client:
            producer = await client.transactional_producer("prepared", timeout_ms=600_000)
            tx = producer.transaction()
            await tx.append("wide", 0, [Record(b"w")])
            await tx.append("narrow", 0, [Record(b"n")])
            pids = cluster.serving_pids()
            os.kill(pids[lonely], signal.SIGSTOP)
            try:

                async def prepared() -> object:
                    with contextlib.suppress(LaminarError, TimeoutError):
                        await asyncio.wait_for(tx.end(commit=True), 2.0)
                    phase = (await client.describe_transaction("prepared")).phase
                    return phase == "prepare_commit" or phase

                await wait_until("the commit prepared", prepared)
                coordinator = (await client.cluster()).metadata_leader
                assert coordinator not in (None, lonely)  # (the metadata leads without it)
                cluster.kill(str(coordinator))
            finally:
                os.kill(pids[lonely], signal.SIGCONT)

            async def complete() -> object:
                phase = (await client.describe_transaction("prepared")).phase
                return phase == "empty" or phase

            await wait_until("the next coordinator to complete it", complete, SETTLE_S)
            for topic, value in (("wide", b"w"), ("narrow", b"n")):
                read = await client.read(topic, 0, 0, wait_ms=10_000)
                assert [r.value for r in read.records] == [value], topic
    finally:
        cluster.stop()
