"""Offsets for times (docs/api.md, "Offsets for times"): a partition's log start and end, and
the index of the first record whose timestamp is at or after a time, Kafka's ListOffsets and
`offsetsForTimes`. A consumer seeks with it (`Consumer.seek_to_timestamp`), and a group reset
`--to-timestamp` uses the same lookup at the partition's leader.

The partition's leader answers (others redirect), from its log's time index
(`SegmentedLog.index_at_time`), over the records a reader of the asked isolation may read
(read_committed, the default: below the stable end; read_uncommitted: below the commit). The
topic-wide form asks every partition's leader (`laminar.server.topic_groups.each_partition`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from ..contract import ISOLATIONS
from ..log.errors import CorruptBatchError, LogClosedError
from ..models.checks import ModelError
from ..models.group_admin import PartitionOffsets, TopicOffsets, query_timestamp
from ..partition.errors import ReplicaClosed
from .http import ApiError, damaged, json_response
from .topic_groups import each_partition, first_failure

if TYPE_CHECKING:
    from .api import Api


def _timestamp(request: web.Request) -> int | None:
    text = request.query.get("timestamp_ms")
    if text is None:
        return None
    try:
        return query_timestamp(text)
    except ModelError as e:
        raise ApiError(400, "bad_request", str(e)) from e


def _committed(request: web.Request) -> bool:
    text = request.query.get("isolation", ISOLATIONS[0])
    if text not in ISOLATIONS:
        raise ApiError(
            400, "bad_request", f"isolation={text[:30]!r} must be one of {list(ISOLATIONS)}"
        )
    return text == ISOLATIONS[0]


class OffsetsApi:
    def __init__(self, api: Api) -> None:
        self.api = api

    async def partition(self, request: web.Request) -> web.Response:
        api = self.api
        topic, partition = await api.partition_of(request)
        timestamp = _timestamp(request)
        committed = _committed(request)
        replica = api.broker.core.replica(topic, partition)
        if replica is None:
            raise await api.leader_elsewhere(request, f"{topic}/{partition}")
        if not replica.is_leader:
            raise await api.to_leader(request, replica)
        end = replica.readable_end(committed=committed)
        index = found_ms = None
        if timestamp is not None:
            try:
                found = replica.log.index_at_time(timestamp, end)
            except CorruptBatchError as e:
                raise damaged(replica, e) from e
            except LogClosedError as e:
                raise ReplicaClosed(f"{replica.group} is closed") from e
            if found is not None:
                index, found_ms = found
        answer = PartitionOffsets(
            topic, partition, replica.log_start, end, timestamp, index, found_ms
        )
        return json_response(answer.to_json())

    async def topic(self, request: web.Request) -> web.Response:
        topic = await self.api.topic_of(request.match_info["topic"])
        timestamp = _timestamp(request)
        isolation = ISOLATIONS[0] if _committed(request) else ISOLATIONS[1]
        client = self.api.broker.internal_client()
        pairs = await each_partition(
            range(topic.partitions),
            lambda p: client.partition_offsets(
                topic.name, p, timestamp_ms=timestamp, isolation=isolation
            ),
        )
        first_failure(topic.name, pairs, "looking up offsets")
        found = tuple(r for _, r in pairs if isinstance(r, PartitionOffsets))
        return json_response(TopicOffsets(topic.name, found).to_json())
