"""Streaming appends: many batches over one WebSocket, acknowledged in order (docs/api.md,
"Streaming appends").

`GET /v1/topics/{topic}/partitions/{partition}/records/stream` upgrades to a WebSocket at the
partition's leader (elsewhere: the same 307 to the leader as an append). The client sends
binary messages, each one record batch exactly as a binary append's body; the broker proposes
each as it arrives, with no HTTP request per batch, and answers with binary messages of acks:
`ACK_BYTES` each (`>QIB`: base index, record count, 1 if a duplicate of a batch the producer
sent before), one per batch, in the order the batches came. A message of acks covers every
batch committed since the last one, so under load one send answers many batches.

The first batch that cannot be taken ends the stream: the broker sends one text message,
`{"status": <the HTTP status an append would get>, "acked": <batches acknowledged before>,
"error": {...}}` (the API's error body), then closes. For a refusal (corrupt_batch,
payload_too_large, conflict, not_leader, overloaded, forbidden) nothing from that batch on
was written; for `timeout`, `outcome_unknown` and `unavailable` the batches not acknowledged
may or may not be (retry them with a producer id: the retries are answered as duplicates).

Bounded: at most `MAX_IN_FLIGHT` batches await their commit per stream (the broker stops
reading until acks go out), the partition's pending bytes as for appends (waited for up to
the request timeout, then `overloaded`), each message at most the topic's batch size limit;
the principal is authorized again every `REAUTHORIZE_S` (a revoked token ends the stream), and
pings find a dead client within `HEARTBEAT_S` twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson
from aiohttp import WSMsgType, web

from ..partition.errors import (
    CommitLost,
    CommitUnknown,
    NotLeader,
    Overloaded,
    ReplicaClosed,
    SequenceConflict,
)
from .http import ApiError, internal, outcome_unknown, unavailable
from .txns_api import check_transactional

if TYPE_CHECKING:
    from ..partition.replica import Replica
    from .api import Api

#: One ack: base index (u64), record count (u32), duplicate (u8).
ACK = struct.Struct(">QIB")
ACK_BYTES = ACK.size
#: Batches of one stream that may await their commit at once.
MAX_IN_FLIGHT = 4096
#: How often a stream's principal is authorized again (credentials may change under it).
REAUTHORIZE_S = 1.0
#: WebSocket pings: a client that answers none in twice this long is gone.
HEARTBEAT_S = 15.0

log = logging.getLogger(__name__)


MAY_BE_WRITTEN = (
    "the batches not acknowledged may or may not be written: send them again with a producer "
    "id and sequence (retries are answered as duplicates)"
)


@dataclass(slots=True)
class _Sent:
    future: asyncio.Future[int]
    records: int
    duplicate: bool
    started: float
    size_bytes: int  # the message's (laminar_topic_bytes_in_total)


async def serve_stream(
    api: Api, request: web.Request, replica: Replica, authorize: Callable[[], object]
) -> web.WebSocketResponse:
    """Serve one streaming append on `replica` (its leader, checked by the caller) until the
    client closes it or an error ends it. The upgrade request was authorized; `authorize`
    checks its principal again (raises ApiError)."""
    ws = web.WebSocketResponse(
        max_msg_size=replica.log.config.batch_limit_bytes, heartbeat=HEARTBEAT_S
    )
    if not ws.can_prepare(request).ok:
        raise ApiError(
            426,
            "upgrade_required",
            "a streaming append is a WebSocket: send Connection: Upgrade and Upgrade: websocket",
            headers={"Upgrade": "websocket"},
        )
    await ws.prepare(request)
    await _Stream(api, request, ws, replica, authorize).run()
    return ws


class _Stream:
    def __init__(
        self,
        api: Api,
        request: web.Request,
        ws: web.WebSocketResponse,
        replica: Replica,
        authorize: Callable[[], object],
    ) -> None:
        self.api = api
        self.request = request
        self.ws = ws
        self.replica = replica
        self.authorize = authorize
        self.sent: deque[_Sent] = deque()  # proposed, not yet acknowledged, in order
        self.acked = 0  # batches acknowledged so far
        self.proposed = asyncio.Event()  # set when `sent` gains a batch
        self.room = asyncio.Event()  # set while fewer than MAX_IN_FLIGHT are in `sent`
        self.room.set()
        self.reading = True

    async def run(self) -> None:
        reader = asyncio.create_task(self._read())
        acker = asyncio.create_task(self._ack())
        ended: ApiError | None = None
        try:
            await asyncio.wait((reader, acker), return_when=asyncio.FIRST_COMPLETED)
            if acker.done():  # a commit failed: read no more
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
                ended = acker.result()
            else:  # the client closed, or a batch was refused: ack what was taken first
                ended = reader.result()
                self.reading = False
                self.proposed.set()
                ended = await acker or ended
        except ConnectionError:
            ended = None  # the client is gone
        except Exception:
            log.exception("a streaming append on %s failed", self.replica.group)
            ended = internal()
        finally:
            for task in (reader, acker):
                task.cancel()
        if ended is not None and not self.ws.closed:
            with contextlib.suppress(ConnectionError):
                body = {"status": ended.status, "acked": self.acked, **ended.body()}
                await self.ws.send_str(orjson.dumps(body).decode())
            self.api.metrics.request_errors.labels(str(ended.status), ended.code).inc()
        with contextlib.suppress(ConnectionError):
            await self.ws.close()

    # ---- reading batches -------------------------------------------------------------------

    async def _read(self) -> ApiError | None:
        """Propose each batch as it arrives; the error that ends the stream (None: the client
        closed it)."""
        authorized_at = time.monotonic()
        limit = self.replica.log.config.batch_limit_bytes
        async for message in self.ws:
            if message.type is WSMsgType.ERROR:
                return None  # aiohttp closed the stream (a message over the size limit: 1009)
            if message.type is not WSMsgType.BINARY:
                return ApiError(400, "bad_request", "send record batches as binary messages")
            now = time.monotonic()
            if now - authorized_at >= REAUTHORIZE_S:
                try:
                    self.authorize()
                except ApiError as e:
                    return e
                authorized_at = now
            batch = message.data
            try:
                header, digest = await self.api.checked_batch(batch, limit)
            except ApiError as e:
                return e
            if header.is_transactional:
                try:
                    check_transactional(
                        self.api, self.replica.topic, self.replica.partition, header.producer_id
                    )
                except ApiError as e:
                    return e
            if (refused := await self._wait_for_room(len(batch))) is not None:
                return refused
            started = time.perf_counter()
            try:
                future, duplicate = self.replica.propose(batch, header, digest)
            except NotLeader as e:
                return self.api.redirect(self.request, e.leader, self.replica.group)
            except SequenceConflict as e:
                return ApiError(409, "conflict", str(e))
            except Overloaded as e:
                return ApiError(429, "overloaded", str(e))
            except ReplicaClosed as e:
                return unavailable(f"{e}; send again what was not acknowledged")
            self.sent.append(_Sent(future, header.record_count, duplicate, started, len(batch)))
            self.api.broker.wake()
            self.proposed.set()
            if len(self.sent) >= MAX_IN_FLIGHT:
                self.room.clear()
                await self.room.wait()
        return None

    async def _wait_for_room(self, size_bytes: int) -> ApiError | None:
        """Wait while the partition's pending bytes leave no room for `size_bytes` more (the
        bound appends have), up to the request timeout; then `overloaded`."""
        replica = self.replica
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.api.timeout_s
        while replica.pending_bytes + size_bytes > replica.max_pending_bytes:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return ApiError(
                    429,
                    "overloaded",
                    f"{replica.group}: {replica.pending_bytes} bytes still await their commit "
                    f"after {self.api.timeout_s:g} s",
                )
            await replica.wait_for(replica.commit_index + 1, remaining)
        return None

    # ---- acknowledging ---------------------------------------------------------------------

    async def _ack(self) -> ApiError | None:
        """Send the acks of committed batches, in order, many to a message; return once the
        reading ended and all are sent (None), or with the error of a failed commit."""
        timeout_s = self.api.timeout_s
        metrics = self.api.metrics
        while True:
            if not self.sent:
                if not self.reading:
                    return None
                self.proposed.clear()
                await self.proposed.wait()
                continue
            oldest = self.sent[0]
            if not oldest.future.done():
                remaining = oldest.started + timeout_s - time.perf_counter()
                await asyncio.wait((oldest.future,), timeout=max(remaining, 0))
                if not oldest.future.done():
                    return outcome_unknown(
                        "timeout", f"not committed within {timeout_s:g} s; {MAY_BE_WRITTEN}"
                    )
            acks = []
            records = 0
            size_bytes = 0
            now = time.perf_counter()
            failed: ApiError | None = None
            while self.sent and self.sent[0].future.done():
                sent = self.sent.popleft()
                error = sent.future.exception()
                if error is not None:
                    failed = _commit_error(error)
                    break
                acks.append(ACK.pack(sent.future.result(), sent.records, sent.duplicate))
                records += sent.records
                size_bytes += sent.size_bytes
                metrics.append_latency.observe(now - sent.started)
            if acks:
                self.acked += len(acks)
                metrics.appended(self.replica.topic, records, size_bytes)
                await self.ws.send_bytes(b"".join(acks))
            if failed is not None:
                return failed
            if len(self.sent) < MAX_IN_FLIGHT:
                self.room.set()


def _commit_error(error: BaseException) -> ApiError:
    """The stream's error for a batch whose commit failed."""
    if isinstance(error, CommitUnknown):
        return outcome_unknown("outcome_unknown", f"{error}; {MAY_BE_WRITTEN}")
    if isinstance(error, CommitLost | ReplicaClosed):
        return unavailable(f"{error}; {MAY_BE_WRITTEN}")
    log.error("a streamed append failed unexpectedly", exc_info=error)
    return internal()
