"""docs/metrics.md and a real 3-broker cluster's `/metrics`, held to each other, and the values
operators alert on checked against what the test did.

One module cluster: a workload (appends JSON, binary and streamed, reads JSON and binary, a
shared-queue group that accepts, rejects one to the dead-letter topic and keeps one held, a
redirect, an unknown route) runs once; the tests scrape every broker. The last test kills a
broker (kill -9): the partitions it replicated are under-replicated on their leaders, and a
topic whose only replica it held is offline on the metadata leader.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import platform
import random
import re
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from laminar.contract import BATCH_TYPE, JSON_TYPE
from laminar.local_cluster import LocalCluster
from laminar.log.batch import Record, encode_batch, records_from

from .conftest import WAIT_S, auth, make_cluster, wait_until

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
TOPIC = "metered"
PARTITIONS = 2
GROUP = "billing"
RECORDS_ROUTE = "/v1/topics/{topic}/partitions/{partition}/records"
STREAM_ACK = struct.Struct(">QIB")  # a streamed batch's acknowledgement: base, count, duplicate
#: documented families a cluster exports only under a condition this cluster does not meet
CONDITIONAL = {
    "laminar_tls_certificate_expiry_timestamp_seconds": "only with TLS (test_tls.py has it)",
    "laminar_tls_reloads_total": "only with TLS",
    "laminar_tls_reload_failing": "only with TLS",
    "laminar_xdp_packets_total": "only with the XDP router loaded (root, a real interface)",
    "laminar_xdp_bytes_total": "only with the XDP router loaded",
    "laminar_xdp_drops_total": "only with the XDP router loaded",
}
#: a documented row: | `name` | type | labels | exported by | meaning |
DOC_ROW = re.compile(r"^\| `([a-z_:][a-z0-9_:]*)` \| (counter|gauge|histogram) \|([^|]*)\|")

Families = dict[str, Metric]  # by exposition name (counters with `_total`)


@dataclass
class Workload:
    """What the workload did, as a client saw it."""

    appends: int = 0  # answered 200 (the dead-letter mover's own append included)
    records_in: int = 0
    bytes_in: int = 0  # request bodies of acknowledged appends
    records_out: int = 0
    bytes_out: int = 0  # response bodies of reads answered 200
    reads: int = 0
    accepted: int = 0
    dead_lettered: int = 0
    lag: int = 0  # committed on partition 0, not accepted or dead-lettered
    leaders: dict[int, str] = field(default_factory=dict)  # partition -> its leader's URL
    redirected_by: str = ""  # a broker that answered an append 307
    held_for_ms: int = 600_000  # the held message's lease: longer than the module's tests


@dataclass
class Documented:
    type: str
    labels: set[str]


def documented() -> dict[str, Documented]:
    rows: dict[str, Documented] = {}
    for line in DOC.read_text().splitlines():
        found = DOC_ROW.match(line)
        if found:
            name, kind, labels = found.groups()
            assert name not in rows, f"{name} is documented twice"
            rows[name] = Documented(kind, {x.strip() for x in labels.split(",") if x.strip()})
    return rows


def exposition_name(family: Metric) -> str:
    return family.name + "_total" if family.type == "counter" else family.name


class Http:
    """Calls as the cluster's admin that follow 307 and retry 503/504 (every append here
    carries a producer id and sequence: a repeated one is deduplicated)."""

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session = session
        self.base = base

    async def call(
        self,
        method: str,
        url: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes, str]:
        """(status, body, URL that answered)"""
        start = url
        deadline = time.monotonic() + WAIT_S
        for _ in range(1000):
            async with self.session.request(
                method, url, data=body, headers=headers, allow_redirects=False
            ) as answer:
                status, data = answer.status, await answer.read()
                location = answer.headers.get("Location")
            if status == 307 and location:
                url = location
                continue
            if status in (503, 504) and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                url = start
                continue
            return status, data, url
        raise AssertionError(f"{method} {start}: redirected too often")

    async def json(self, method: str, path: str, document: Any = None) -> Any:
        body = None if document is None else orjson.dumps(document)
        headers = {"Content-Type": JSON_TYPE}
        status, data, _ = await self.call(method, self.base + path, body, headers)
        assert status in (200, 201), (method, path, status, data[:500])
        return orjson.loads(data) if data else None


async def scrape(session: aiohttp.ClientSession, url: str) -> tuple[str, Families]:
    async with session.get(url + "/metrics") as answer:
        assert answer.status == 200
        text = await answer.text()
    families = {exposition_name(f): f for f in text_string_to_metric_families(text)}
    return text, families


async def scrape_all(session: aiohttp.ClientSession, urls: list[str]) -> dict[str, Families]:
    return {url: (await scrape(session, url))[1] for url in urls}


def samples(families: Families, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """The samples of exposition family `name` (its own, not `_bucket` etc.) with `labels`."""
    family = families.get(name)
    if family is None:
        return []
    return [
        (s.labels, s.value)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def total(scrapes: dict[str, Families], name: str, **labels: str) -> float:
    return sum(v for families in scrapes.values() for _, v in samples(families, name, **labels))


async def create_topic(http: Http, name: str, partitions: int, replication: int) -> None:
    document = {"name": name, "partitions": partitions, "replication_factor": replication}
    await http.json("POST", "/v1/topics", document)

    async def led() -> object:
        states = (await http.json("GET", f"/v1/topics/{name}"))["partition_states"]
        ok = all(s["leader"] and len(s["in_sync"]) == replication for s in states)
        return True if ok else states

    await wait_until(f"leaders of {name}, every replica in sync", led)


async def append(
    http: Http, work: Workload, partition: int, values: list[str], binary: bool
) -> None:
    producer = random.getrandbits(62) + 1
    if binary:
        records = [Record(v.encode()) for v in values]
        body = encode_batch(records, producer_id=producer, producer_seq=0)
        content_type = BATCH_TYPE
    else:
        document = {"records": [{"value": v} for v in values], "producer_id": producer}
        body = orjson.dumps({**document, "sequence": 0})
        content_type = JSON_TYPE
    url = f"{http.base}/v1/topics/{TOPIC}/partitions/{partition}/records"
    status, data, _ = await http.call("POST", url, body, {"Content-Type": content_type})
    assert status == 200, (status, data[:500])
    work.appends += 1
    work.records_in += len(values)
    work.bytes_in += len(body)


async def append_streamed(http: Http, work: Workload, partition: int, values: list[str]) -> None:
    """One batch over a streaming append (a WebSocket) at the partition's leader."""
    batch = encode_batch([Record(v.encode()) for v in values])
    path = f"/v1/topics/{TOPIC}/partitions/{partition}/records/stream"
    async with http.session.ws_connect(work.leaders[partition] + path) as ws:
        await ws.send_bytes(batch)
        message = await ws.receive(timeout=WAIT_S)
        assert message.type is aiohttp.WSMsgType.BINARY, message
        _, count, _ = STREAM_ACK.unpack(message.data)
        assert count == len(values)
    work.records_in += len(values)
    work.bytes_in += len(batch)


