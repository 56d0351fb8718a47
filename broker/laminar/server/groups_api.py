"""The shared-queue endpoints of the HTTP API (DESIGN §5, docs/api.md "Shared queues").

`/v1/topics/{topic}/partitions/{p}/groups/{group}`: acquire, accept, release, reject, renew
(POST) and describe (GET), routed here by their `laminar.contract` routes ("groups.<handler>").
Only the partition's leader serves them (others redirect); each answers once its queue command
is committed and applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..contract import (
    ACQUIRED_TYPE,
    CONSUMER_ID,
    DEFAULT_ACQUIRE,
    DEFAULT_ACQUIRE_BYTES,
    DEFAULT_LEASE_MS,
    GROUP_NAME,
    MAX_ACQUIRE,
    MAX_ACQUIRE_BYTES,
    MAX_INDEX,
    MAX_LEASE_MS,
    MAX_REASON_CHARS,
    MAX_SETTLE_INDEXES,
    MAX_WAIT_MS,
)
from ..log.batch import single_record_batch
from ..log.errors import CorruptBatchError
from ..partition.errors import CommitLost, CommitUnknown, NotLeader, Overloaded
from ..partition.groups import ConsumerGroups, Delivery, now_ms
from ..partition.replica import Replica
from ..queue import Accept, QueueError, Reject, Release, Renew, Result
from ..queue.state import QueueCommand
from ..queue.wire import Grant, encode_acquired
from .http import (
    ApiError,
    accepts,
    damaged,
    json_response,
    outcome_unknown,
    record_json,
    unavailable,
)

if TYPE_CHECKING:
    from .api import Api

SETTLE_FIELDS = frozenset({"consumer", "indexes"})
COMMAND_MAY_COMMIT = (
    "the command may still be applied: repeating an accept, release, reject or renew is "
    "harmless; a repeated acquire may leave what the first one took held until its lease ends"
)


class GroupsApi:
    """The handlers; `api` does the rest (the partition, redirects, JSON bodies)."""

    def __init__(self, api: Api) -> None:
        self.api = api

    # ---- routing ---------------------------------------------------------------------------

    async def _leader(self, request: web.Request) -> tuple[Replica, ConsumerGroups, str]:
        api = self.api
        topic, partition = await api.partition_of(request)
        group = request.match_info["group"]
        if not GROUP_NAME.fullmatch(group):
            raise ApiError(
                400, "bad_request", f"group name {group[:50]!r} must match {GROUP_NAME.pattern}"
            )
        replica = api.broker.replica(topic, partition)
        if replica is None:
            raise await api.leader_elsewhere(request, f"{topic}/{partition}")
        if not replica.is_leader or replica.groups is None:
            raise api.redirect(request, replica.raft.lead, replica.group)
        return replica, replica.groups, group

    async def _body(self, request: web.Request, allowed: frozenset[str]) -> dict[str, Any]:
        body = await self.api.json_body(request)
        if not isinstance(body, dict):
            raise ApiError(400, "bad_request", "the body must be a JSON object")
        unknown = set(body) - allowed
        if unknown:
            raise ApiError(400, "bad_request", f"unknown fields {sorted(unknown)}")
        return body

    @contextlib.contextmanager
    def _answers(self, request: web.Request, replica: Replica) -> Iterator[None]:
        """The replica's refusals and failures as HTTP errors."""
        try:
            yield
        except NotLeader as e:
            raise self.api.redirect(request, e.leader, replica.group) from e
        except Overloaded as e:
            raise ApiError(429, "overloaded", str(e), headers={"Retry-After": "1"}) from e
        except QueueError as e:
            raise ApiError(400, "bad_request", str(e)) from e
        except TimeoutError as e:
            message = f"not committed within {self.api.timeout_s:g} s; {COMMAND_MAY_COMMIT}"
            raise outcome_unknown("timeout", message) from e
        except CommitUnknown as e:
            raise outcome_unknown("outcome_unknown", f"{e}; {COMMAND_MAY_COMMIT}") from e
        except CommitLost as e:
            raise unavailable(f"{e}: the command was not applied; retry") from e
        except CorruptBatchError as e:
            raise damaged(replica, e) from e

    async def _commit(
        self, request: web.Request, replica: Replica, command: QueueCommand
    ) -> Result:
        groups = replica.groups
        assert groups is not None
        with self._answers(request, replica):
            future = groups.propose(command)
            return await asyncio.wait_for(asyncio.shield(future), self.api.timeout_s)

    # ---- handlers --------------------------------------------------------------------------

    async def acquire(self, request: web.Request) -> web.Response:
        replica, groups, group = await self._leader(request)
        fields = frozenset({"consumer", "max", "lease_ms", "wait_ms", "max_bytes"})
        body = await self._body(request, fields)
        consumer = body.get("consumer")
        if consumer is None:
            consumer = "c-" + secrets.token_hex(8)
        _check_consumer(consumer)
        max_messages = _int(body, "max", DEFAULT_ACQUIRE, 1, MAX_ACQUIRE)
        lease_ms = _int(body, "lease_ms", DEFAULT_LEASE_MS, 1, MAX_LEASE_MS)
        wait_ms = _int(body, "wait_ms", 0, 0, MAX_WAIT_MS)
        max_bytes = _int(body, "max_bytes", DEFAULT_ACQUIRE_BYTES, 1, MAX_ACQUIRE_BYTES)
        task = groups.acquire(group, consumer, max_messages, lease_ms, wait_ms / 1000, max_bytes)
        with self._answers(request, replica):
            deliveries = await asyncio.wait_for(task, wait_ms / 1000 + self.api.timeout_s)
        if accepts(request, ACQUIRED_TYPE):
            answer = encode_deliveries(consumer, deliveries)
            return web.Response(body=answer, content_type=ACQUIRED_TYPE)
        messages = []
        for delivery in deliveries:
            item = record_json(delivery.record)
            item["deliveries"] = delivery.granted.deliveries
            item["lease_deadline_ms"] = delivery.granted.deadline_ms
            messages.append(item)
        return json_response({"consumer": consumer, "messages": messages})

    async def settle(self, request: web.Request) -> web.Response:
        action = request.path.rsplit("/", 1)[1]
        replica, _, group = await self._leader(request)
        allowed = SETTLE_FIELDS | {"reject": {"reason"}, "renew": {"lease_ms"}}.get(action, set())
        body = await self._body(request, frozenset(allowed))
        if "consumer" not in body:
            raise ApiError(400, "bad_request", "consumer is required (the id acquire returned)")
        consumer = body["consumer"]
        _check_consumer(consumer)
        indexes = body.get("indexes")
        if (
            not isinstance(indexes, list)
            or not indexes
            or len(indexes) > MAX_SETTLE_INDEXES
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in indexes)
            or not all(0 <= i <= MAX_INDEX for i in indexes)
        ):
            raise ApiError(
                400,
                "bad_request",
                f"indexes must be a list of 1..{MAX_SETTLE_INDEXES} record indexes",
            )
        command: QueueCommand
        now = now_ms()  # a lease ending at or before this has ended: settling it is refused
        if action == "accept":
            command = Accept(group, consumer, tuple(indexes), now)
        elif action == "release":
            command = Release(group, consumer, tuple(indexes), now)
        elif action == "reject":
            reason = body.get("reason", "rejected")
            if not isinstance(reason, str) or not 1 <= len(reason) <= MAX_REASON_CHARS:
                raise ApiError(
                    400,
                    "bad_request",
                    f"reason must be a string of 1..{MAX_REASON_CHARS} characters",
                )
            command = Reject(group, consumer, tuple(indexes), reason, now)
        else:
            if "lease_ms" not in body:  # (the spec requires it: no default lease on a renew)
                raise ApiError(400, "bad_request", "lease_ms is required (the new lease)")
            lease_ms = _int(body, "lease_ms", DEFAULT_LEASE_MS, 1, MAX_LEASE_MS)
            command = Renew(group, consumer, tuple(indexes), lease_ms, now)
        result = await self._commit(request, replica, command)
        answer: dict[str, Any] = {"done": result.done, "refused": result.refused}
        if isinstance(command, Renew):
            answer["lease_deadline_ms"] = command.now_ms + min(command.lease_ms, MAX_LEASE_MS)
        return json_response(answer)

    async def describe(self, request: web.Request) -> web.Response:
        replica, groups, group = await self._leader(request)
        return json_response(
            {
                "topic": replica.topic,
                "partition": replica.partition,
                "group": group,
                **groups.state.describe(group),
            }
        )


