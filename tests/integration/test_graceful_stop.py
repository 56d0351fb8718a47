"""A graceful stop moves no data (issue 26): three real brokers, an RF 3 topic, one broker
stopped with SIGTERM. It leaves, and keeps its replicas in placement for as long as it is
away, far past `--dead-grace-ms` (one second here): every partition is under-replicated
(fewer in sync than the topic's replication factor) in `laminar cluster status`, the
metric and the console. Restarted, it catches up: every replica in sync, nothing moved.

"Nothing moved" is not a sleep: each survivor's metrics say when it has seen the broker away
for longer than the grace (`laminar_placement_away_seconds`), and then that it has run a
whole placement sweep since (`laminar_placement_control_passes_total`), in which a broker
no longer counted would have been replaced."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from laminar.client import AsyncClient
from laminar.local_cluster import LocalCluster
from laminar.log.batch import Record
from laminar.node.core import CONTROL_SWEEP_PASSES
from laminar.server.console.session import COOKIE_NAME

from .conftest import make_cluster, wait_until
from .test_metrics import Families, samples, scrape_all

pytestmark = pytest.mark.integration

GRACE_MS = 1_000
TOPIC, PARTITIONS, RF = "kept", 6, 3
GONE = "n3"


def replica_sets(described: Any) -> dict[int, frozenset[str]]:
    return {s.partition: frozenset(s.replicas) for s in described.partition_states}


async def in_sync(client: AsyncClient, wanted: int) -> object:
    """True once every partition has a leader, RF replicas and `wanted` of them in sync."""
    states = (await client.describe_topic(TOPIC)).partition_states
    if all(s.leader and len(s.replicas) == RF and len(s.in_sync) == wanted for s in states):
        return True
    return [(s.partition, s.leader, s.replicas, s.in_sync) for s in states]


def cluster_status(cluster: LocalCluster, urls: list[str]) -> dict[str, Any]:
    """`laminar cluster status --json` through `urls`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMINAR_")}
    brokers = ",".join(urls)
    result = subprocess.run(
        [sys.executable, "-m", "laminar", "cluster", "status", "--json", "--brokers", brokers],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "LAMINAR_TOKEN_FILE": str(cluster.token_file)},
    )
    assert result.returncode == 0, result.stderr
    status: dict[str, Any] = json.loads(result.stdout)
    return status


def topic_row(status: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = next(t for t in status["topics"] if t["name"] == TOPIC)
    return row


async def none_under_replicated(cluster: LocalCluster, urls: list[str]) -> None:
    """Wait for `laminar cluster status` through `urls` to count no partition under-replicated.
    Read once after the replicas were seen in sync, it races the rebalance: a leadership it
    moves (back to a returned broker, or after the first elections) starts with only its new
    leader in sync, until the followers acknowledge an entry of the new leader's term."""

    async def counted() -> object:
        row = topic_row(cluster_status(cluster, urls))
        return True if row["under_replicated"] == 0 else row

    await wait_until("cluster status to count none under-replicated", counted)


def leaders_report(scrapes: dict[str, Families], name: str) -> list[float]:
    """`name`'s values for the topic's partitions, from the brokers that lead them."""
    return [
        value
        for families in scrapes.values()
        for labels, value in samples(families, name, topic=TOPIC)
        if samples(families, "laminar_partition_leader", **labels)[0][1] == 1.0
    ]


async def console_summary(session: aiohttp.ClientSession, base: str, token: str) -> str:
    """The topic page's summary line ("N partitions; M under-replicated.")."""
    async with session.post(
        base + "/console/login", data={"token": token}, allow_redirects=False
    ) as login:
        assert login.status == 303, await login.text()
        cookie = login.cookies[COOKIE_NAME].value
    headers = {"Cookie": f"{COOKIE_NAME}={cookie}"}
    async with session.get(f"{base}/console/topics/{TOPIC}", headers=headers) as page:
        assert page.status == 200
        text = await page.text()
    line = next(line for line in text.splitlines() if "under-replicated." in line)
    return re.sub(r"<[^>]+>", "", line).strip()


async def test_a_graceful_stop_moves_nothing_and_counts_every_partition_under_replicated(
    tmp_path: Path,
) -> None:
    cluster = make_cluster(tmp_path / "stop", extra_args=("--dead-grace-ms", str(GRACE_MS)))
    try:
        async with AsyncClient(cluster.urls, token=cluster.token) as client:
            await client.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=RF)
            await wait_until("every replica in sync", lambda: in_sync(client, RF))
            before = replica_sets(await client.describe_topic(TOPIC))
            assert all(GONE in replicas for replicas in before.values())
            for partition in range(PARTITIONS):
                await client.append(TOPIC, partition, [Record(value=b"before")])
        await none_under_replicated(cluster, cluster.urls)

        assert cluster.stop_node(GONE) == 0  # SIGTERM: it hands over and leaves
        up = [node.api_url for node_id, node in cluster.nodes.items() if node_id != GONE]
        async with aiohttp.ClientSession() as session:
            # the event: each survivor has seen n3 away longer than the grace, and then ran
            # a whole placement sweep (every replica it hosts visited)
            passes_then: dict[str, float] = {}

            async def grace_over() -> object:
                scrapes = await scrape_all(session, up)
                for url, families in scrapes.items():
                    away = samples(families, "laminar_placement_away_seconds", broker=GONE)
                    if [labels["state"] for labels, _ in away] != ["left"]:
                        return f"{url}: {away}"
                    if away[0][1] <= GRACE_MS / 1000:
                        return f"{url}: away {away[0][1]} s"
                    [(_, passes)] = samples(families, "laminar_placement_control_passes_total")
                    passes_then.setdefault(url, passes)
                return True

            await wait_until(f"the survivors to see {GONE} away past the grace", grace_over)

            async def swept() -> object:
                scrapes = await scrape_all(session, up)
                behind = {}
                for url, families in scrapes.items():
                    [(_, passes)] = samples(families, "laminar_placement_control_passes_total")
                    if passes <= passes_then[url] + CONTROL_SWEEP_PASSES:
                        behind[url] = passes
                return behind or True

            await wait_until("a whole placement sweep after the grace", swept)
            for url, families in (await scrape_all(session, up)).items():
                away = samples(families, "laminar_placement_away_seconds", broker=GONE)
                assert [labels["replicas"] for labels, _ in away] == ["kept"], url

            async with AsyncClient(up, token=cluster.token) as client:
                await wait_until("two of three in sync", lambda: in_sync(client, RF - 1))
                described = await client.describe_topic(TOPIC)
                assert replica_sets(described) == before  # nothing moved
                for partition in range(PARTITIONS):  # and it serves, with a majority
                    await client.append(TOPIC, partition, [Record(value=b"while away")])

            # every partition counts as under-replicated, wherever it is counted
            row = topic_row(cluster_status(cluster, up))
            assert (row["under_replicated"], row["leaderless"]) == (PARTITIONS, 0)
            members = {m["id"]: m for m in cluster_status(cluster, up)["members"]}
            assert members[GONE]["state"] == "left"
            assert members[GONE]["replicas_hosted"] == PARTITIONS

            async def metrics_count() -> object:
                scrapes = await scrape_all(session, up)
                under = leaders_report(scrapes, "laminar_partition_under_replicated")
                replicas = leaders_report(scrapes, "laminar_partition_replicas")
                synced = leaders_report(scrapes, "laminar_partition_in_sync_replicas")
                wanted = ([1.0] * PARTITIONS, [RF] * PARTITIONS, [RF - 1] * PARTITIONS)
                got = (under, replicas, synced)
                return True if got == wanted else got

            await wait_until("the leaders' metrics to count them", metrics_count)
            summary = await console_summary(session, up[0], cluster.token)
            assert summary == f"{PARTITIONS} partitions; {PARTITIONS} under-replicated."

        cluster.start_node(GONE)
        cluster.wait_ready([GONE])
        async with AsyncClient(cluster.urls, token=cluster.token) as client:
            await wait_until("every replica in sync again", lambda: in_sync(client, RF))
            assert replica_sets(await client.describe_topic(TOPIC)) == before
        await none_under_replicated(cluster, cluster.urls)
        async with aiohttp.ClientSession() as session:

            async def console_clear() -> object:  # (the same race: `none_under_replicated`)
                summary = await console_summary(session, cluster.urls[0], cluster.token)
                return (
                    True if summary == f"{PARTITIONS} partitions; 0 under-replicated." else summary
                )

            await wait_until("the console to count none under-replicated", console_clear)
    finally:
        cluster.stop()


