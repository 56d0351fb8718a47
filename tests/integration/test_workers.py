"""Workers (issue 23, docs/workers.md): three real brokers of two worker processes each.

* ownership: every partition has one replica on each broker placement picks, held by the
  worker that owns it there;
* kill -9 of one worker: only the partitions it led change leader; its supervisor starts it
  again, and every acknowledged record of every partition is still there;
* a client whose routing is stale (it sends a partition's requests to a worker that does not
  lead it) still succeeds: the worker answers 307 to the leader, whichever worker that is;
* the steer port: the kernel hands a connection to the worker its source port names;
* metrics: each broker's /metrics has every one of its workers', labelled;
* draining a worker moves its partitions to its broker's other worker; SIGHUP reaches every
  worker;
* a broker's handoff (a pod's preStop) moves the leaderships of all its workers.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
from collections.abc import Iterator

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from laminar.client import AsyncClient
from laminar.credentials import dump, new_token, replace_file, token_hash
from laminar.local_cluster import LocalCluster
from laminar.log.batch import Record
from laminar.partition.reconcile import plan_topic
from laminar.placement import Candidate, owner
from laminar.server import steering
from laminar.workers import broker_of, worker_id, worker_ids, worker_index

from .conftest import auth, make_cluster, wait_until

pytestmark = pytest.mark.integration
TOPIC = "work"
PARTITIONS = 6
RECORDS_PER_PARTITION = 40
STEER = 7090


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = make_cluster(
        tmp_path_factory.mktemp("workers"), workers=2, extra_args=("--steer-port", str(STEER))
    )
    yield cluster
    cluster.stop()


def worker_url(cluster: LocalCluster, node: str) -> str:
    """The API of worker `node` (e.g. n2~1)."""
    broker = cluster.nodes[broker_of(node)]
    return broker.worker_urls(cluster.workers)[worker_index(node)]


async def leaders(client: AsyncClient) -> dict[int, tuple[str | None, int | None]]:
    info = await client.describe_topic(TOPIC)
    return {p.partition: (p.leader, p.term) for p in info.partition_states}


async def test_workers_own_their_partitions_and_fail_over_alone(cluster: LocalCluster) -> None:
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        await client.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3)
        await client.wait_for_leaders(TOPIC)

        # the leaders the brokers' rebalance hands leadership to (`reconcile.plan_topic`):
        # the first elections' winners are anyone's, and the rebalance moves them later
        brokers = [Candidate(b, workers=tuple(worker_ids(b, 2))) for b in ("n1", "n2", "n3")]
        preferred = plan_topic(TOPIC, PARTITIONS, 3, brokers).preferred

        async def settled() -> object:  # replicas where placement wants them, none moving
            info = await client.describe_topic(TOPIC)
            wrong = {}
            for p in info.partition_states:
                key = f"{TOPIC}/{p.partition}"
                wanted = {owner(key, worker_ids(b, 2)) for b in ("n1", "n2", "n3")}
                if set(p.replicas) != wanted or p.learners or p.leader != preferred[p.partition]:
                    wrong[p.partition] = (p.replicas, p.learners, p.leader)
            return wrong or True

        await wait_until("every partition on its owning workers, led by its preferred one", settled)
        acked: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
        for partition in range(PARTITIONS):
            values = [f"{partition}-{n}".encode() for n in range(RECORDS_PER_PARTITION)]
            await client.append(TOPIC, partition, [Record(value=v) for v in values])
            acked[partition] += values

        before = await leaders(client)
        victims = {leader for leader, _ in before.values() if leader and "~" in leader}
        assert victims, f"no partition led by a worker other than 0: {before}"
        victim = sorted(victims)[0]
        broker = broker_of(victim)
        pids = cluster.worker_pids(broker)
        os.kill(pids[1], signal.SIGKILL)
        led = {p for p, (leader, _) in before.items() if leader == victim}

        async def failed_over() -> object:
            now = await leaders(client)
            moved = {p for p in led if now[p][0] not in (None, victim)}
            return moved == led or now

        await wait_until(f"{victim}'s partitions to fail over", failed_over)
        after = await leaders(client)
        for partition, (leader, term) in before.items():
            if partition not in led:  # the other workers' partitions did not notice
                assert after[partition] == (leader, term), (partition, before, after)

        async def restarted() -> object:
            pid = cluster.worker_pids(broker).get(1)
            if pid is None or pid == pids[1]:
                return f"worker 1 of {broker}: pid {pid}"
            async with aiohttp.ClientSession() as session:
                url = worker_url(cluster, victim) + "/readyz"
                async with session.get(url) as response:
                    return response.status == 200 or response.status

        await wait_until(f"{victim} to be started again", restarted)
        for partition, values in acked.items():
            read = await client.read(TOPIC, partition, 0, max_records=1000)
            assert [r.value for r in read.records] == values, partition


async def test_a_stale_route_is_redirected_to_the_owning_worker(cluster: LocalCluster) -> None:
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        await client.wait_for_leaders(TOPIC)
        info = await client.describe_topic(TOPIC)
    every_worker = [w for b in cluster.nodes for w in worker_ids(b, cluster.workers)]
    redirected = 0
    for p in info.partition_states:
        assert p.leader is not None
        # a worker that holds no replica of the partition (a replica may serve reads)
        wrong = next(w for w in every_worker if w not in p.replicas)
        url = f"{worker_url(cluster, wrong)}/v1/topics/{TOPIC}/partitions/{p.partition}/records"
        async with (
            aiohttp.ClientSession(headers=auth(cluster)) as session,
            session.get(f"{url}?from=0&max_records=1", allow_redirects=False) as response,
        ):
            assert response.status == 307, await response.text()
            assert response.headers["Location"].startswith(worker_url(cluster, p.leader))
            redirected += 1
        # a client that knows only the wrong worker still appends, through the redirect
        async with AsyncClient([worker_url(cluster, wrong)], token=cluster.token) as stale:
            result = await stale.append(TOPIC, p.partition, [Record(value=b"stale route")])
            assert result.base_index >= RECORDS_PER_PARTITION
    assert redirected == PARTITIONS


async def answered_by(host: str, source_port: int, token: str) -> str:
    """The node that answers GET /v1/cluster on a connection to the steer port from
    `source_port` (its node_id: the worker that accepted the connection)."""
    reader, writer = await asyncio.open_connection(host, STEER, local_addr=(host, source_port))
    try:
        request = f"GET /v1/cluster HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
        writer.write(f"{request}Authorization: Bearer {token}\r\n\r\n".encode())
        answer = await reader.read()
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return str(json.loads(body)["node_id"])


async def test_the_kernel_steers_a_connection_to_the_worker_its_source_port_names(
    cluster: LocalCluster,
) -> None:
    rng = random.Random(23)
    used: set[int] = set()  # (each source port once: no connection meets another's TIME_WAIT)
    for broker, node in cluster.nodes.items():
        for attempt in range(12):
            worker = attempt % cluster.workers
            for _ in range(20):  # (a source port used, or that another socket holds: again)
                port = steering.source_port_for(worker, cluster.workers, rng)
                if port in used:
                    continue
                used.add(port)
                try:
                    got = await answered_by(node.host, port, cluster.token)
                    break
                except OSError:
                    continue
            assert got == worker_id(broker, worker), (port, got)


async def test_worker_0s_metrics_have_every_workers_labelled(cluster: LocalCluster) -> None:
    """Each broker's /metrics (worker 0's port) exports the partitions every one of its
    workers leads, each labelled with that worker, as the topic's state names the leaders."""
    topic = "metered"
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        await client.create_topic(topic, partitions=PARTITIONS, replication_factor=3)

        async def agree() -> object:
            states = (await client.describe_topic(topic)).partition_states
            if not all(s.leader for s in states):
                return "leaderless partitions"
            wanted: set[tuple[str, str, str]] = set()
            for s in states:
                assert s.leader is not None
                wanted.add((broker_of(s.leader), str(s.partition), str(worker_index(s.leader))))
            seen: set[tuple[str, str, str]] = set()
            hosted.clear()
            async with aiohttp.ClientSession() as session:
                for broker, node in cluster.nodes.items():
                    async with session.get(f"{node.api_url}/metrics") as response:
                        text = await response.text()
                    for family in text_string_to_metric_families(text):
                        for sample in family.samples:
                            if sample.name != "laminar_partition_leader":
                                continue
                            if sample.labels["topic"] != topic:
                                continue
                            hosted.add(sample.labels["worker"])
                            if sample.value == 1:
                                partition = sample.labels["partition"]
                                seen.add((broker, partition, sample.labels["worker"]))
            return seen == wanted or (seen, wanted)

        hosted: set[str] = set()  # the workers that host a replica, by the metrics' labels
        await wait_until("worker 0s' metrics name every leader", agree)
        assert hosted == {"0", "1"}  # (placement puts replicas on both: the label tells them apart)


