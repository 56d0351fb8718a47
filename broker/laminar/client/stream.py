"""The client end of a streaming append (docs/api.md, "Streaming appends"): record batches
over one WebSocket to a partition's leader, each acknowledged in order.

    async with await client.append_stream("orders", 0) as stream:
        pending = [await stream.send([Record(value=b"...")]) for _ in range(1000)]
        results = await asyncio.gather(*pending)   # AppendResult each

`send` returns once the batch is on its way, with a future of its `AppendResult`; it waits
while `max_in_flight` batches are unacknowledged (the stream's backpressure). A stream does not
reconnect: when it ends with an error, the batches not yet acknowledged fail with it. For a
refusal (e.g. `corrupt_batch`, `not_leader`, `overloaded`) they were not written; otherwise
(`timeout`, `outcome_unknown`, a lost connection) the error is `ambiguous`: send them again
with a producer id and sequence, and the broker answers a repeat as a duplicate.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections import deque
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import aiohttp
import orjson

from laminar.log.batch import Record, encode_batch, parse_header

from .errors import LaminarError, Unavailable, error_from_response
from .models import AppendResult

#: One ack (laminar.server.streams): base index, record count, duplicate.
ACK = struct.Struct(">QIB")
#: Errors after which the batches not acknowledged were certainly not written.
REFUSALS = frozenset(
    {
        "bad_request",
        "corrupt_batch",
        "payload_too_large",
        "conflict",
        "not_leader",
        "overloaded",
        "forbidden",
        "unauthorized",
    }
)


class AppendStream:
    """An open streaming append (made by `AsyncClient.append_stream`)."""

    def __init__(
        self,
        ws: aiohttp.ClientWebSocketResponse,
        topic: str,
        partition: int,
        max_in_flight: int,
        *,
        on_ack: Callable[[AppendResult], None] | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight={max_in_flight} must be at least 1")
        self.topic = topic
        self.partition = partition
        self._ws = ws
        self._max_in_flight = max_in_flight
        self._on_ack = on_ack
        self._waiting: deque[asyncio.Future[AppendResult]] = deque()
        self._room = asyncio.Event()
        self._room.set()
        self._error: LaminarError | None = None
        self._receiver = asyncio.create_task(self._receive())

    @property
    def in_flight(self) -> int:
        """Batches sent and not yet acknowledged."""
        return len(self._waiting)

    async def __aenter__(self) -> AppendStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close(flush=exc is None)

    async def send(
        self,
        records: Sequence[Record] | bytes,
        *,
        producer_id: int | None = None,
        sequence: int | None = None,
    ) -> asyncio.Future[AppendResult]:
        """Send one batch (`Record`s, or a batch encoded with `encode_batch`); a future of its
        result once committed. Waits while `max_in_flight` batches are unacknowledged; raises
        the stream's error once it has ended."""
        if isinstance(records, bytes | bytearray | memoryview):
            data = bytes(records)
            parse_header(data)
        else:
            if not records:
                raise ValueError("an append needs at least one record")
            data = encode_batch(records, producer_id=producer_id or 0, producer_seq=sequence or 0)
        while len(self._waiting) >= self._max_in_flight and self._error is None:
            self._room.clear()
            await self._room.wait()
        if self._error is not None:
            raise self._error
        future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        try:
            await self._ws.send_bytes(data)
        except (ConnectionError, aiohttp.ClientError) as e:
            self._fail(Unavailable(0, "connection_lost", f"the stream broke: {e}"), True)
        return future

    async def flush(self) -> None:
        """Wait until every batch sent is acknowledged (raises the stream's error if one
        failed)."""
        if self._waiting:
            await asyncio.gather(*list(self._waiting))
        if self._error is not None:
            raise self._error

    async def close(self, *, flush: bool = True) -> None:
        """Close the stream, after every batch sent is acknowledged if `flush`. Batches still
        unacknowledged then fail (ambiguous: they may be written)."""
        try:
            if flush and self._error is None:
                await self.flush()
        finally:
            await self._ws.close()
            self._receiver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._receiver
            self._fail(
                Unavailable(0, "closed", "the stream was closed before the broker acknowledged"),
                True,
            )

    async def _receive(self) -> None:
        try:
            async for message in self._ws:
                if message.type is aiohttp.WSMsgType.BINARY:
                    self._acknowledge(message.data)
                elif message.type is aiohttp.WSMsgType.TEXT:
                    self._ended(orjson.loads(message.data))
                    return
                else:
                    break
            code = self._ws.close_code
            self._fail(
                Unavailable(0, "connection_lost", f"the broker closed the stream (code {code})"),
                True,
            )
        except (ConnectionError, aiohttp.ClientError, ValueError) as e:
            self._fail(Unavailable(0, "connection_lost", f"the stream broke: {e}"), True)

    def _acknowledge(self, data: bytes) -> None:
        for base, count, duplicate in ACK.iter_unpack(data):
            if not self._waiting:
                raise ValueError("the broker acknowledged a batch that was not sent")
            future = self._waiting.popleft()
            result = AppendResult(base, count, bool(duplicate))
            if self._on_ack is not None:
                self._on_ack(result)
            if not future.done():
                future.set_result(result)
        self._room.set()

    def _ended(self, body: Any) -> None:
        status = body.get("status", 0) if isinstance(body, dict) else 0
        error = error_from_response(status if isinstance(status, int) else 0, body)
        self._fail(error, error.code not in REFUSALS)

    def _fail(self, error: LaminarError, ambiguous: bool) -> None:
        """End the stream with `error`: every batch not acknowledged fails with it."""
        error.ambiguous = ambiguous
        if self._error is None:
            self._error = error
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved: a caller that dropped it leaves no warning
        self._room.set()
