"""Consumer group admin and offsets for times on a real 3-broker cluster (docs/api.md,
"Consumer group admin" and "Offsets for times"), through the client and the raw HTTP API:
list, describe across partitions, reset to the earliest, the latest, an index or a time
(refused while the group is busy, unless forced), delete; the first record at or after a
time, with producers' timestamps out of order; a reset that survives the kill -9 of the
leader that committed it; the consumer's seek by time; and bad input answered 400."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from laminar.client import AsyncClient, Client, Conflict, Consumer, NotFound, Record
from laminar.local_cluster import LocalCluster

from .conftest import auth, make_cluster, wait_until

pytestmark = pytest.mark.integration

T0 = 1_700_000_000_000
#: the records' timestamps, out of order as producers' clocks may be: index i has STAMPS[i]
STAMPS = [T0 + 10, T0 + 30, T0 + 20, T0 + 40, T0 + 35, T0 + 60, T0 + 50, T0 + 70]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = make_cluster(tmp_path_factory.mktemp("group-admin"))
    yield cluster
    cluster.stop()


def client_of(cluster: LocalCluster, **kwargs: Any) -> AsyncClient:
    return AsyncClient(cluster.urls, token=cluster.token, timeout_s=20, **kwargs)


async def topic_with_records(client: AsyncClient, topic: str, partitions: int = 2) -> list[int]:
    """The topic, with STAMPS as records of partition 0 (in batches of 2, so that time
    lookups cross batches): their indexes."""
    await client.create_topic(topic, partitions=partitions, replication_factor=3)
    await client.wait_for_leaders(topic)
    indexes: list[int] = []
    for first in range(0, len(STAMPS), 2):
        batch = [Record(b"v%d" % i, timestamp_ms=STAMPS[i]) for i in (first, first + 1)]
        done = await client.append(topic, 0, batch, producer_id=first + 1, sequence=0)
        indexes += range(done.base_index, done.base_index + done.count)
    return indexes


async def take_all(client: AsyncClient, topic: str, group: str, consumer: str) -> list[int]:
    """Acquire everything free of the group on partition 0 (until an acquire finds nothing)."""
    taken: list[int] = []
    for _ in range(20):
        got = await client.acquire(topic, 0, group, consumer=consumer, max_messages=100)
        if not got.messages:
            return taken
        taken += [m.index for m in got.messages]
    raise AssertionError(f"the acquires went on: {taken}")


async def finish_all(client: AsyncClient, topic: str, group: str) -> list[int]:
    taken = await take_all(client, topic, group, "worker")
    if taken:
        await client.accept(topic, 0, group, "worker", taken)
    return taken


async def test_list_describe_reset_and_delete_a_group(cluster: LocalCluster) -> None:
    topic, group = "admin-1", "billing"
    async with client_of(cluster) as client:
        indexes = await topic_with_records(client, topic)
        assert await finish_all(client, topic, group) == indexes
        listed = await client.list_groups(topic)
        assert [(g.group, g.partitions, g.lag) for g in listed.groups] == [(group, (0,), 0)]
        described = await client.describe_topic_group(topic, group)
        (p0,) = described.partitions
        assert (p0.partition, p0.lag, p0.accepted, p0.exists) == (0, 0, len(indexes), True)
        with pytest.raises(NotFound):
            await client.describe_topic_group(topic, "nobody")

        # back to the earliest: every record is a new message again (delivery 1)
        reset = await client.reset_group(topic, group, to="earliest")
        by_partition = {r.partition: r for r in reset.partitions}
        assert by_partition[0].cursor == indexes[0] and by_partition[0].previous_cursor
        assert by_partition[0].previous_cursor > indexes[-1]
        assert by_partition[1].previous_cursor is None  # made there by the reset
        assert (await client.describe_topic_group(topic, group)).lag == len(indexes)
        got = await client.acquire(topic, 0, group, consumer="again", max_messages=100)
        assert [(m.index, m.deliveries) for m in got.messages] == [(i, 1) for i in indexes]

        # busy: refused, and nothing changes; forced: the holder loses what it held
        with pytest.raises(Conflict, match="busy: 8 messages held under leases"):
            await client.reset_group(topic, group, index=indexes[4])
        assert (await client.describe_group(topic, 0, group)).acquired == len(indexes)
        forced = await client.reset_group(
            topic, group, index=indexes[4], force=True, partitions=[0]
        )
        assert [(r.partition, r.cursor) for r in forced.partitions] == [(0, indexes[4])]
        late = await client.accept(topic, 0, group, "again", [m.index for m in got.messages])
        assert late.refused == tuple(m.index for m in got.messages)
        assert await take_all(client, topic, group, "w2") == indexes[4:]
        await client.release(topic, 0, group, "w2", indexes[4:])

        # to the latest: nothing left; an index past the end or below the start is moved in
        await client.reset_group(topic, group, to="latest")
        assert await take_all(client, topic, group, "w3") == []
        beyond = await client.reset_group(topic, group, index=10**12, partitions=[0])
        assert beyond.partitions[0].cursor == beyond.partitions[0].end_index
        below = await client.reset_group(topic, group, index=0, partitions=[0])
        assert below.partitions[0].cursor == indexes[0]

        # delete: busy refused, forced done, then gone (404), and gone from the list
        await take_all(client, topic, group, "w4")
        with pytest.raises(Conflict, match="busy"):
            await client.delete_group(topic, group)
        await client.delete_group(topic, group, force=True)
        with pytest.raises(NotFound):
            await client.delete_group(topic, group)
        with pytest.raises(NotFound):
            await client.describe_topic_group(topic, group)
        assert (await client.list_groups(topic)).groups == ()


async def test_a_group_is_reset_to_the_first_record_at_or_after_a_time(
    cluster: LocalCluster,
) -> None:
    topic, group = "admin-time", "late"
    async with client_of(cluster) as client:
        indexes = await topic_with_records(client, topic, partitions=1)
        await finish_all(client, topic, group)
        for wanted in (T0, T0 + 25, T0 + 40, T0 + 41, T0 + 70):
            # Kafka's rule: the first record in log order whose timestamp is >= the time
            first = next(i for i, t in enumerate(STAMPS) if t >= wanted)
            reset = await client.reset_group(topic, group, timestamp_ms=wanted)
            assert reset.partitions[0].cursor == indexes[first], wanted
            assert await finish_all(client, topic, group) == indexes[first:]
        # later than every record: the end (nothing to deliver), as Kafka's --to-datetime
        reset = await client.reset_group(topic, group, timestamp_ms=T0 + 71)
        assert reset.partitions[0].cursor == reset.partitions[0].end_index
        assert await finish_all(client, topic, group) == []


async def test_offsets_for_times(cluster: LocalCluster) -> None:
    topic = "admin-offsets"
    async with client_of(cluster) as client:
        indexes = await topic_with_records(client, topic)
        found = await client.offsets_for_times(topic, T0 + 25)
        assert found == {0: (indexes[1], T0 + 30), 1: None}
        assert (await client.offsets_for_times(topic, T0 + 71))[0] is None
        assert (await client.offsets_for_times(topic, 0))[0] == (indexes[0], T0 + 10)
        one = await client.partition_offsets(topic, 0, timestamp_ms=T0 + 36)
        assert (one.index, one.record_timestamp_ms) == (indexes[3], T0 + 40)
        assert one.end_index > indexes[-1] and one.log_start <= indexes[0]
        plain = await client.partition_offsets(topic, 0)
        assert (plain.timestamp_ms, plain.index) == (None, None)
        everything = await client.topic_offsets(topic)
        assert [p.partition for p in everything.partitions] == [0, 1]


def test_the_blocking_client_has_the_admin_calls(cluster: LocalCluster) -> None:
    """`Client` (blocking) makes every AsyncClient call its own: these too."""
    topic = "admin-blocking"
    with Client(cluster.urls, token=cluster.token, timeout_s=20) as client:
        client.create_topic(topic, partitions=1, replication_factor=3)
        client.wait_for_leaders(topic)
        first = client.append(topic, 0, [Record(b"a", timestamp_ms=T0)]).base_index
        assert client.offsets_for_times(topic, T0) == {0: (first, T0)}
        reset = client.reset_group(topic, "blocking", to="earliest")
        assert reset.partitions[0].cursor == first
        assert [g.group for g in client.list_groups(topic).groups] == ["blocking"]
        client.delete_group(topic, "blocking")


async def test_a_consumer_seeks_by_time(cluster: LocalCluster) -> None:
    topic = "admin-seek"
    async with client_of(cluster) as client:
        indexes = await topic_with_records(client, topic, partitions=1)
        consumer = Consumer(client, topic, start_timestamp_ms=T0 + 45, wait_ms=100)
        async with consumer:
            first = await anext(consumer)
            assert first == (0, first[1]) and first[1].index == indexes[5]
            positions = await consumer.seek_to_timestamp(T0 + 21)
            assert positions == {0: indexes[1]}
            assert (await anext(consumer))[1].index == indexes[1]
            end = (await client.partition_offsets(topic, 0)).end_index
            assert end > indexes[-1]
            assert await consumer.seek_to_timestamp(T0 + 1_000) == {0: end}


async def test_a_group_made_again_after_a_delete_dead_letters_as_a_new_producer(
    cluster: LocalCluster,
) -> None:
    """Dead letters go to `<topic>.dlq` through an idempotent producer whose sequences are
    the group's own: a group deleted and made again starts them again, and must not have its
    dead letters taken for duplicates of its predecessor's (lost)."""
    topic, group = "admin-dlq", "g"
    async with client_of(cluster) as client:
        await client.create_topic(topic, partitions=1, replication_factor=3)
        await client.wait_for_leaders(topic)
        seen: list[bytes | None] = []

        async def dead_letters(count: int) -> bool:
            try:
                read = await client.read(topic + ".dlq", 0, 0)
            except NotFound:
                return False
            seen[:] = [r.value for r in read.records]
            return len(seen) >= count

        for round_, value in enumerate((b"first", b"second")):
            await client.append(topic, 0, [Record(value)], producer_id=round_ + 1, sequence=0)
            got = await client.acquire(topic, 0, group, consumer="c", max_messages=10)
            assert [m.value for m in got.messages] == [value]
            await client.reject(topic, 0, group, "c", [m.index for m in got.messages])
            await wait_until(f"dead letter {value!r}", partial(dead_letters, round_ + 1))

            async def moved() -> bool:
                return (await client.describe_group(topic, 0, group)).dead_letter_pending == 0

            await wait_until("the dead letter confirmed", moved)
            await client.delete_group(topic, group)
        assert seen == [b"first", b"second"]