async def read(http: Http, work: Workload, partition: int, binary: bool) -> None:
    """Read the partition from its start at its leader (every acknowledged record is there)."""
    url = work.leaders[partition] + f"/v1/topics/{TOPIC}/partitions/{partition}/records?from=0"
    headers = {"Accept": BATCH_TYPE if binary else JSON_TYPE}
    status, data, _ = await http.call("GET", url, None, headers)
    assert status == 200, (status, data[:500])
    if binary:
        records, _, _ = records_from(data, 0, 1 << 20)  # (control batches are not records)
        count = len(records)
    else:
        count = len(orjson.loads(data)["records"])
    assert count > 0
    work.reads += 1
    work.records_out += count
    work.bytes_out += len(data)


async def group_call(http: Http, partition: int, action: str, document: Any) -> Any:
    path = f"/v1/topics/{TOPIC}/partitions/{partition}/groups/{GROUP}/{action}"
    return await http.json("POST", path, document)


async def run_workload(cluster: LocalCluster) -> Workload:
    work = Workload()
    async with aiohttp.ClientSession(headers=auth(cluster)) as session:
        http = Http(session, cluster.urls[0])
        await create_topic(http, TOPIC, PARTITIONS, 3)
        states = (await http.json("GET", f"/v1/topics/{TOPIC}"))["partition_states"]
        work.leaders = {s["partition"]: s["leader_url"] for s in states}
        assert set(work.leaders.values()) <= set(cluster.urls)
        await append(http, work, 0, [f"a{i}" for i in range(6)], binary=False)
        await append(http, work, 0, ["b0", "b1"], binary=True)
        await append(http, work, 1, ["c0", "c1", "c2"], binary=False)
        await append(http, work, 1, ["d0"], binary=True)
        await append_streamed(http, work, 1, ["s0", "s1"])
        for partition in range(PARTITIONS):
            await read(http, work, partition, binary=False)
            await read(http, work, partition, binary=True)

        # an append sent to a follower: answered 307 (counted with its route and status);
        # should leadership have moved to it meanwhile, it is counted as an append
        for broker in [u for u in cluster.urls if u != work.leaders[1]] * 3:
            body = orjson.dumps({"records": [{"value": "x"}]})
            url = f"{broker}/v1/topics/{TOPIC}/partitions/1/records"
            headers = {"Content-Type": JSON_TYPE}
            async with session.post(url, data=body, headers=headers, allow_redirects=False) as a:
                assert a.status in (200, 307, 503), a.status
                if a.status == 200:
                    work.appends, work.records_in, work.bytes_in = (
                        work.appends + 1, work.records_in + 1, work.bytes_in + len(body)
                    )  # fmt: skip
                elif a.status == 307:
                    work.redirected_by = broker
                    break
        assert work.redirected_by
        async with session.get(cluster.urls[0] + "/v1/no/such/route") as answer:
            assert answer.status == 404

        # a group takes all 8 of partition 0: accepts 6, rejects 1 (dead-lettered), holds 1
        wanted = {"consumer": "c", "max": 100, "lease_ms": work.held_for_ms}
        answer = await group_call(http, 0, "acquire", wanted)
        indexes = [m["index"] for m in answer["messages"]]
        assert len(indexes) == 8
        await group_call(http, 0, "accept", {"consumer": "c", "indexes": indexes[:6]})
        rejected = {"consumer": "c", "indexes": [indexes[6]], "reason": "poison"}
        await group_call(http, 0, "reject", rejected)
        work.accepted, work.dead_lettered = 6, 1
        # the leader's mover appends the rejected message to the dead-letter topic through the
        # API, on the route the appends above took: wait for the move (the mover proposes its
        # DeadLettered once that append was answered) and count it, or the scrapes below race it
        # (CI89 scraped after it: 6 appends where 5 were counted)
        key = {"topic": TOPIC, "partition": "0", "group": GROUP}

        async def moved() -> object:
            scrapes = await scrape_all(session, cluster.urls)
            done = total(scrapes, "laminar_group_dead_lettered_total", **key)
            waiting = total(scrapes, "laminar_group_dead_letter_pending", **key)
            return (done, waiting) == (1, 0) or f"dead-lettered {done}, waiting {waiting}"

        await wait_until("the rejected message moved to the dead-letter topic", moved)
        work.appends += 1
        # two more records, not acquired yet: the lag is those and the held one
        await append(http, work, 0, ["e0", "e1"], binary=False)
        work.lag = 3
    return work


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = make_cluster(tmp_path_factory.mktemp("metrics"))
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def workload(cluster: LocalCluster) -> Workload:
    return asyncio.run(asyncio.wait_for(run_workload(cluster), 120))


