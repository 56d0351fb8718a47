"""The transaction endpoints of the HTTP API and the coordinator's driver (docs/transactions.md).

`/v1/transactions/{id}`: init (POST), describe (GET), `/partitions` (POST: add partitions),
`/end` (POST: commit or abort), routed here by their `laminar.contract` routes
("txns.<handler>"). Their commands are metadata writes (laminar.txn.coordinator): a broker that
is not the metadata leader redirects them. `.../partitions/{p}/markers` (POST) is the brokers'
own: the partition leader writes a COMMIT or ABORT marker.

`TxnDriver` runs on every broker and acts while it leads the metadata: it writes the markers
of every transaction being ended (PREPARE), then records it complete, and aborts every
transaction left open past its timeout. After a failover the new leader's driver finds the
PREPARE transactions in the metadata and finishes them (transactions before messages, as the
CLFS seed recovers them); a marker written twice changes nothing. What to do is decided by
`laminar.txn.driver` (sans-I/O: the node simulator runs the same decisions); `TxnDriver`
carries it out, over HTTP and asyncio tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..client import LaminarError, NotFound
from ..credentials import Action
from ..log.batch import parse_header
from ..metadata import MetadataError
from ..models import (
    AppendResult,
    TxnDescription,
    TxnEnded,
    TxnEndRequest,
    TxnInitRequest,
    TxnMarkerRequest,
    TxnPartitionsRequest,
    TxnProducerInfo,
)
from ..partition.errors import CommitLost, CommitUnknown, NotLeader, Overloaded
from ..partition.groups import now_ms
from ..raft.raft import Role
from ..txn.coordinator import (
    DEFAULT_EXPIRY_MS,
    DEFAULT_TIMEOUT_MS,
    ENDING,
    TRANSACTIONAL_ID,
    AddTxnPartitions,
    EndTxn,
    InitTxn,
    TxnRecord,
)
from ..txn.driver import Abort, ActionKey, Forget, WriteMarkers, decide
from ..txn.markers import encode_marker
from ..txn.producer import MAX_EPOCH, TxnProducer
from .auth import PRINCIPAL_KEY
from .http import ApiError, json_response, outcome_unknown, parsed, unavailable

if TYPE_CHECKING:
    from .api import Api

log = logging.getLogger(__name__)

#: How often the driver looks at the metadata without being woken (timeouts, failovers).
DRIVE_INTERVAL_S = 0.2
#: How often the driver looks for ids to forget (a scan of every id).
IDLE_CHECK_INTERVAL_S = 10.0
#: Markers of one transaction written at once.
MARKER_CONCURRENCY = 32


class TxnsApi:
    """The handlers, and the driver; `api` does the rest (routing, JSON bodies, proposals)."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.driver = TxnDriver(api)

    # ---- helpers ---------------------------------------------------------------------------

    @staticmethod
    def _txn_id(request: web.Request) -> str:
        txn_id = request.match_info["txn_id"]
        if not TRANSACTIONAL_ID.fullmatch(txn_id):
            raise ApiError(
                400,
                "bad_request",
                f"transactional id {txn_id[:50]!r} must match {TRANSACTIONAL_ID.pattern}",
            )
        return txn_id

    def _record(self, txn_id: str) -> TxnRecord:
        record = self.api.broker.core.state.txns.records.get(txn_id)
        if record is None:
            raise ApiError(404, "not_found", f"no transactional id {txn_id!r}: init it first")
        return record

    @staticmethod
    def _description(record: TxnRecord) -> TxnDescription:
        return TxnDescription(
            record.txn_id,
            record.producer.producer_id,
            record.phase.value,
            record.partitions,
            record.timeout_ms,
            record.expiry_ms,
            record.last_commit,
            record.last_tag,
        )

    # ---- handlers --------------------------------------------------------------------------

    async def init(self, request: web.Request) -> web.Response:
        txn_id = self._txn_id(request)
        wanted = TxnInitRequest()
        if request.body_exists:
            wanted = parsed(TxnInitRequest, await self.api.json_body(request))
        command = InitTxn(
            txn_id,
            DEFAULT_TIMEOUT_MS if wanted.timeout_ms is None else wanted.timeout_ms,
            now_ms(),
            DEFAULT_EXPIRY_MS if wanted.expiry_ms is None else wanted.expiry_ms,
        )
        index = await self.api.propose_metadata(request, command)
        record = self._record(txn_id)
        if record.init_index != index:
            if record.phase in ENDING:
                self.driver.kick()
                raise unavailable(
                    f"{txn_id}: the transaction its last instance left open is being aborted; retry"
                )
            raise ApiError(409, "conflict", f"{txn_id}: a later init of the id took it")
        info = TxnProducerInfo(txn_id, record.producer.producer_id, record.timeout_ms)
        return json_response(info.to_json())

    async def describe(self, request: web.Request) -> web.Response:
        record = self._record(self._txn_id(request))
        return json_response(self._description(record).to_json())

    async def add_partitions(self, request: web.Request) -> web.Response:
        txn_id = self._txn_id(request)
        wanted = parsed(TxnPartitionsRequest, await self.api.json_body(request))
        principal = request[PRINCIPAL_KEY]
        for topic in sorted({topic for topic, _ in wanted.partitions}):
            if not principal.may(Action.PRODUCE, topic):
                raise ApiError(
                    403, "forbidden", f"{principal.describe()} may not append to topic {topic!r}"
                )
        producer = TxnProducer.of(wanted.producer_id)
        command = AddTxnPartitions(txn_id, *producer, wanted.partitions, now_ms())
        await self.api.propose_metadata(request, command)
        return json_response(self._description(self._record(txn_id)).to_json())

    async def end(self, request: web.Request) -> web.Response:
        txn_id = self._txn_id(request)
        wanted = parsed(TxnEndRequest, await self.api.json_body(request))
        principal = request[PRINCIPAL_KEY]
        for other, _ in wanted.also:  # (the route's own id is checked by the route's rule)
            if not principal.may(Action.TRANSACT, other):
                raise ApiError(
                    403, "forbidden", f"{principal.describe()} may not end {other!r}'s transaction"
                )
        producer = TxnProducer.of(wanted.producer_id)
        also = tuple((other, *TxnProducer.of(pid)) for other, pid in wanted.also)
        command = EndTxn(txn_id, *producer, wanted.commit, also, wanted.tag, now_ms())
        await self.api.propose_metadata(request, command)
        self.driver.kick()
        ends = [(t, TxnProducer(n, e)) for t, n, e in command.ends()]
        complete = await self._ended(ends, self.api.timeout_s)
        # the next transaction's: the next epoch, or past the last one a new number (known
        # once complete)
        following = producer._replace(epoch=producer.epoch + 1)
        if following.epoch == MAX_EPOCH:
            following = self._record(txn_id).producer
        ended = TxnEnded(txn_id, wanted.commit, complete, following.producer_id)
        return json_response(ended.to_json())

    async def _ended(self, ends: list[tuple[str, TxnProducer]], timeout_s: float) -> bool:
        """Wait until the transactions of `ends` have ended: their markers written, each id
        moved past its epoch (or forgotten); False if not within `timeout_s`."""
        waits = self.api.broker.waits
        records = self.api.broker.core.state.txns.records
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            if all(
                (record := records.get(txn_id)) is None or record.producer != producer
                for txn_id, producer in ends
            ):
                return True
            remaining = deadline - loop.time()
            if remaining <= 0 or not await waits.meta_advanced.wait(remaining):
                return False

    async def marker(self, request: web.Request) -> web.Response:
        api = self.api
        topic, partition = await api.partition_of(request)
        wanted = parsed(TxnMarkerRequest, await api.json_body(request))
        replica = api.broker.core.replica(topic, partition)
        if replica is None:
            raise await api.leader_elsewhere(request, f"{topic}/{partition}")
        try:
            producer = TxnProducer.of(wanted.producer_id).check()
        except ValueError as e:
            raise ApiError(400, "bad_request", str(e)) from e
        batch = encode_marker(producer, commit=wanted.commit)
        try:
            future, _ = replica.propose(batch, parse_header(batch))
        except NotLeader as e:
            raise api.redirect(request, e.leader, replica.group) from e
        except Overloaded as e:
            raise ApiError(429, "overloaded", str(e), headers={"Retry-After": "1"}) from e
        api.broker.wake()
        try:
            base = await api.commits.wait(future)
        except (TimeoutError, CommitUnknown) as e:
            raise outcome_unknown("timeout", f"the marker may or may not be written: {e}") from e
        except CommitLost as e:
            raise unavailable(f"{e}: the marker was not written; retry") from e
        return json_response(AppendResult(base, 1, False).to_json())