async def test_a_brokers_partitions_are_all_its_workers(cluster: LocalCluster) -> None:
    """GET /v1/nodes/{broker}/partitions (what the operator waits on to be empty before it
    removes a drained broker) lists the replicas of every worker of the broker, asked at any
    broker; the id of a worker above 0 lists that worker's alone (worker 0's id is the
    broker's)."""
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        await client.create_topic("hosted", partitions=PARTITIONS, replication_factor=3)

        async def placed() -> object:
            states = (await client.describe_topic("hosted")).partition_states
            return all(len(s.replicas) == 3 for s in states)

        await wait_until("every partition placed", placed)
        states = (await client.describe_topic("hosted")).partition_states
        for broker in cluster.nodes:
            held = {
                node: {s.partition for s in states if node in s.replicas}
                for node in worker_ids(broker, cluster.workers)
            }
            assert all(held.values()), held  # (both workers hold some: placement spreads them)
            for node, partitions in list(held.items())[1:]:
                answer = await client.node_partitions(node)
                assert {p.partition for p in answer.partitions if p.topic == "hosted"} == partitions
            whole = await client.node_partitions(broker)
            mine = [(p.topic, p.partition) for p in whole.partitions if p.topic == "hosted"]
            assert sorted(mine) == sorted(
                ("hosted", partition) for partitions in held.values() for partition in partitions
            )