async def test_a_reset_survives_the_kill_of_the_leader_that_committed_it(
    tmp_path: Path,
) -> None:
    """The reset is a command in the partition's Raft log: every replica applies it, so the
    next leader has the group where the reset put it, and so has the killed one once back."""
    cluster = make_cluster(tmp_path / "failover")
    topic, group = "admin-failover", "g"
    try:
        async with client_of(cluster) as client:
            indexes = await topic_with_records(client, topic, partitions=1)
            await finish_all(client, topic, group)
            await client.reset_group(topic, group, index=indexes[3])
            leader = (await client.describe_topic(topic)).partition(0)
            assert leader is not None and leader.leader is not None
            cluster.kill(leader.leader)
            survivors = [n.api_url for n in cluster.nodes.values() if n.id != leader.leader]
        async with AsyncClient(survivors, token=cluster.token, timeout_s=30) as client:

            async def moved() -> bool:
                state = (await client.describe_topic(topic)).partition(0)
                return state is not None and state.leader not in (None, leader.leader)

            await wait_until("a new leader", moved)
            described = await client.describe_group(topic, 0, group)
            assert described.cursor == indexes[3]
            assert await finish_all(client, topic, group) == indexes[3:]
            cluster.start_node(leader.leader)
            cluster.wait_ready([leader.leader])
    finally:
        cluster.stop()