async def test_a_broker_dead_past_the_grace_is_replaced_and_a_shrunk_set_still_counts(
    tmp_path: Path,
) -> None:
    """kill -9 instead: past the grace placement replaces the dead broker, and with no other
    broker to take its place every partition's replica set shrinks to two. Two of two in
    sync is still under-replicated for a topic of replication factor 3, in `laminar cluster
    status`, the metric and the console. Back, it is given its replicas again."""
    cluster = make_cluster(tmp_path / "kill", extra_args=("--dead-grace-ms", str(GRACE_MS)))
    try:
        async with AsyncClient(cluster.urls, token=cluster.token) as client:
            await client.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=RF)
            await wait_until("every replica in sync", lambda: in_sync(client, RF))
        cluster.kill(GONE)
        up = [node.api_url for node_id, node in cluster.nodes.items() if node_id != GONE]
        async with AsyncClient(up, token=cluster.token) as client:

            async def shrunk() -> object:
                states = (await client.describe_topic(TOPIC)).partition_states
                if all(s.leader and len(s.replicas) == len(s.in_sync) == 2 for s in states):
                    return True
                return [(s.partition, s.leader, s.replicas, s.in_sync) for s in states]

            await wait_until(f"{GONE} replaced: two replicas, both in sync", shrunk)
        row = topic_row(cluster_status(cluster, up))
        assert (row["under_replicated"], row["leaderless"]) == (PARTITIONS, 0)
        async with aiohttp.ClientSession() as session:

            async def metrics_count() -> object:
                scrapes = await scrape_all(session, up)
                under = leaders_report(scrapes, "laminar_partition_under_replicated")
                replicas = leaders_report(scrapes, "laminar_partition_replicas")
                synced = leaders_report(scrapes, "laminar_partition_in_sync_replicas")
                wanted = ([1.0] * PARTITIONS, [RF - 1] * PARTITIONS, [RF - 1] * PARTITIONS)
                got = (under, replicas, synced)
                return True if got == wanted else got

            await wait_until("the leaders' metrics to count them", metrics_count)
            for url, families in (await scrape_all(session, up)).items():
                away = samples(families, "laminar_placement_away_seconds", broker=GONE)
                assert [(labels["state"], labels["replicas"]) for labels, _ in away] == [
                    ("dead", "replaced")
                ], url
            summary = await console_summary(session, up[0], cluster.token)
            assert summary == f"{PARTITIONS} partitions; {PARTITIONS} under-replicated."
        cluster.start_node(GONE)
        cluster.wait_ready([GONE])
        async with AsyncClient(cluster.urls, token=cluster.token) as client:
            await wait_until("every replica in sync again", lambda: in_sync(client, RF), 120)
        await none_under_replicated(cluster, cluster.urls)
    finally:
        cluster.stop()
