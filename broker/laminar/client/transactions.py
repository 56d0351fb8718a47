"""Transactions in the client (docs/transactions.md): a transactional producer and its
transactions, made by `AsyncClient.transaction` and `AsyncClient.transactional_producer`.

A transaction adds each partition before its first append to it (once), then appends batches
marked transactional with its producer id and a sequence per partition (so an append sent
again is deduplicated), and ends with a commit or an abort. Appends to one partition run one
at a time, in the order they were called; different partitions in parallel.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING

from laminar.log.batch import Record, encode_batch
from laminar.models import AppendResult, TxnEnded

from .models import Settled

if TYPE_CHECKING:
    from .client import AsyncClient


class TransactionalProducer:
    """A started transactional id: its transactions, one after the other."""

    def __init__(self, client: AsyncClient, txn_id: str, producer_id: int) -> None:
        self.client = client
        self.txn_id = txn_id
        #: what the next transaction's batches carry (each transaction moves the epoch on)
        self.producer_id = producer_id

    def transaction(self) -> Transaction:
        return Transaction(self.client, self.txn_id, producer=self)


class Transaction:
    """One transaction; an async context manager that commits on a clean exit and aborts
    when the block raises."""

    def __init__(
        self,
        client: AsyncClient,
        txn_id: str,
        *,
        timeout_ms: int | None = None,
        producer: TransactionalProducer | None = None,
    ) -> None:
        self.client = client
        self.txn_id = txn_id
        self._timeout_ms = timeout_ms
        self._producer = producer
        self._added: set[tuple[str, int]] = set()
        self._sequences: dict[tuple[str, int], int] = {}
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}
        self.ended: TxnEnded | None = None

    @property
    def producer_id(self) -> int:
        if self._producer is None:
            raise RuntimeError("the transaction has not started: use it in `async with`")
        return self._producer.producer_id

    async def __aenter__(self) -> Transaction:
        if self._producer is None:
            self._producer = await self.client.transactional_producer(
                self.txn_id, timeout_ms=self._timeout_ms
            )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.ended is None:
            await self.end(commit=exc is None)

    async def add_partitions(self, partitions: Sequence[tuple[str, int]]) -> None:
        """Add partitions up front (one request for all; `append` adds the others)."""
        new = [(t, int(p)) for t, p in partitions if (t, int(p)) not in self._added]
        if new:
            await self.client.add_transaction_partitions(self.txn_id, self.producer_id, new)
            self._added.update(new)

    async def append(self, topic: str, partition: int, records: Sequence[Record]) -> AppendResult:
        """Append `records` to the partition as part of the transaction: visible to
        read_committed readers once it commits."""
        if self.ended is not None:
            raise RuntimeError(f"the transaction of {self.txn_id} has ended")
        if not records:
            raise ValueError("an append needs at least one record")
        key = (topic, int(partition))
        async with self._locks.setdefault(key, asyncio.Lock()):
            await self.add_partitions([key])
            sequence = self._sequences.get(key, 0)
            data = encode_batch(
                records, producer_id=self.producer_id, producer_seq=sequence, transactional=True
            )
            result = await self.client.append(topic, partition, data)
            self._sequences[key] = sequence + len(records)
        return result

    async def accept(
        self, topic: str, partition: int, group: str, consumer: str, indexes: Sequence[int]
    ) -> Settled:
        """Accept messages `consumer` holds in `group` as part of the transaction (consume ->
        produce exactly once): they stay held until it ends, then are finished if it
        commits, given back if it aborts."""
        if self.ended is not None:
            raise RuntimeError(f"the transaction of {self.txn_id} has ended")
        await self.add_partitions([(topic, int(partition))])
        return await self.client.accept(
            topic, partition, group, consumer, indexes, txn_producer_id=self.producer_id
        )

    async def commit(self) -> TxnEnded:
        return await self.end(commit=True)

    async def abort(self) -> TxnEnded:
        return await self.end(commit=False)

    async def end(self, *, commit: bool) -> TxnEnded:
        if self.ended is not None:
            raise RuntimeError(f"the transaction of {self.txn_id} has ended")
        ended = await self.client.end_transaction(self.txn_id, self.producer_id, commit=commit)
        self.ended = ended
        assert self._producer is not None
        self._producer.producer_id = ended.producer_id
        return ended
