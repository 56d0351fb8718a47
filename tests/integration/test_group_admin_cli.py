"""The group admin and offsets-for-times commands of `laminar` (laminar.client.group_commands)
run as real `python3 -m laminar` subprocesses against three broker processes: `queue list`,
`queue reset` (to the earliest, the latest, an index, a time in ms or ISO-8601; refused while
busy unless --force), `queue delete`, `queue describe`'s lag, `topic offsets --timestamp` and
`consume --from-timestamp`, with their errors (one clear line, exit 1) and usage errors
(exit 2)."""

from __future__ import annotations

import asyncio
import datetime
import json
from typing import Any

import pytest

from laminar.client import AsyncClient, Record
from laminar.local_cluster import LocalCluster

from .test_cli import failed, laminar, ok, unique

pytestmark = pytest.mark.integration

T0 = 1_700_000_000_000
STAMPS = [T0 + 10, T0 + 30, T0 + 20, T0 + 40, T0 + 35, T0 + 60]


def iso(ms: int) -> str:
    """`ms` as ISO-8601 with an offset of +02:00 (the CLI must honour the offset)."""
    zone = datetime.timezone(datetime.timedelta(hours=2))
    return datetime.datetime.fromtimestamp(ms / 1000, zone).isoformat(timespec="milliseconds")


def produce_stamped(cluster: LocalCluster, topic: str) -> list[int]:
    """STAMPS as the records of partition 0 of a new topic: their indexes."""

    async def run() -> list[int]:
        async with AsyncClient(cluster.urls, token=cluster.token, timeout_s=20) as client:
            await client.create_topic(topic, partitions=1, replication_factor=3)
            await client.wait_for_leaders(topic)
            records = [Record(b"v%d" % i, timestamp_ms=t) for i, t in enumerate(STAMPS)]
            done = await client.append(topic, 0, records, producer_id=1, sequence=0)
            return list(range(done.base_index, done.base_index + done.count))

    return asyncio.run(run())


def hold_one(cluster: LocalCluster, topic: str, group: str) -> None:
    async def run() -> None:
        async with AsyncClient(cluster.urls, token=cluster.token, timeout_s=20) as client:
            got = await client.acquire(
                topic, 0, group, consumer="holder", max_messages=1, lease_ms=600_000
            )
            assert got.messages

    asyncio.run(run())


def as_json(result: Any) -> Any:
    return json.loads(ok(result))


