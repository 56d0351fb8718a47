"""The coordinator's driver, decisions only (docs/transactions.md): sans-I/O.

While a broker leads the metadata, its driver ends what the coordinator left to it: every
transaction left ONGOING past its timeout is aborted (`Abort`: propose its `EndTxn`), and every
PREPARE transaction gets its marker written into each of its partitions, then is recorded
complete (`WriteMarkers`: the `marker` batch to each partition leader, then its
`CompleteTxn`); now and then the ids unused past their expiry are forgotten (`Forget`: propose
its `ForgetIdleTxns`). After a failover the new leader's driver finds the PREPARE
transactions in the metadata and finishes them; a marker written twice changes nothing.

`decide` reads only the coordinator's state, the leader's clock and which actions are under
way (their `key`s): the broker's server (`laminar.server.txns_api.TxnDriver`, over HTTP and
asyncio tasks) and the node simulator (`laminar.sim.txn_workload`, through the partition
leaders' `Replica.propose`) carry out the same decisions.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

from .coordinator import (
    CompleteTxn,
    Coordinator,
    EndTxn,
    ForgetIdleTxns,
    Phase,
    TopicPartition,
    TxnRecord,
)
from .markers import encode_marker
from .producer import TxnProducer

#: An action's identity: (kind, transactional id, producer number, epoch).
ActionKey = tuple[str, str, int, int]


@dataclass(frozen=True, slots=True)
class Abort:
    """Abort the ONGOING transaction of `record`, open past its timeout at `now_ms`."""

    record: TxnRecord
    now_ms: int = 0

    @property
    def key(self) -> ActionKey:
        return ("abort", self.record.txn_id, *self.record.producer)

    def command(self) -> EndTxn:
        return EndTxn(self.record.txn_id, *self.record.producer, False, now_ms=self.now_ms)


@dataclass(frozen=True, slots=True)
class WriteMarkers:
    """End the PREPARE transaction of `record`: its marker into each of its partitions, then
    (every marker committed) its `complete` command."""

    record: TxnRecord

    @property
    def key(self) -> ActionKey:
        return ("markers", self.record.txn_id, *self.record.producer)

    @property
    def commit(self) -> bool:
        return self.record.phase is Phase.PREPARE_COMMIT

    @property
    def producer(self) -> TxnProducer:
        """The producer (number, epoch + 1) the markers carry."""
        return self.record.marker_producer

    @property
    def partitions(self) -> tuple[TopicPartition, ...]:
        return self.record.partitions

    def marker(self) -> bytes:
        """The marker batch, the same for every partition."""
        return encode_marker(self.producer, commit=self.commit)

    def complete(self) -> CompleteTxn:
        return CompleteTxn(self.record.txn_id, *self.record.producer)


@dataclass(frozen=True, slots=True)
class Forget:
    """Forget `txn_ids`, idle at `now_ms` (propose its `ForgetIdleTxns`)."""

    txn_ids: tuple[str, ...]
    now_ms: int

    @property
    def key(self) -> ActionKey:
        return ("forget", "", 0, 0)  # (one at a time)

    def command(self) -> ForgetIdleTxns:
        return ForgetIdleTxns(self.txn_ids, self.now_ms)


Action = Abort | WriteMarkers | Forget


def decide(
    txns: Coordinator, now_ms: int, running: Container[ActionKey] = (), *, idle: bool = False
) -> list[Action]:
    """What the metadata leader's driver starts now, at `now_ms` by its clock: the aborts of
    timed out transactions, then the markers of ending ones, by transactional id, and with
    `idle` (a scan of every id: now and then) the forgetting of idle ids; none whose key is
    in `running` (under way already)."""
    actions: list[Action] = [Abort(record, now_ms) for record in txns.expired(now_ms)]
    actions += [WriteMarkers(record) for record in txns.ending()]
    if idle and (forgotten := txns.idle(now_ms)):
        actions.append(Forget(forgotten, now_ms))
    return [action for action in actions if action.key not in running]