# ---- bad input -----------------------------------------------------------------------------

BAD_RESETS = [
    ({}, 'give exactly one of "to" (earliest or latest), "index" and "timestamp_ms"'),
    ({"to": "earliest", "index": 3}, 'give exactly one of "to"'),
    ({"to": "first"}, "to must be one of ['earliest', 'latest']"),
    ({"index": -1}, "index must be an integer in [0, 9223372036854775807]"),
    ({"index": True}, "index must be an integer"),
    ({"timestamp_ms": "now"}, "timestamp_ms must be an integer in [0, 253402300799999]"),
    ({"to": "latest", "force": "yes"}, "force must be true or false"),
    ({"to": "latest", "partitions": []}, "partitions must be a non-empty list"),
    ({"to": "latest", "partitions": [0, 0]}, "partitions must be a non-empty list"),
    ({"to": "latest", "when": 1}, "unknown fields ['when']"),
]


@pytest.mark.parametrize(("body", "message"), BAD_RESETS)
async def test_a_bad_reset_is_answered_400_and_changes_nothing(
    cluster: LocalCluster, body: dict[str, Any], message: str
) -> None:
    topic, group = "admin-bad", "g"
    async with client_of(cluster) as client:
        if topic not in {t.name for t in await client.topics()}:
            await topic_with_records(client, topic)
            await client.reset_group(topic, group, index=3)
        before = await client.describe_topic_group(topic, group)
    base = cluster.urls[0]
    async with aiohttp.ClientSession(headers=auth(cluster)) as session:
        for path in (f"/v1/topics/{topic}/groups/{group}/reset",):
            async with session.post(base + path, json=body) as answer:
                assert answer.status == 400, await answer.text()
                error = (await answer.json())["error"]
                assert error["code"] == "bad_request" and message in error["message"]
    async with client_of(cluster) as client:
        assert await client.describe_topic_group(topic, group) == before