async def test_draining_a_broker_empties_every_one_of_its_workers(cluster: LocalCluster) -> None:
    """A drained broker's partitions move off all of its workers, so the operator's check
    (the broker's partitions, above) sees it empty only when none of them hosts any."""
    topic, leaving = "drained", "n3"
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        await client.create_topic(topic, partitions=PARTITIONS, replication_factor=2)

        async def on_workers_of_the_leaving_broker() -> set[str]:
            states = (await client.describe_topic(topic)).partition_states
            return {r for s in states for r in s.replicas if broker_of(r) == leaving}

        async def hosting() -> object:
            return len(await on_workers_of_the_leaving_broker()) > 1

        await wait_until("both workers of n3 host a replica", hosting)
        await client.drain(leaving)
        try:

            async def empty() -> object:
                hosted = (await client.node_partitions(leaving)).partitions
                return not [p for p in hosted if p.topic == topic]

            await wait_until("n3 drained of the topic", empty)
            assert not await on_workers_of_the_leaving_broker()
            states = (await client.describe_topic(topic)).partition_states
            assert all(len(s.replicas) == 2 and s.leader for s in states), states
        finally:
            await client.undrain(leaving)


async def test_draining_a_worker_moves_even_its_only_replicas_to_the_brokers_others(
    cluster: LocalCluster,
) -> None:
    """A drained worker (id `<broker>~<w>`) leaves its broker's owner hash: the partitions it
    owns, replication factor 1 included, move to the broker's other worker with their records
    (what the operator waits for before it lowers workersPerPod); undrained, the worker owns
    its share again."""
    topic = "one-copy"
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        await client.create_topic(topic, partitions=PARTITIONS, replication_factor=1)

        async def replicas() -> dict[int, tuple[str, ...]]:
            states = (await client.describe_topic(topic)).partition_states
            return {s.partition: s.replicas for s in states if s.leader in s.replicas}

        async def owned() -> object:  # each on its broker's owning worker, and led there
            now = await replicas()
            wanted = {
                p: (owner(f"{topic}/{p}", worker_ids(broker_of(r[0]), 2)),)
                for p, r in now.items()
                if len(r) == 1
            }
            return (len(now) == PARTITIONS and now == wanted) or now

        await wait_until("every partition on its owning worker", owned)
        placed = await replicas()
        leaving = next(r[0] for r in placed.values() if worker_index(r[0]) == 1)
        moved = {p for p, r in placed.items() if r == (leaving,)}
        acked: dict[int, list[bytes]] = {}
        for partition in range(PARTITIONS):
            acked[partition] = [f"{topic}-{partition}-{n}".encode() for n in range(20)]
            await client.append(topic, partition, [Record(value=v) for v in acked[partition]])
        await client.drain(leaving)
        try:

            async def emptied() -> object:
                hosted = (await client.node_partitions(leaving)).partitions
                now = await replicas()
                home = (broker_of(leaving),)
                return (not hosted and all(now.get(p) == home for p in moved)) or (hosted, now)

            await wait_until(f"{leaving} drained, its partitions led by its broker", emptied)
            for partition, values in acked.items():
                read = await client.read(topic, partition, 0, max_records=100)
                assert [r.value for r in read.records] == values, partition
        finally:
            await client.undrain(leaving)

        async def back() -> object:
            now = await replicas()
            return all(now.get(p) == (leaving,) for p in moved) or now

        await wait_until(f"{leaving}'s partitions back on it", back)