def test_list_reset_describe_and_delete_a_group(cluster3: LocalCluster) -> None:
    topic, group = unique("groups"), "billing"
    indexes = produce_stamped(cluster3, topic)
    ok(laminar(cluster3, "queue", "consume", topic, group))  # takes and accepts all six
    listed = as_json(laminar(cluster3, "queue", "list", topic, "--json"))
    assert listed["groups"] == [{"group": group, "partitions": [0], "lag": 0}]
    text = ok(laminar(cluster3, "queue", "list", topic)).splitlines()
    assert text[0].split() == ["GROUP", "PARTITIONS", "LAG"] and text[1].split() == [
        group,
        "0",
        "0",
    ]

    reset = as_json(laminar(cluster3, "queue", "reset", topic, group, "--to-earliest", "--json"))
    (partition,) = reset["partitions"]
    assert partition["cursor"] == indexes[0] and partition["previous_cursor"] > indexes[-1]
    described = as_json(laminar(cluster3, "queue", "describe", topic, group, "--json"))
    assert described["partitions"][0]["lag"] == len(indexes)
    table = ok(laminar(cluster3, "queue", "describe", topic, group)).splitlines()
    assert table[1].split()[-1] == "LAG" and table[2].split()[-1] == str(len(indexes))

    # a time with an offset (+02:00): the first record at or after it, whatever the order
    moved = ok(laminar(cluster3, "queue", "reset", topic, group, "--to-timestamp", iso(T0 + 25)))
    assert moved.splitlines()[1].split() == ["PARTITION", "FROM", "TO", "END"]
    assert moved.splitlines()[2].split()[:3] == ["0", str(indexes[0]), str(indexes[1])]
    by_ms = as_json(
        laminar(cluster3, "queue", "reset", topic, group, "--to-timestamp", str(T0 + 36), "--json")
    )
    assert by_ms["partitions"][0]["cursor"] == indexes[3]
    to_index = as_json(
        laminar(cluster3, "queue", "reset", topic, group, "--to-index", str(indexes[4]), "--json")
    )
    assert to_index["partitions"][0]["cursor"] == indexes[4]
    consumed = ok(laminar(cluster3, "queue", "consume", topic, group, "--json"))
    assert [json.loads(line)["index"] for line in consumed.splitlines()] == indexes[4:]

    # busy: refused with one line saying why; --force does it
    ok(laminar(cluster3, "queue", "reset", topic, group, "--to-earliest"))
    hold_one(cluster3, topic, group)
    error = failed(laminar(cluster3, "queue", "reset", topic, group, "--to-latest"))
    assert "busy: 1 message held under a lease" in error and "force" in error
    error = failed(laminar(cluster3, "queue", "delete", topic, group))
    assert "busy" in error
    latest = as_json(
        laminar(cluster3, "queue", "reset", topic, group, "--to-latest", "--force", "--json")
    )
    assert latest["partitions"][0]["cursor"] == latest["partitions"][0]["end_index"]
    assert ok(laminar(cluster3, "queue", "consume", topic, group)) == ""

    assert "deleted consumer group" in ok(laminar(cluster3, "queue", "delete", topic, group))
    assert f"no consumer group {group}" in failed(
        laminar(cluster3, "queue", "delete", topic, group)
    )
    assert ok(laminar(cluster3, "queue", "list", topic)).strip() == (
        f"no consumer groups on topic {topic}"
    )


def test_offsets_for_times_and_consuming_from_a_time(cluster3: LocalCluster) -> None:
    topic = unique("times")
    indexes = produce_stamped(cluster3, topic)
    found = as_json(
        laminar(cluster3, "topic", "offsets", topic, "--timestamp", iso(T0 + 25), "--json")
    )
    (partition,) = found["partitions"]
    assert (partition["index"], partition["record_timestamp_ms"]) == (indexes[1], T0 + 30)
    text = ok(laminar(cluster3, "topic", "offsets", topic, "--timestamp", str(T0 + 61)))
    assert text.splitlines()[1].split() == [
        "PARTITION",
        "LOG",
        "START",
        "END",
        "INDEX",
        "TIMESTAMP",
    ]
    assert text.splitlines()[2].split()[-2:] == ["-", "-"]  # none that late
    plain = as_json(laminar(cluster3, "topic", "offsets", topic, "--json"))
    assert "index" not in plain["partitions"][0]

    records = ok(laminar(cluster3, "consume", topic, "--from-timestamp", str(T0 + 36), "--json"))
    assert [json.loads(line)["index"] for line in records.splitlines()] == indexes[3:]
    late = ok(laminar(cluster3, "consume", topic, "--from-timestamp", iso(T0 + 1_000)))
    assert late == ""  # at the end: nothing


@pytest.mark.parametrize(
    "argv",
    [
        ["queue", "reset", "t", "g"],  # where to?
        ["queue", "reset", "t", "g", "--to-earliest", "--to-latest"],
        ["queue", "reset", "t", "g", "--to-timestamp", "yesterday"],
        ["queue", "reset", "t", "g", "--to-timestamp", "-5"],
        ["queue", "reset", "t", "g", "--to-index", "x"],
        ["topic", "offsets", "t", "--timestamp", "10000-01-01T00:00:00Z"],
        ["consume", "t", "--from", "3", "--from-timestamp", "5"],
        ["queue", "reset", "t", "bad/name", "--to-latest"],
    ],
)
def test_usage_errors_exit_2(cluster3: LocalCluster, argv: list[str]) -> None:
    result = laminar(cluster3, *argv)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