def check_transactional(api: Api, topic: str, partition: int, producer_id: int) -> None:
    """A partition leader takes a transactional batch (or a consumer group's accept in a
    transaction) of `producer_id` only into an ONGOING transaction of its epoch that has this
    partition (its metadata at least as fresh as the client's `Laminar-Metadata-Index`);
    else 409."""
    producer = TxnProducer.of(producer_id)
    txns = api.broker.core.state.txns
    if txns.may_write(producer, topic, partition) is None:
        raise ApiError(
            409,
            "conflict",
            f"producer {producer.number} epoch {producer.epoch} has no open transaction with "
            f"{topic}/{partition}: add the partition first (a fenced or ended epoch may "
            "write no more)",
        )


class TxnDriver:
    """While this broker leads the metadata: markers of ending transactions, and aborts of
    timed out ones."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self._kick = asyncio.Event()
        self._running: dict[ActionKey, asyncio.Task[None]] = {}
        self._idle_checked_s = float("-inf")

    def kick(self) -> None:
        self._kick.set()

    async def run(self) -> None:
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._kick.wait(), DRIVE_INTERVAL_S)
                self._kick.clear()
                try:
                    self._step()
                except Exception:  # the next step tries again
                    log.exception("the transaction driver's step failed")
        finally:
            for task in self._running.values():
                task.cancel()

    def _step(self) -> None:
        core = self.api.broker.core
        meta = core.meta
        if meta is None or meta.closed or meta.raft.role is not Role.LEADER:
            return
        loop_s = asyncio.get_running_loop().time()
        idle = loop_s - self._idle_checked_s >= IDLE_CHECK_INTERVAL_S
        if idle:
            self._idle_checked_s = loop_s
        for action in decide(core.state.txns, now_ms(), self._running, idle=idle):
            if isinstance(action, Abort):
                self._spawn(action.key, self._abort(action))
            elif isinstance(action, Forget):
                self._spawn(action.key, self._forget(action))
            else:
                self._spawn(action.key, self._markers(action))

    def _spawn(self, key: ActionKey, work: Coroutine[Any, Any, None]) -> None:
        if key in self._running:
            work.close()
            return
        task = asyncio.create_task(work)
        self._running[key] = task
        task.add_done_callback(lambda _: self._running.pop(key, None))

    async def _abort(self, action: Abort) -> None:
        record = action.record
        try:
            await self.api.broker.waits.propose_metadata(action.command(), self.api.timeout_s)
            log.info(
                "%s: aborted, open past its timeout of %d ms", record.txn_id, record.timeout_ms
            )
        except (MetadataError, NotLeader, TimeoutError, LaminarError) as e:
            log.warning("%s: aborting after its timeout: %s", record.txn_id, e)
            return
        self.kick()

    async def _forget(self, action: Forget) -> None:
        try:
            await self.api.broker.waits.propose_metadata(action.command(), self.api.timeout_s)
            log.info("forgot %d transactional ids unused past their expiry", len(action.txn_ids))
        except (MetadataError, NotLeader, TimeoutError, LaminarError) as e:
            log.warning("forgetting idle transactional ids: %s", e)

    async def _markers(self, action: WriteMarkers) -> None:
        client = self.api.broker.internal_client()
        commit = action.commit
        producer_id = action.producer.producer_id
        room = asyncio.Semaphore(MARKER_CONCURRENCY)

        async def one(topic: str, partition: int) -> None:
            async with room:
                with contextlib.suppress(NotFound):  # a topic deleted: nothing to end there
                    await client.write_marker(topic, partition, producer_id, commit=commit)

        try:
            await asyncio.gather(*(one(t, p) for t, p in action.partitions))
            await self.api.broker.waits.propose_metadata(action.complete(), self.api.timeout_s)
        except (MetadataError, NotLeader, TimeoutError, LaminarError, OSError) as e:
            log.warning("%s: ending its transaction waits: %s", action.record.txn_id, e)
            await asyncio.sleep(DRIVE_INTERVAL_S)  # (then the next step tries again)