# ---- the documentation ---------------------------------------------------------------------


async def test_every_exported_family_is_documented_and_every_documented_one_exported(
    cluster: LocalCluster, workload: Workload
) -> None:
    docs = documented()
    assert set(CONDITIONAL) <= set(docs), "an exemption names a family the doc does not list"
    async with aiohttp.ClientSession() as session:  # (no token: /metrics is open)
        scrapes = await scrape_all(session, cluster.urls)
    exported: dict[str, str] = {}  # name -> type
    labels: dict[str, set[str]] = {}
    for families in scrapes.values():
        for name, family in families.items():
            # prometheus_client's `_created` companion of a counter or histogram it keeps
            base = name.removesuffix("_created")
            if base != name and (base + "_total" in docs or base in docs):
                assert family.type == "gauge", name
                continue
            exported[name] = family.type
            for sample in family.samples:
                labels.setdefault(name, set()).update(set(sample.labels) - {"le"})
    assert sorted(set(exported) - set(docs)) == [], "exported, not in docs/metrics.md"
    missing = set(docs) - set(exported) - set(CONDITIONAL)
    assert sorted(missing) == [], "in docs/metrics.md, exported by no broker"
    for name, kind in exported.items():
        assert docs[name].type == kind, f"{name} is a {kind}, documented as {docs[name].type}"
        if name in labels:  # (a family with samples somewhere)
            assert labels[name] == docs[name].labels, f"{name}'s labels: {labels[name]}"