async def test_bad_names_parameters_and_partitions_are_answered_clearly(
    cluster: LocalCluster,
) -> None:
    topic = "admin-bad-2"
    async with client_of(cluster) as client:
        await topic_with_records(client, topic)
        state = (await client.describe_topic(topic)).partition(0)
        assert state is not None and state.leader_url is not None
    base = state.leader_url  # (a redirected POST would lose its body)
    partition_reset = f"/v1/topics/{topic}/partitions/0/groups/g/reset"
    cases: list[tuple[str, str, Any, int, str]] = [
        ("POST", partition_reset, {"to": "latest", "partitions": [0]}, 400, "partitions: only"),
        ("POST", f"/v1/topics/{topic}/groups/g/reset", {"to": "latest", "partitions": [5]}, 404,
         "has partitions 0..1"),
        ("POST", f"/v1/topics/{topic}/groups/-bad/reset", {"to": "latest"}, 400, "group name"),
        ("DELETE", f"/v1/topics/{topic}/groups/g?force=maybe", None, 400, "force='maybe'"),
        ("DELETE", f"/v1/topics/{topic}/partitions/0/groups/g?force=1", None, 400, "force='1'"),
        ("GET", f"/v1/topics/{topic}/offsets?timestamp_ms=-1", None, 400, "timestamp_ms must"),
        ("GET", f"/v1/topics/{topic}/partitions/0/offsets?timestamp_ms=x", None, 400,
         "timestamp_ms must"),
        ("GET", f"/v1/topics/{topic}/partitions/0/offsets?isolation=all", None, 400,
         "isolation='all'"),
        ("GET", f"/v1/topics/{topic}/partitions/9/offsets", None, 404, "partitions 0..1"),
        ("GET", "/v1/topics/nope/groups", None, 404, "no topic nope"),
        ("GET", "/v1/topics/nope/offsets", None, 404, "no topic nope"),
        ("POST", partition_reset, [1], 400, "the body must be a JSON object"),
    ]  # fmt: skip
    async with aiohttp.ClientSession(headers=auth(cluster)) as session:
        for method, path, body, status, message in cases:
            kwargs: dict[str, Any] = {"allow_redirects": True}
            if body is not None:
                kwargs["json"] = body
            async with session.request(method, base + path, **kwargs) as answer:
                document = await answer.json()
                assert answer.status == status, (method, path, document)
                assert message in document["error"]["message"], (method, path, document)
