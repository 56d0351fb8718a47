"""The JVM reader plans a batch read as the Python source does, against a real three-broker
cluster: for subscribe, subscribePattern, assign, JSON offsets, timestamps (one per topic, and
one per partition: asked of each partition's leader) and minPartitions, Java's Planner gives
the ranges of Python's `BatchReader(options).partitions()` (none where Python gives its one
empty range), or fails with the same message; each range's replica URLs are Python's
`read_replicas` for the partition, then its leader.

The cluster is left alone meanwhile; its routing (leaders, in-sync sets, members) is taken
before and after each comparison, and a comparison is run again (a few times at most) only if
the routing moved under it, so a failure is never a cluster in motion.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

pytest.importorskip("pyspark", reason="pip install '.[spark]' for the Spark source")

from laminar.client import Client, read_replicas
from laminar.local_cluster import LocalCluster
from laminar.log.batch import Record
from laminar.spark.options import OptionError, Options
from laminar.spark.source import BatchReader, RangePartition

from ...integration.conftest import make_cluster
from .conftest import JavaBuild

BASE_MS = 1_800_000_000_000
#: topic -> records per partition
TOPICS = {"jp-a": (40, 25, 3), "jp-b": (7,), "other": (5, 0), "jp-empty": (0, 0)}
SETTLE_S = 60
ATTEMPTS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three brokers; jp-a's records 1 s apart from BASE_MS (partition p from p * 100 s)."""
    cluster = make_cluster(tmp_path_factory.mktemp("jvm-planning"))
    try:
        with Client(cluster.urls, token=cluster.token) as client:
            for topic, counts in TOPICS.items():
                client.create_topic(topic, partitions=len(counts), replication_factor=3)
                client.wait_for_leaders(topic)
                for p, count in enumerate(counts):
                    if count:
                        client.append(topic, p, [
                            Record(b"%d" % i, timestamp_ms=BASE_MS + p * 100_000 + i * 1000)
                            for i in range(count)])  # fmt: skip
            settle(client)
        yield cluster
    finally:
        cluster.stop()


def settle(client: Client) -> None:
    """Until every partition's records are committed (after its leader's first entry), all
    three replicas are in sync, and two looks in a row agree (bounded in time)."""
    deadline = time.monotonic() + SETTLE_S
    last: object = None
    while time.monotonic() < deadline:
        seen = [
            (topic, s.partition, s.commit_index + 1, len(s.in_sync), s.leader_url)
            for topic in TOPICS
            for s in client.describe_topic(topic).partition_states
        ]
        if seen == last and all(
            end > TOPICS[topic][p] and in_sync == 3 and leader
            for topic, p, end, in_sync, leader in seen
        ):
            return
        last = seen
        time.sleep(0.2)
    raise AssertionError(f"the cluster did not settle: {last}")


def routing(cluster: LocalCluster) -> Any:
    """What replica ranking depends on: every partition's in-sync set and leader, the members."""
    with Client(cluster.urls, token=cluster.token) as client:
        states = {
            topic: [(s.partition, sorted(s.in_sync), s.leader_url)
                    for s in client.describe_topic(topic).partition_states]
            for topic in TOPICS
        }  # fmt: skip
        members = [m.to_json() for m in client.cluster().members]
    return json.dumps([states, members], sort_keys=True)


def python_plan(cluster: LocalCluster, raw: dict[str, str]) -> dict[str, Any]:
    try:
        options = Options.parse(raw, stream=False).with_credentials()
        parts = BatchReader(options).partitions()
    except OptionError as e:
        return {"error": str(e)}
    ranges = [cast(RangePartition, p).range for p in parts]
    if [(r.topic, r.low, r.high) for r in ranges] == [("", 0, 0)]:
        ranges = []  # (Python's one empty range: Java plans none)
    out = []
    with Client(cluster.urls, token=cluster.token) as client:
        members = client.cluster().members
        for r in ranges:
            state = client.describe_topic(r.topic).partition(r.partition)
            assert state is not None
            urls = read_replicas(r.topic, r.partition, state, members)
            leader = (state.leader_url or "").rstrip("/")
            if leader and leader not in urls:
                urls.append(leader)
            out.append([r.topic, r.partition, r.low, r.high, urls])
    return {"result": out}


