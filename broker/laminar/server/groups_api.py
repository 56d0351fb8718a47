"""The shared-queue endpoints of the HTTP API (DESIGN §5, docs/api.md "Shared queues" and
"Consumer group admin").

`/v1/topics/{topic}/partitions/{p}/groups/{group}`: acquire, accept, release, reject, renew
(POST) and describe (GET); and the admin of a partition's groups: list them (GET
`.../partitions/{p}/groups`), reset one's cursor (POST `.../reset`), delete one (DELETE),
routed here by their `laminar.contract` routes ("groups.<handler>"). Only the partition's
leader serves them (others redirect); each answers once its queue command is committed and
applied.

A reset moves the cursor to an index, the log start ("earliest"), the end ("latest") or the
first record at or after a time (the log's time index), as Kafka's `kafka-consumer-groups
--reset-offsets` does. It is refused (409) while the group is busy unless forced (the queue
state machine decides, `laminar.queue.state`); a rewind too far back for one command goes
in steps (`laminar.queue.rewind`), and one that other groups overtook while it committed is
planned again: both bounded by MAX_RESET_ROUNDS.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Iterator
from typing import TYPE_CHECKING

from aiohttp import web

from ..contract import (
    ACQUIRED_TYPE,
    DEFAULT_ACQUIRE,
    DEFAULT_ACQUIRE_BYTES,
    DEFAULT_LEASE_MS,
    GROUP_NAME,
    MAX_LEASE_MS,
)
from ..log.batch import single_record_batch
from ..log.errors import CorruptBatchError, LogClosedError
from ..models import (
    DEFAULT_REJECT_REASON,
    AcquiredMessage,
    AcquireRequest,
    AcquireResult,
    GroupDescription,
    RejectRequest,
    RenewRequest,
    Settled,
    SettleRequest,
)
from ..models.group_admin import GroupReset, PartitionGroups, ResetGroupRequest
from ..partition.errors import CommitLost, CommitUnknown, NotLeader, Overloaded
from ..partition.groups import ConsumerGroups, Delivery, now_ms
from ..partition.replica import Replica
from ..queue import Accept, DeleteGroup, QueueError, Reject, Release, Renew, Result
from ..queue.rewind import plan_reset, reset_target
from ..queue.state import QueueCommand
from ..queue.wire import Grant, encode_acquired
from .http import (
    ApiError,
    accepts,
    damaged,
    json_response,
    outcome_unknown,
    parsed,
    unavailable,
)
from .txns_api import check_transactional

if TYPE_CHECKING:
    from .api import Api

#: The request body of each settling action (the last segment of its path).
SETTLE_REQUESTS: dict[str, type[SettleRequest | RejectRequest | RenewRequest]] = {
    "accept": SettleRequest,
    "release": SettleRequest,
    "reject": RejectRequest,
    "renew": RenewRequest,
}
#: The most Reset commands one reset request proposes: the steps of a long rewind
#: (`laminar.queue.rewind`) and the plans made again after other groups moved on.
MAX_RESET_ROUNDS = 64
#: A reset or delete refused because the group is busy: what to do about it.
BUSY_HINT = (
    "stop its consumers (or wait for their leases to end and its dead letters to move), or "
    "force it (force: what is held and the dead letters not yet moved are dropped)"
)
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
        replica = api.broker.core.replica(topic, partition)
        if replica is None:
            raise await api.leader_elsewhere(request, f"{topic}/{partition}")
        if not replica.is_leader or replica.groups is None:
            raise await api.to_leader(request, replica)
        return replica, replica.groups, group

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
        except LogClosedError as e:  # (the replica closed under a reset's lookup of its log)
            raise unavailable(f"{replica.group} is closed; retry") from e

    async def _commit(
        self, request: web.Request, replica: Replica, command: QueueCommand
    ) -> Result:
        groups = replica.groups
        assert groups is not None
        with self._answers(request, replica):
            future = groups.propose(command)
            return await self.api.commits.wait(future)

    # ---- handlers --------------------------------------------------------------------------

    async def acquire(self, request: web.Request) -> web.Response:
        replica, groups, group = await self._leader(request)
        wanted = parsed(AcquireRequest, await self.api.json_body(request))
        consumer = wanted.consumer or "c-" + secrets.token_hex(8)
        max_messages = wanted.max_messages or DEFAULT_ACQUIRE
        lease_ms = wanted.lease_ms or DEFAULT_LEASE_MS
        wait_ms = wanted.wait_ms or 0
        max_bytes = wanted.max_bytes or DEFAULT_ACQUIRE_BYTES
        task = groups.acquire(group, consumer, max_messages, lease_ms, wait_ms / 1000, max_bytes)
        with self._answers(request, replica):
            deliveries = await asyncio.wait_for(task, wait_ms / 1000 + self.api.timeout_s)
        if accepts(request, ACQUIRED_TYPE):
            answer = encode_deliveries(consumer, deliveries)
            return web.Response(body=answer, content_type=ACQUIRED_TYPE)
        messages = tuple(
            AcquiredMessage(d.record, d.granted.deliveries, d.granted.deadline_ms)
            for d in deliveries
        )
        return json_response(AcquireResult(consumer, messages).to_json())

    async def settle(self, request: web.Request) -> web.Response:
        action = request.path.rsplit("/", 1)[1]
        replica, _, group = await self._leader(request)
        wanted = parsed(SETTLE_REQUESTS[action], await self.api.json_body(request))
        consumer, indexes = wanted.consumer, wanted.indexes
        command: QueueCommand
        now = now_ms()  # a lease ending at or before this has ended: settling it is refused
        if isinstance(wanted, RejectRequest):
            reason = wanted.reason or DEFAULT_REJECT_REASON
            command = Reject(group, consumer, indexes, reason, now)
        elif isinstance(wanted, RenewRequest):
            command = Renew(group, consumer, indexes, wanted.lease_ms, now)
        elif action == "accept":
            assert isinstance(wanted, SettleRequest)
            txn = wanted.txn_producer_id or 0
            if txn:  # only into an open transaction that has this partition
                check_transactional(self.api, replica.topic, replica.partition, txn)
            command = Accept(group, consumer, indexes, now, txn)
        else:
            assert isinstance(wanted, SettleRequest)
            if wanted.txn_producer_id is not None:
                raise ApiError(400, "bad_request", "only an accept may be transactional")
            command = Release(group, consumer, indexes, now)
        result = await self._commit(request, replica, command)
        deadline_ms = None
        if isinstance(command, Renew):
            deadline_ms = command.now_ms + min(command.lease_ms, MAX_LEASE_MS)
        settled = Settled(tuple(result.done), tuple(result.refused), deadline_ms)
        return json_response(settled.to_json())

    async def describe(self, request: web.Request) -> web.Response:
        replica, groups, group = await self._leader(request)
        return json_response(described(replica, groups, group).to_json())

    async def list(self, request: web.Request) -> web.Response:
        """Every group on the partition, described."""
        api = self.api
        topic, partition = await api.partition_of(request)
        replica = api.broker.core.replica(topic, partition)
        if replica is None:
            raise await api.leader_elsewhere(request, f"{topic}/{partition}")
        if not replica.is_leader or replica.groups is None:
            raise await api.to_leader(request, replica)
        groups = replica.groups
        listed = PartitionGroups(
            topic,
            partition,
            tuple(described(replica, groups, name) for name in sorted(groups.state.groups)),
        )
        return json_response(listed.to_json())

    async def reset(self, request: web.Request) -> web.Response:
        replica, _, group = await self._leader(request)
        wanted = parsed(ResetGroupRequest, await self.api.json_body(request))
        if wanted.partitions is not None:
            raise ApiError(
                400,
                "bad_request",
                "partitions: only a reset of the group on the whole topic "
                "(POST /v1/topics/{topic}/groups/{group}/reset) names partitions",
            )
        answer = await self._reset(request, replica, group, wanted)
        return json_response(answer.to_json())

    async def _reset(
        self, request: web.Request, replica: Replica, group: str, wanted: ResetGroupRequest
    ) -> GroupReset:
        groups = replica.groups
        assert groups is not None
        previous: int | None = None
        first = True
        for _ in range(MAX_RESET_ROUNDS):
            with self._answers(request, replica):
                wanted_index = self._target(replica, groups, wanted)
                goal = reset_target(groups.state, replica.log, wanted_index)
                command = plan_reset(
                    groups.state, replica.log, group, goal, now_ms(), force=wanted.force
                )
            result = await self._commit(request, replica, command)
            if result.refusal == "moved":
                continue  # other groups moved on meanwhile: plan it again
            if result.refusal is not None:
                raise ApiError(
                    409,
                    "conflict",
                    f"consumer group {group} of {replica.group} is {result.refusal}: {BUSY_HINT}",
                )
            if first:
                previous, first = result.previous_cursor, False
            assert result.cursor is not None
            if command.cursor <= goal:
                end = groups.state.end_index
                return GroupReset(
                    replica.topic, replica.partition, group, previous, result.cursor, end
                )
        raise unavailable(
            f"the reset of consumer group {group} of {replica.group} took "
            f"{MAX_RESET_ROUNDS} commands and is not done (its cursor is "
            f"{groups.state.describe(group)['cursor']}): repeat it to go on"
        )

    @staticmethod
    def _target(replica: Replica, groups: ConsumerGroups, wanted: ResetGroupRequest) -> int:
        """The index the reset asks for, as of now."""
        if wanted.to == "earliest":
            return replica.log.start_index
        if wanted.to == "latest" or (wanted.index is None and wanted.timestamp_ms is None):
            return groups.state.end_index
        if wanted.index is not None:
            return wanted.index
        assert wanted.timestamp_ms is not None
        found = replica.log.index_at_time(wanted.timestamp_ms, groups.state.end_index)
        return groups.state.end_index if found is None else found[0]

    async def delete(self, request: web.Request) -> web.Response:
        replica, _, group = await self._leader(request)
        force = _force(request)
        result = await self._commit(request, replica, DeleteGroup(group, now_ms(), force))
        if result.refusal == "not_found":
            raise ApiError(404, "not_found", f"no consumer group {group} on {replica.group}")
        if result.refusal is not None:
            raise ApiError(
                409,
                "conflict",
                f"consumer group {group} of {replica.group} is {result.refusal}: {BUSY_HINT}",
            )
        return web.Response(status=204)


def described(replica: Replica, groups: ConsumerGroups, group: str) -> GroupDescription:
    """The group on the replica's partition, as its applied state has it."""
    state = groups.state
    counts = state.describe(group)
    return GroupDescription(
        replica.topic,
        replica.partition,
        group,
        cursor=counts["cursor"],
        acquired=counts["acquired"],
        pending=counts["pending"],
        dead_letter_pending=counts["dead_letter_pending"],
        accepted=counts["accepted"],
        dead_lettered=counts["dead_lettered"],
        end_index=state.end_index,
        lag=counts["lag"],
        exists=group in state.groups,
    )


def _force(request: web.Request) -> bool:
    """The `force` query parameter: true or false (the default)."""
    text = request.query.get("force", "false")
    if text not in ("true", "false"):
        raise ApiError(400, "bad_request", f"force={text[:30]!r} must be one of ['true', 'false']")
    return text == "true"


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