# ---- the values ----------------------------------------------------------------------------


async def test_traffic_is_counted_per_topic_and_per_route_template(
    cluster: LocalCluster, workload: Workload
) -> None:
    async with aiohttp.ClientSession() as session:
        scrapes = await scrape_all(session, cluster.urls)
    assert total(scrapes, "laminar_topic_records_in_total", topic=TOPIC) == workload.records_in
    assert total(scrapes, "laminar_topic_bytes_in_total", topic=TOPIC) == workload.bytes_in
    assert total(scrapes, "laminar_topic_records_out_total", topic=TOPIC) == workload.records_out
    assert total(scrapes, "laminar_topic_bytes_out_total", topic=TOPIC) == workload.bytes_out
    assert total(scrapes, "laminar_read_requests_total", topic=TOPIC) == workload.reads
    requests = "laminar_http_requests_total"
    appended = total(scrapes, requests, route=RECORDS_ROUTE, method="POST", status="200")
    assert appended == workload.appends
    read = total(scrapes, requests, route=RECORDS_ROUTE, method="GET", status="200")
    assert read == workload.reads
    redirected = samples(
        scrapes[workload.redirected_by], requests, route=RECORDS_ROUTE, method="POST", status="307"
    )
    assert redirected and redirected[0][1] >= 1
    unmatched = samples(scrapes[cluster.urls[0]], requests, route="unmatched", status="404")
    assert unmatched and unmatched[0][1] >= 1
    routes = {labels["route"] for f in scrapes.values() for labels, _ in samples(f, requests)}
    assert "/metrics" in routes
    raw = [r for r in routes if TOPIC in r or not (r == "unmatched" or r.startswith("/"))]
    assert raw == [], "a raw path as a route label"


def leader_of(scrapes: dict[str, Families], partition: int) -> list[str]:
    """The brokers that say they lead `partition` of TOPIC (one, unless leadership moves)."""
    key = {"topic": TOPIC, "partition": str(partition)}
    return [u for u, f in scrapes.items() if samples(f, "laminar_partition_leader", **key)[0][1]]


async def test_a_leader_reports_its_replicas_in_sync_and_its_groups(
    cluster: LocalCluster, workload: Workload
) -> None:
    names = (
        "laminar_partition_replicas",
        "laminar_partition_in_sync_replicas",
        "laminar_partition_under_replicated",
    )
    async with aiohttp.ClientSession() as session:

        async def replicated() -> object:
            scrapes = await scrape_all(session, cluster.urls)
            for partition in range(PARTITIONS):
                key = {"topic": TOPIC, "partition": str(partition)}
                got = [
                    (url, name, value)
                    for url, families in scrapes.items()
                    for name in names
                    for _, value in samples(families, name, **key)
                ]
                leaders = leader_of(scrapes, partition)
                if len(leaders) != 1:
                    return f"leaders of {partition}: {leaders}"
                expected = [(leaders[0], name, v) for name, v in zip(names, (3, 3, 0), strict=True)]
                if got != expected:
                    return got
            return True

        await wait_until("3 replicas, 3 in sync, on each leader only", replicated)

        key = {"topic": TOPIC, "partition": "0", "group": GROUP}
        group_names = (
            "laminar_group_accepted_total",
            "laminar_group_dead_lettered_total",
            "laminar_group_lag",
            "laminar_group_acquired",
            "laminar_group_dead_letter_pending",
        )
        expected = {
            "laminar_group_accepted_total": [workload.accepted],
            "laminar_group_dead_lettered_total": [workload.dead_lettered],
            "laminar_group_lag": [workload.lag],
            "laminar_group_acquired": [1],
            "laminar_group_dead_letter_pending": [0],
        }

        async def settled() -> object:
            scrapes = await scrape_all(session, cluster.urls)
            leaders = leader_of(scrapes, 0)
            exporting = [u for u, f in scrapes.items() if samples(f, "laminar_group_lag", **key)]
            if len(leaders) != 1 or exporting != leaders:
                return f"leaders {leaders}, exported by {exporting}"
            families = scrapes[leaders[0]]
            got = {name: [v for _, v in samples(families, name, **key)] for name in group_names}
            return True if got == expected else got

        await wait_until("the group's counts on the leader (the dead letter moved)", settled)
        (leader,) = leader_of(await scrape_all(session, cluster.urls), 0)
        text, families = await scrape(session, leader)
    assert "# TYPE laminar_group_accepted_total counter" in text
    assert "# TYPE laminar_group_dead_lettered_total counter" in text
    assert families["laminar_group_lag"].type == "gauge"