def encode_deliveries(consumer: str, deliveries: list[Delivery]) -> bytes:
    """The binary acquire answer (`laminar.queue.wire`): each stored batch once, as it is,
    when at least half its records are delivered; the others' delivered records alone, each
    as a batch of its own (a sparse redelivery must not ship whole batches)."""
    grants: list[Grant] = []
    per_batch: dict[int, list[Delivery]] = {}
    for delivery in deliveries:
        g = delivery.granted
        grants.append((g.index, g.deliveries, g.deadline_ms))
        per_batch.setdefault(delivery.batch.header.base_index, []).append(delivery)
    batches: list[bytes] = []
    for chosen in per_batch.values():
        batch = chosen[0].batch
        if 2 * len(chosen) >= batch.header.record_count:
            batches.append(batch.data)
        else:
            term = batch.header.term
            batches.extend(single_record_batch(d.record, term) for d in chosen)
    return encode_acquired(consumer, grants, batches)


def _check_consumer(consumer: object) -> None:
    if not isinstance(consumer, str) or not CONSUMER_ID.fullmatch(consumer):
        raise ApiError(400, "bad_request", f"consumer must match {CONSUMER_ID.pattern}")


def _int(body: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = body.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ApiError(400, "bad_request", f"{name} must be an integer in [{low}, {high}]")
    return value