async def test_sighup_reaches_every_worker_and_stops_none(cluster: LocalCluster) -> None:
    """SIGHUP to a broker's supervisor (re-read the credentials and TLS files, docs/security.md)
    is passed on to each worker: none stops or restarts, and a token added to the credentials
    file is then accepted by every worker."""
    path = cluster.credentials_path()
    principals = yaml.safe_load(path.read_text())["principals"]
    token = new_token()
    added = {"name": "added", "role": "admin", "tokens": [token_hash(token)]}
    replace_file(path, dump([*principals, added]))
    before = {broker: cluster.worker_pids(broker) for broker in cluster.nodes}
    for node in cluster.nodes.values():
        assert node.pid is not None
        os.kill(node.pid, signal.SIGHUP)
    every_worker = [w for b in cluster.nodes for w in worker_ids(b, cluster.workers)]

    async def accepted() -> object:
        refused = []
        async with aiohttp.ClientSession(headers=auth(cluster, token)) as session:
            for worker in every_worker:
                async with session.get(f"{worker_url(cluster, worker)}/v1/topics") as answer:
                    if answer.status != 200:
                        refused.append((worker, answer.status))
        return refused or True

    await wait_until("the added token accepted by every worker", accepted)
    assert all(node.alive() for node in cluster.nodes.values())
    assert {broker: cluster.worker_pids(broker) for broker in cluster.nodes} == before


async def test_a_brokers_handoff_moves_every_workers_leaderships(cluster: LocalCluster) -> None:
    """POST /v1/nodes/{broker}/handoff (the pod's preStop, `laminar node handoff`): worker 0
    asks its other workers over the local feed, so one call moves the leaderships of every
    worker of the broker, and the client never needs the workers' own addresses. (Last in
    this module: the broker is then leaving for the cluster's --leaving-hold-ms.)"""
    topic, broker = "handed", "n2"
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        await client.create_topic(topic, partitions=2 * PARTITIONS, replication_factor=3)
        await client.wait_for_leaders(topic)

        async def led_by_the_broker() -> set[str]:
            states = (await client.describe_topic(topic)).partition_states
            return {s.leader for s in states if s.leader and broker_of(s.leader) == broker}

        async def both_workers_lead() -> object:
            return len(await led_by_the_broker()) == 2

        await wait_until("both workers of n2 lead a partition", both_workers_lead)
        # what cannot move: partitions of the module's other topics with one replica, on n2
        # (after the one-copy test: one on each worker, so both workers' counts are summed)
        stuck = 0
        for other in await client.topics():
            for state in (await client.describe_topic(other.name)).partition_states:
                stuck += [broker_of(r) for r in state.replicas] == [broker]
        assert await client.handoff(broker) == stuck  # (asked at n1: redirected to n2)

        async def none_led_by_the_broker() -> object:  # (as the brokers' status reports it)
            return not await led_by_the_broker()

        await wait_until("no partition led by a worker of n2", none_led_by_the_broker)