async def test_every_broker_reports_its_build_process_and_disk(
    cluster: LocalCluster, workload: Workload
) -> None:
    version = importlib.metadata.version("laminar-mq")
    async with aiohttp.ClientSession() as session:
        scrapes = await scrape_all(session, cluster.urls)
    leaders = []
    for url, families in scrapes.items():
        build = samples(families, "laminar_build_info")
        assert build == [({"version": version, "python": platform.python_version()}, 1.0)], url
        for name in (
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_open_fds",
            "python_info",
            "python_gc_collections_total",
        ):
            assert samples(families, name), f"{url}: no {name}"
        [(_, capacity)] = samples(families, "laminar_data_dir_capacity_bytes")
        [(_, free)] = samples(families, "laminar_data_dir_free_bytes")
        assert 0 < free <= capacity
        [(_, leading)] = samples(families, "laminar_metadata_leader")
        offline = samples(families, "laminar_offline_partitions", topic=TOPIC)
        if leading:
            leaders.append(url)
            assert [v for _, v in offline] == [0.0], url
        else:
            assert "laminar_offline_partitions" not in families, url
    assert len(leaders) == 1


# ---- a broker killed (last: the module's cluster has one broker fewer after it) ------------


async def test_a_killed_broker_leaves_partitions_under_replicated_or_offline(
    cluster: LocalCluster, workload: Workload
) -> None:
    nodes = {node.api_url: node_id for node_id, node in cluster.nodes.items()}
    async with aiohttp.ClientSession(headers=auth(cluster)) as session:
        http = Http(session, cluster.urls[0])
        await create_topic(http, "solo", 3, 1)  # one replica each
        scrapes = await scrape_all(session, cluster.urls)
        meta = next(u for u, f in scrapes.items() if samples(f, "laminar_metadata_leader")[0][1])
        states = (await http.json("GET", "/v1/topics/solo"))["partition_states"]
        hosts = [s["replicas"][0] for s in states]
        # the host of a solo partition; not the metadata leader if it can be (quicker)
        victim = next((h for h in hosts if h != nodes[meta]), hosts[0])
        lost = hosts.count(victim)
        cluster.kill(victim)
        survivors = [u for u in cluster.urls if nodes[u] != victim]

        async def degraded() -> object:
            scrapes = await scrape_all(session, survivors)
            seen = []
            for partition in range(PARTITIONS):
                key = {"topic": TOPIC, "partition": str(partition)}
                rows = [
                    (
                        samples(f, "laminar_partition_replicas", **key)[0][1],
                        samples(f, "laminar_partition_in_sync_replicas", **key)[0][1],
                        samples(f, "laminar_partition_under_replicated", **key)[0][1],
                    )
                    for f in scrapes.values()
                    if samples(f, "laminar_partition_replicas", **key)
                ]
                seen.append(rows)
            return True if seen == [[(3.0, 2.0, 1.0)]] * PARTITIONS else seen

        await wait_until(f"{TOPIC}'s leaders: 2 of 3 in sync without {victim}", degraded)

        async def offline() -> object:
            scrapes = await scrape_all(session, survivors)
            leading = [f for f in scrapes.values() if samples(f, "laminar_metadata_leader")[0][1]]
            if len(leading) != 1:
                return f"{len(leading)} metadata leaders"
            got = {
                topic: [
                    v for _, v in samples(leading[0], "laminar_offline_partitions", topic=topic)
                ]
                for topic in ("solo", TOPIC)
            }
            return True if got == {"solo": [lost], TOPIC: [0.0]} else got

        await wait_until(f"{lost} offline partitions of solo (on {victim})", offline)
