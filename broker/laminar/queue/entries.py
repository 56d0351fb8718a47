"""Queue commands as entries of the partition's own log, and applying committed entries.

A queue command is a control batch (consumers of user data skip it; Raft treats it as a
no-op) holding one record with key `queue` and the encoded command as its value. Every
replica feeds each committed entry, in log order, to `apply_entry`; entries at or below what
its state already holds (after restoring a snapshot taken later than the log's start) are
skipped, so applying is idempotent by index.

The partition's transactions (`QueueState.txns`, laminar.txn.partition) are applied here too:
a transactional record batch is records to the groups, handed out once its transaction has
committed (below the stable end); a transaction marker (laminar.txn.markers) ends one, and
the records of one that aborted, or of a fenced epoch, are dropped.
"""

from __future__ import annotations

import logging

from ..log.batch import Record, decode_batch, encode_batch, parse_header
from ..txn.markers import decode_marker
from ..txn.producer import TxnProducer
from .state import (
    QueueCommand,
    QueueError,
    QueueState,
    Result,
    decode_command,
    encode_command,
)

log = logging.getLogger(__name__)

QUEUE_KEY = b"queue"


def encode_entry(command: QueueCommand) -> bytes:
    record = Record(key=QUEUE_KEY, value=encode_command(command), timestamp_ms=0)
    return encode_batch([record], now_ms=0, control=True)


def decode_entry(batch: bytes | memoryview) -> QueueCommand | None:
    """The queue command in a control batch, or None for any other control batch."""
    (record,) = decode_batch(batch)
    if record.key != QUEUE_KEY or record.value is None:
        return None
    return decode_command(record.value)


def apply_entry(
    state: QueueState,
    index: int,
    count: int,
    batch: bytes | memoryview | None,
    txn_producer_id: int = 0,
) -> tuple[QueueCommand, Result] | None:
    """Apply the committed entry [index, index + count). `batch` may be None for a record
    batch (only control batches are decoded); `txn_producer_id` is a transactional record
    batch's producer id (0: not transactional). Returns the queue command and its result."""
    if index < state.end_index:
        return None
    txns = state.txns
    if batch is None or not (header := parse_header(batch)).is_control:
        if txn_producer_id:
            txns.on_batch(index, count, TxnProducer.of(txn_producer_id))
        else:
            txns.on_other(index, count)
        state.on_records(index, count)
        _drop_aborted(state)
        return None
    state.on_other(index, count)
    marker = decode_marker(batch, header.producer_id) if header.producer_id else None
    if marker is not None:
        state.on_txn_marker(index, TxnProducer.of(header.producer_id), commit=marker)
        _drop_aborted(state)
        return None
    txns.on_other(index, count)
    try:
        command = decode_entry(batch)
        if command is None:
            return None
        return command, state.apply(command)
    except QueueError:
        # never proposed by a correct leader; every replica skips it alike
        log.error("queue command at %d is malformed: skipped", index)
        return None


def _drop_aborted(state: QueueState) -> None:
    for base, end in state.txns.take_aborted():
        state.drop_records(base, end)