def cases(cluster: LocalCluster) -> list[dict[str, str]]:
    auth = {"kafka.bootstrap.servers": ",".join(cluster.urls), "token": cluster.token}
    at = BASE_MS + 100_000 + 4_500  # jp-a/1's fifth record is the first at or after it
    made: list[dict[str, str]] = [
        {"subscribe": "jp-a"},
        {"topics": "jp-b, other"},
        {"subscribePattern": "jp-.*"},
        {"subscribePattern": "jp"},  # the whole name must match: nothing
        {"subscribePattern": "(jp-a|oth.r)"},
        {"assign": '{"jp-a": [2, 0], "other": [1, 0]}'},
        {"assign": '{"jp-a": [1, 7]}'},
        {"subscribe": "nope"},
        {"subscribe": "jp-empty"},
        {"subscribe": "jp-a", "startingOffsets": '{"jp-a": {"0": 3, "1": -1}}',
         "endingOffsets": '{"jp-a": {"0": 10, "2": -2}}'},
        {"subscribe": "jp-a", "startingOffsets": "latest"},
        {"assign": '{"jp-a": [1]}', "startingOffsets": '{"jp-a": {"0": 3}}'},
        {"subscribe": "jp-a", "endingOffsets": '{"other": {"0": 3}}'},
        {"subscribe": "jp-a", "startingTimestamp": str(at)},
        {"subscribe": "jp-a", "startingTimestamp": str(BASE_MS + 10_500),
         "startingOffsetsByTimestampStrategy": "latest"},
        {"subscribe": "jp-a", "startingTimestamp": str(BASE_MS + 10_500)},
        {"subscribe": "jp-a", "endingTimestamp": str(at)},
        {"subscribePattern": "jp-.*", "startingOffsetsByTimestamp": json.dumps(
            {"jp-a": {"0": BASE_MS + 5_000, "1": at}}),
         "endingOffsetsByTimestamp": json.dumps({"jp-a": {"0": BASE_MS + 30_000},
                                                 "jp-b": {"0": BASE_MS + 2_000}})},
        {"subscribe": "jp-a", "startingOffsetsByTimestamp": json.dumps(
            {"jp-a": {"2": BASE_MS + 999_000}})},
        {"subscribe": "jp-a", "startingOffsetsByTimestamp": json.dumps({"jp-b": {"0": 1}})},
        {"subscribe": "jp-a,jp-b", "minPartitions": "9"},
        {"subscribePattern": ".*", "minPartitions": "100"},
        {"assign": '{"jp-a": [0]}', "minPartitions": "3", "startingOffsets": '{"jp-a": {"0": 39}}'},
    ]  # fmt: skip
    out = [{**auth, **case} for case in made]
    # the token from a file, resolved on the driver
    out.append({"brokers": ",".join(cluster.urls), "tokenFile": str(cluster.token_file),
                "subscribe": "jp-b"})  # fmt: skip
    return out


def test_java_plans_what_python_plans(
    java_build: JavaBuild, cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests = cases(cluster)
    # no configuration file of this machine's in the way (Python's and Java's resolution)
    env = {**os.environ, "LAMINAR_CONFIG": str(tmp_path / "absent.yaml")}
    monkeypatch.setenv("LAMINAR_CONFIG", env["LAMINAR_CONFIG"])
    for attempt in range(ATTEMPTS):
        before = routing(cluster)
        wants = [python_plan(cluster, r) for r in requests]
        answers = java_build.run("PlanCheck", requests, env=env)
        if routing(cluster) != before and attempt < ATTEMPTS - 1:
            continue  # the cluster moved under the comparison: again
        break
    differ = [
        (request, want, got)
        for request, want, got in zip(requests, wants, answers, strict=True)
        if {k: v for k, v in got.items() if k != "type"} != want
    ]
    assert not differ, f"{len(differ)} of {len(requests)} differ; the first: {differ[:3]}"
    results = [a["result"] for a in answers if "result" in a]
    errors = [a["error"] for a in answers if "error" in a]
    assert [] in results  # nothing to read is no range
    assert any(len(r) >= 9 for r in results)  # minPartitions split
    assert all(len(part[4]) == 3 for r in results for part in r)  # every replica, each once
    assert any("does not exist" in e for e in errors)
    assert any("has no record at or after timestamp" in e for e in errors)
    assert len(errors) >= 4
