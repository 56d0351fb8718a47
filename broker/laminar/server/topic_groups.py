"""A topic's consumer groups across its partitions (docs/api.md, "Consumer group admin"): list
them, describe one, reset its cursor, delete it.

A group is a group per partition (its state lives in each partition's Raft log), so any
broker serves these by asking each partition's leader in turn, concurrently, through its
internal client (`Broker.internal_client`: it follows the partitions' leaders as any client
does) with the partition endpoints (`laminar.server.groups_api`, `laminar.server.offsets_api`).
The caller was authorized here, for the topic, by the route's rule; the brokers' own
principal asks the leaders. `laminar.server.offsets_api` asks the partitions the same way.

Not atomic across partitions, as Kafka's group admin is one coordinator's: a reset or delete
that fails on some partition answers that partition's error, naming the partitions it was
done on already (repeating it is harmless).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from aiohttp import web

from ..client.errors import LaminarError, NotFound
from ..contract import GROUP_NAME
from ..models import GroupDescription
from ..models.group_admin import (
    GroupSummary,
    ResetGroupRequest,
    TopicGroupDescription,
    TopicGroupReset,
    TopicGroups,
)
from .http import ApiError, json_response, parsed

if TYPE_CHECKING:
    from ..client import AsyncClient
    from .api import Api

T = TypeVar("T")
#: Statuses a partition's error keeps when it answers for the topic (others: 503).
KEPT_STATUSES = frozenset({400, 404, 409, 416, 422, 500, 503, 504})


async def each_partition(
    partitions: Sequence[int], call: Callable[[int], Awaitable[T]]
) -> list[tuple[int, T | LaminarError]]:
    """(partition, `call`'s answer or its error) for every partition, asked all at once."""
    results = await asyncio.gather(*(call(p) for p in partitions), return_exceptions=True)
    out: list[tuple[int, T | LaminarError]] = []
    for partition, result in zip(partitions, results, strict=True):
        if isinstance(result, BaseException) and not isinstance(result, LaminarError):
            raise result
        out.append((partition, result))
    return out


def first_failure(
    topic: str, results: Sequence[tuple[int, object]], doing: str, done: Sequence[int] = ()
) -> None:
    """Raise the error of the first partition that failed, as the topic's (its status when
    the API has it for these operations, else 503), naming the partitions `done` already."""
    for partition, result in results:
        if isinstance(result, LaminarError):
            kept = result.status in KEPT_STATUSES
            status = result.status if kept else 503
            also = f" (done on partitions {list(done)})" if done else ""
            raise ApiError(
                status,
                result.code if kept else "unavailable",
                f"{doing} on {topic}/{partition}: {result.message}{also}",
                headers={"Retry-After": "1"} if status == 503 else None,
            )


class TopicGroupsApi:
    """The topic-wide handlers; `api` does the rest (the topic, authorization, JSON bodies)."""

    def __init__(self, api: Api) -> None:
        self.api = api

    def _client(self) -> AsyncClient:
        return self.api.broker.internal_client()

    async def _partitions(self, request: web.Request) -> tuple[str, int]:
        """The request's topic and its partition count (400 bad name, 404 no topic)."""
        name = request.match_info["topic"]
        topic = await self.api.topic_of(name)
        return topic.name, topic.partitions

    @staticmethod
    def _group(request: web.Request) -> str:
        group = request.match_info["group"]
        if not GROUP_NAME.fullmatch(group):
            raise ApiError(
                400, "bad_request", f"group name {group[:50]!r} must match {GROUP_NAME.pattern}"
            )
        return group

    # ---- handlers --------------------------------------------------------------------------

    async def list(self, request: web.Request) -> web.Response:
        topic, count = await self._partitions(request)
        client = self._client()
        partitions = list(range(count))
        pairs = await each_partition(partitions, lambda p: client.partition_groups(topic, p))
        first_failure(topic, pairs, "listing the consumer groups")
        found: dict[str, list[GroupDescription]] = {}
        for _, listed in pairs:
            assert not isinstance(listed, LaminarError)
            for description in listed.groups:
                found.setdefault(description.group, []).append(description)
        groups = tuple(
            GroupSummary(
                name,
                tuple(d.partition for d in described),
                sum(d.lag or 0 for d in described),
            )
            for name, described in sorted(found.items())
        )
        return json_response(TopicGroups(topic, groups).to_json())

    async def describe(self, request: web.Request) -> web.Response:
        topic, count = await self._partitions(request)
        group = self._group(request)
        client = self._client()
        partitions = list(range(count))
        pairs = await each_partition(partitions, lambda p: client.describe_group(topic, p, group))
        first_failure(topic, pairs, f"describing consumer group {group}")
        described = [d for _, d in pairs if isinstance(d, GroupDescription) and d.exists]
        if not described:
            raise ApiError(
                404, "not_found", f"no consumer group {group} on any partition of {topic}"
            )
        lag = sum(d.lag or 0 for d in described)
        return json_response(TopicGroupDescription(topic, group, lag, tuple(described)).to_json())

    async def reset(self, request: web.Request) -> web.Response:
        topic, count = await self._partitions(request)
        group = self._group(request)
        wanted = parsed(ResetGroupRequest, await self.api.json_body(request))
        partitions = list(range(count)) if wanted.partitions is None else list(wanted.partitions)
        beyond = [p for p in partitions if p >= count]
        if beyond:
            raise ApiError(
                404, "not_found", f"topic {topic} has partitions 0..{count - 1}, not {beyond}"
            )
        one = ResetGroupRequest(wanted.to, wanted.index, wanted.timestamp_ms, wanted.force)
        client = self._client()
        pairs = await each_partition(
            partitions, lambda p: client.reset_partition_group(topic, p, group, one)
        )
        done = [p for p, r in pairs if not isinstance(r, LaminarError)]
        first_failure(topic, pairs, f"resetting consumer group {group}", done)
        resets = tuple(r for _, r in pairs if not isinstance(r, LaminarError))
        return json_response(TopicGroupReset(topic, group, resets).to_json())

    async def delete(self, request: web.Request) -> web.Response:
        topic, count = await self._partitions(request)
        group = self._group(request)
        force = request.query.get("force", "false")
        if force not in ("true", "false"):
            raise ApiError(
                400, "bad_request", f"force={force[:30]!r} must be one of ['true', 'false']"
            )
        client = self._client()
        partitions = list(range(count))

        async def delete(p: int) -> bool:
            try:
                await client.delete_partition_group(topic, p, group, force=force == "true")
            except NotFound:
                return False
            return True

        pairs = await each_partition(partitions, delete)
        done = [p for p, r in pairs if r is True]
        first_failure(topic, pairs, f"deleting consumer group {group}", done)
        if not done:
            raise ApiError(
                404, "not_found", f"no consumer group {group} on any partition of {topic}"
            )
        return web.Response(status=204)
